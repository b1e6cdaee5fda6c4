"""The transport choice (cluster.transport, the rdma, shm and coalesce sections) as
flags of every job process, under every back-end (never environment
variables), and what the launcher shows when the transport falls back or
fails (against fake_cluster.py, which takes the flags as the real binaries
do and honours them as the real transport factory does on a machine
without an RDMA device)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import LAUNCHER_DIR
from tessera_launch.config import load_config
from tessera_launch.kubernetes import manifests
from tessera_launch.local import (Binaries, LocalOptions, RunLayout, load_job, process_argv, process_env,
                                  run_local, transport_flags)
from tessera_launch.ssh import SshBackend

LAUNCH = LAUNCHER_DIR / "tessera-launch"
PROCESSES = ["coordinator", "server-0", "server-1", "worker-0", "worker-1"]
NOTICE = ("RDMA unavailable", "falling back to ZeroMQ")

JOB = """\
job:
  name: transport-job
cluster:
  servers: 2
  workers: 2
  vshards: 8
  transport: auto
timeouts:
  assemble_seconds: 5
rdma:
  pool_bytes: 1048576
  max_pinned_bytes: 4194304
shm:
  min_frame_bytes: 4096
  ring_bytes: 2097152
security:
  curve: false
worker:
  program: fake-worker
"""

#: JOB's transport flags: only the settings that are not the binaries' defaults.
EXPECTED = ["--transport", "auto", "--rdma_pool_bytes", "1048576", "--rdma_max_pinned_bytes", "4194304",
            "--shm_min_frame_bytes", "4096", "--shm_ring_bytes", "2097152"]
#: How fake_cluster.py logs the flags it got: every flag, given or default.
SHOWN = ("--transport=auto --rdma_required=0 --rdma_pool_bytes=1048576 --rdma_max_pinned_bytes=4194304 --shm=1 "
         "--shm_min_frame_bytes=4096 --shm_ring_bytes=2097152 --shm_cross_memory=1 --shm_min_lend_bytes=2097152 "
         "--coalesce=1 --coalesce_max_message_bytes=16384 --coalesce_max_batch_bytes=65536 "
         "--coalesce_max_delay_us=1000")

COALESCE = """\
coalesce:
  enabled: false
  max_message_bytes: 4096
  max_batch_bytes: 32768
  max_delay_us: 250
"""


def job_file(tmp_path, text=JOB):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def flags_of(config, layout=None, host_id=None):
    return transport_flags(config, layout or RunLayout(Path("/run")), host_id)


def test_transport_flag_values(tmp_path):
    path = job_file(tmp_path)
    assert flags_of(load_config(path)) == EXPECTED
    for transport, wire in (("tcp", None), ("ipc", None), ("zmq", None), ("rdma", "rdma")):
        flags = flags_of(load_config(path, [f"cluster.transport={transport}"]))
        assert (flags[1] if flags[0] == "--transport" else None) == wire, flags
    changed = flags_of(load_config(path, ["cluster.transport=rdma", "rdma.required=true", "shm.enabled=false"]))
    pairs = dict(zip(changed[::2], changed[1::2]))
    assert (pairs["--transport"], pairs["--rdma_required"], pairs["--shm"]) == ("rdma", "1", "0"), changed
    assert dict(zip(*[iter(flags_of(load_config(path, ["shm.cross_memory=false"])))] * 2))["--shm_cross_memory"] == "0"
    # Every setting at its default: no flag at all.
    defaults = flags_of(load_config(path, ["cluster.transport=tcp", "rdma.pool_bytes=67108864",
                                           "rdma.max_pinned_bytes=1073741824", "shm.min_frame_bytes=65536",
                                           "shm.ring_bytes=67108864"]))
    assert defaults == []


def test_job_keys_faults_and_host_id_are_flags_too(tmp_path):
    path = job_file(tmp_path)
    layout = RunLayout(tmp_path / "run")
    keyed = load_config(path, ["security.curve=true", "cluster.transport=tcp", "message_faults.spec=seed=3,drop=0.01"])
    flags = flags_of(keyed, layout, host_id="node7")
    assert flags[-6:] == ["--job_keys", str(tmp_path / "run" / "job.keys"), "--faults", "seed=3,drop=0.01",
                          "--host_id", "node7"], flags
    assert "--job_keys" not in flags_of(load_config(path), layout)  # security.curve: false


def test_coalesce_section_as_flags(tmp_path):
    # Defaults (JOB has no coalesce section): no coalesce flag.
    assert not [f for f in flags_of(load_config(job_file(tmp_path))) if f.startswith("--coalesce")]
    # All four set in the file; the other flags are unchanged.
    flags = flags_of(load_config(job_file(tmp_path, JOB + COALESCE)))
    assert flags == EXPECTED + ["--coalesce", "0", "--coalesce_max_message_bytes", "4096",
                                "--coalesce_max_batch_bytes", "32768", "--coalesce_max_delay_us", "250"]
    # And by --set.
    flags = flags_of(load_config(job_file(tmp_path, JOB + COALESCE),
                                 ["coalesce.enabled=true", "coalesce.max_delay_us=5000"]))
    assert "--coalesce" not in flags and flags[-2:] == ["--coalesce_max_delay_us", "5000"]


def test_the_environment_carries_no_setting(tmp_path):
    config = load_config(job_file(tmp_path), ["security.curve=true", "message_faults.spec=seed=1,drop=0.1"])
    env = process_env(config, RunLayout(tmp_path / "run"), Binaries.locate(tmp_path / "build", "w"))
    assert list(env) == ["PYTHONPATH"], env


def test_every_process_of_every_role_gets_the_flags(tmp_path):
    config = load_config(job_file(tmp_path))
    layout = RunLayout(tmp_path / "run")
    binaries = Binaries.locate(tmp_path / "build", "w")
    for name in ("coordinator", "coordinator-1", "server-1", "worker-0"):
        argv = process_argv(config, binaries, layout, name, "tcp://h:1", False, host_id="n1")
        assert argv[-len(EXPECTED) - 2:] == EXPECTED + ["--host_id", "n1"], (name, argv)


def test_rdma_and_auto_bind_tcp_endpoints(tmp_path):
    from tessera_launch.local import bind_address
    layout = RunLayout(tmp_path / "run")
    for transport in ("tcp", "zmq", "rdma", "auto"):
        config = load_config(job_file(tmp_path), [f"cluster.transport={transport}"])
        assert bind_address(config, layout, "server-0") == "tcp://127.0.0.1:0"
    config = load_config(job_file(tmp_path), ["cluster.transport=ipc"])
    assert bind_address(config, layout, "server-0").startswith("ipc://")


# -- every back-end passes the flags on ------------------------------------------


def test_local_job_falls_back_and_every_process_gets_the_flags(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_SHOW_TRANSPORT_ENV", "1")
    for variable in ("TESSERA_TRANSPORT", "TESSERA_SHM", "TESSERA_SHM_RING_BYTES", "TESSERA_COALESCE"):
        monkeypatch.delenv(variable, raising=False)
    run_dir = tmp_path / "run"
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build), run_dir=str(run_dir),
                                  stream=terminal))
    assert code == 0, terminal.getvalue()
    assert "workers over auto (RDMA where usable, else ZeroMQ over tcp) (local)" in terminal.getvalue()
    for name in PROCESSES:
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert f"transport flags {SHOWN}" in log, log
        notices = [line for line in log.splitlines() if all(part in line for part in NOTICE)]
        assert len(notices) == 1, log
        assert "no longer read" not in log, log
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rdma"]["pool_bytes"] == 1048576


def test_a_process_warns_about_an_old_variable_in_its_environment(tmp_path, fake_build, monkeypatch):
    """The real binaries log one warning per old variable
    (transport/transport_flags.h); fake_cluster.py does the same, and the
    setting still comes from the flags."""
    monkeypatch.setenv("FAKE_SHOW_TRANSPORT_ENV", "1")
    monkeypatch.setenv("TESSERA_SHM_RING_BYTES", "1048576")
    run_dir = tmp_path / "run"
    code = run_local(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build), run_dir=str(run_dir),
                                  stream=io.StringIO()))
    assert code == 0
    log = (run_dir / "logs" / "server-0.log").read_text()
    assert "TESSERA_SHM_RING_BYTES is set but no longer read: the flag --shm_ring_bytes replaces it" in log, log
    assert "--shm_ring_bytes=2097152" in log, log


def test_required_rdma_without_a_device_fails_the_job_naming_why(tmp_path, fake_build):
    run_dir = tmp_path / "run"
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build), run_dir=str(run_dir),
                                  overrides=["cluster.transport=rdma", "rdma.required=true"], stream=terminal,
                                  quiet=True))
    assert code == 1
    assert "RDMA is required" in terminal.getvalue()  # the failed process's last lines
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["first_failure"] == "coordinator"


def test_ssh_processes_get_the_flags_and_their_host_id(tmp_path, fake_build):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=3 addr=10.0.0.1\nnode2 slots=3 addr=10.0.0.2\n")
    job = load_job(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build)))
    backend = SshBackend(str(hostfile))
    for name, argv in backend.plan(job):
        remote = argv[-1]
        host = backend.placement[name].name
        assert " ".join(EXPECTED + ["--host_id", host]) in remote, (name, remote)
        assert "--env TESSERA_" not in remote, (name, remote)


def test_ssh_processes_get_the_coalesce_settings(tmp_path, fake_build):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=3 addr=10.0.0.1\nnode2 slots=3 addr=10.0.0.2\n")
    job = load_job(LocalOptions(config=str(job_file(tmp_path, JOB + COALESCE)), build_dir=str(fake_build)))
    for name, argv in SshBackend(str(hostfile)).plan(job):
        assert ("--coalesce 0 --coalesce_max_message_bytes 4096 --coalesce_max_batch_bytes 32768 "
                "--coalesce_max_delay_us 250") in argv[-1], (name, argv[-1])


def test_ranks_started_by_mpirun_or_srun_get_the_flags(tmp_path, fake_build):
    """`tessera-launch role --rank-from ...` (what mpirun and srun start)
    builds the command line from the run directory's config.yaml."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(job_file(tmp_path), ["timeouts.assemble_seconds=1"])
    (run_dir / "config.yaml").write_text(config.to_yaml())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env.update({"FAKE_SHOW_TRANSPORT_ENV": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "5"})
    proc = subprocess.run([sys.executable, str(LAUNCH), "role", "--rank-from", "mpi", "--run-dir", str(run_dir),
                           "--build-dir", str(fake_build)], capture_output=True, text=True, timeout=30, env=env)
    assert f"[coordinator] INFO coordinator transport flags {SHOWN}" in proc.stdout, proc.stdout + proc.stderr
    assert "falling back to ZeroMQ" in proc.stdout


def test_kubernetes_pods_get_the_flags(tmp_path):
    config = load_config(job_file(tmp_path), ["security.curve=true"])
    pods = [d["spec"]["template"]["spec"]["containers"][0] for d in manifests(config)
            if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    assert len(pods) == 3
    for container in pods:
        args = container["args"] if "args" in container else container["command"]
        joined = " ".join(args)
        assert " ".join(EXPECTED) in joined, joined
        assert "--job_keys /etc/tessera-keys/job.keys" in joined, joined
        assert not [e["name"] for e in container["env"] if e["name"].startswith(("TESSERA_SHM", "TESSERA_TRANSPORT",
                                                                                  "TESSERA_COALESCE", "TESSERA_RDMA",
                                                                                  "TESSERA_JOB_KEYS", "TESSERA_FAULTS"))]
        assert "--bind" in args


def test_dry_run_shows_the_flags_in_every_command_line(tmp_path, fake_build):
    """What a server started by the launcher runs with comes from its
    command line alone: the plan shows it, and the environment carries no
    setting (test_the_environment_carries_no_setting)."""
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file(tmp_path, JOB + COALESCE)), build_dir=str(fake_build),
                                  dry_run=True, overrides=["shm.enabled=false"], stream=terminal))
    assert code == 0
    out = terminal.getvalue()
    expected = ("--transport auto --rdma_pool_bytes 1048576 --rdma_max_pinned_bytes 4194304 --shm 0 "
                "--shm_min_frame_bytes 4096 --shm_ring_bytes 2097152 --coalesce 0 --coalesce_max_message_bytes 4096 "
                "--coalesce_max_batch_bytes 32768 --coalesce_max_delay_us 250")
    assert f"transport flags of every process (also in the command lines below): {expected}" in out, out
    lines = [line for line in out.splitlines() if line.split(":")[0].strip() in PROCESSES]
    assert len(lines) == len(PROCESSES), out
    for line in lines:
        assert expected in line, line
