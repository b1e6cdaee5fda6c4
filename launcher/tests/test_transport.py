"""The transport choice (cluster.transport, the rdma, shm and coalesce sections) as
environment variables of every job process, under every back-end, and what
the launcher shows when the transport falls back or fails (against
fake_cluster.py, which honours the variables as the real transport factory
does on a machine without an RDMA device)."""

import io
import json
import os
import subprocess
import sys

import yaml

from conftest import LAUNCHER_DIR
from tessera_launch.config import load_config
from tessera_launch.kubernetes import manifests
from tessera_launch.local import (Binaries, LocalOptions, RunLayout, load_job, process_env, run_local,
                                  transport_env)
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

EXPECTED = {
    "TESSERA_TRANSPORT": "auto", "TESSERA_RDMA_REQUIRED": "0", "TESSERA_RDMA_POOL_BYTES": "1048576",
    "TESSERA_RDMA_MAX_PINNED_BYTES": "4194304", "TESSERA_SHM": "1", "TESSERA_SHM_MIN_FRAME_BYTES": "4096",
    "TESSERA_SHM_RING_BYTES": "2097152", "TESSERA_SHM_CROSS_MEMORY": "1",
    "TESSERA_SHM_MIN_LEND_BYTES": "2097152", "TESSERA_COALESCE": "1",
    "TESSERA_COALESCE_MAX_MESSAGE_BYTES": "16384", "TESSERA_COALESCE_MAX_BATCH_BYTES": "65536",
    "TESSERA_COALESCE_MAX_DELAY_US": "1000",
}

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


def test_transport_env_values(tmp_path):
    path = job_file(tmp_path)
    assert transport_env(load_config(path)) == EXPECTED
    for transport, wire in (("tcp", "zmq"), ("ipc", "zmq"), ("zmq", "zmq"), ("rdma", "rdma")):
        assert transport_env(load_config(path, [f"cluster.transport={transport}"]))["TESSERA_TRANSPORT"] == wire
    changed = transport_env(load_config(path, ["cluster.transport=rdma", "rdma.required=true", "shm.enabled=false"]))
    assert (changed["TESSERA_RDMA_REQUIRED"], changed["TESSERA_SHM"]) == ("1", "0")
    assert transport_env(load_config(path, ["shm.cross_memory=false"]))["TESSERA_SHM_CROSS_MEMORY"] == "0"
    defaults = transport_env(load_config(path, ["cluster.transport=tcp", "rdma.pool_bytes=67108864",
                                                "rdma.max_pinned_bytes=1073741824"]))
    assert defaults["TESSERA_RDMA_MAX_PINNED_BYTES"] == "1073741824" and defaults["TESSERA_TRANSPORT"] == "zmq"


def test_coalesce_section_as_variables(tmp_path):
    # Defaults (JOB has no coalesce section): what the transport factory assumes unset.
    env = transport_env(load_config(job_file(tmp_path)))
    assert {k: v for k, v in env.items() if k.startswith("TESSERA_COALESCE")} == {
        "TESSERA_COALESCE": "1", "TESSERA_COALESCE_MAX_MESSAGE_BYTES": "16384",
        "TESSERA_COALESCE_MAX_BATCH_BYTES": "65536", "TESSERA_COALESCE_MAX_DELAY_US": "1000"}
    # All four set in the file; the rest of the environment is unchanged.
    env = transport_env(load_config(job_file(tmp_path, JOB + COALESCE)))
    assert env == {**EXPECTED, "TESSERA_COALESCE": "0", "TESSERA_COALESCE_MAX_MESSAGE_BYTES": "4096",
                   "TESSERA_COALESCE_MAX_BATCH_BYTES": "32768", "TESSERA_COALESCE_MAX_DELAY_US": "250"}
    # And by --set.
    env = transport_env(load_config(job_file(tmp_path, JOB + COALESCE),
                                    ["coalesce.enabled=true", "coalesce.max_delay_us=5000"]))
    assert (env["TESSERA_COALESCE"], env["TESSERA_COALESCE_MAX_DELAY_US"]) == ("1", "5000")


def test_process_env_carries_the_transport_with_the_rest(tmp_path):
    config = load_config(job_file(tmp_path))
    env = process_env(config, RunLayout(tmp_path / "run"), Binaries.locate(tmp_path / "build", "w"))
    assert {k: env[k] for k in EXPECTED} == EXPECTED
    assert "PYTHONPATH" in env and "TESSERA_JOB_KEYS" not in env  # security.curve: false


def test_rdma_and_auto_bind_tcp_endpoints(tmp_path):
    from tessera_launch.local import bind_address
    layout = RunLayout(tmp_path / "run")
    for transport in ("tcp", "zmq", "rdma", "auto"):
        config = load_config(job_file(tmp_path), [f"cluster.transport={transport}"])
        assert bind_address(config, layout, "server-0") == "tcp://127.0.0.1:0"
    config = load_config(job_file(tmp_path), ["cluster.transport=ipc"])
    assert bind_address(config, layout, "server-0").startswith("ipc://")


# -- every back-end passes the variables on ------------------------------------------


def test_local_job_falls_back_and_every_process_gets_the_variables(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_SHOW_TRANSPORT_ENV", "1")
    run_dir = tmp_path / "run"
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build), run_dir=str(run_dir),
                                  stream=terminal))
    assert code == 0, terminal.getvalue()
    assert "workers over auto (RDMA where usable, else ZeroMQ over tcp) (local)" in terminal.getvalue()
    shown = " ".join(f"{k}={v}" for k, v in EXPECTED.items())
    for name in PROCESSES:
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert f"transport env {shown}" in log, log
        notices = [line for line in log.splitlines() if all(part in line for part in NOTICE)]
        assert len(notices) == 1, log
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rdma"]["pool_bytes"] == 1048576


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


def test_ssh_processes_get_the_variables(tmp_path, fake_build):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=3 addr=10.0.0.1\nnode2 slots=3 addr=10.0.0.2\n")
    job = load_job(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build)))
    backend = SshBackend(str(hostfile))
    for name, argv in backend.plan(job):
        remote = argv[-1]
        for key, value in EXPECTED.items():
            assert f"--env {key}={value}" in remote, (name, remote)


def test_ssh_processes_get_the_coalesce_settings(tmp_path, fake_build):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=3 addr=10.0.0.1\nnode2 slots=3 addr=10.0.0.2\n")
    job = load_job(LocalOptions(config=str(job_file(tmp_path, JOB + COALESCE)), build_dir=str(fake_build)))
    for name, argv in SshBackend(str(hostfile)).plan(job):
        assert ("--env TESSERA_COALESCE=0 --env TESSERA_COALESCE_MAX_MESSAGE_BYTES=4096 "
                "--env TESSERA_COALESCE_MAX_BATCH_BYTES=32768 --env TESSERA_COALESCE_MAX_DELAY_US=250") in argv[-1], \
            (name, argv[-1])


def test_ranks_started_by_mpirun_or_srun_get_the_variables(tmp_path, fake_build):
    """`tessera-launch role --rank-from ...` (what mpirun and srun start)
    builds the environment from the run directory's config.yaml."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(job_file(tmp_path), ["timeouts.assemble_seconds=1"])
    (run_dir / "config.yaml").write_text(config.to_yaml())
    env = {**os.environ, "FAKE_SHOW_TRANSPORT_ENV": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "5"}
    proc = subprocess.run([sys.executable, str(LAUNCH), "role", "--rank-from", "mpi", "--run-dir", str(run_dir),
                           "--build-dir", str(fake_build)], capture_output=True, text=True, timeout=30, env=env)
    shown = " ".join(f"{k}={v}" for k, v in EXPECTED.items())
    assert f"[coordinator] INFO coordinator transport env {shown}" in proc.stdout, proc.stdout + proc.stderr
    assert "falling back to ZeroMQ" in proc.stdout


def test_kubernetes_pods_get_the_variables(tmp_path):
    config = load_config(job_file(tmp_path))
    pods = [d["spec"]["template"]["spec"]["containers"][0] for d in manifests(config)
            if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    assert len(pods) == 3
    for container in pods:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env.get(k) for k in EXPECTED} == EXPECTED
        assert "--bind" in container["args"]


def test_dry_run_shows_the_variables(tmp_path, fake_build):
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file(tmp_path)), build_dir=str(fake_build), dry_run=True,
                                  overrides=["shm.enabled=false"], stream=terminal))
    assert code == 0
    assert ("environment of every process: TESSERA_TRANSPORT=auto TESSERA_RDMA_REQUIRED=0 "
            "TESSERA_RDMA_POOL_BYTES=1048576 TESSERA_RDMA_MAX_PINNED_BYTES=4194304 TESSERA_SHM=0 "
            "TESSERA_SHM_MIN_FRAME_BYTES=4096 TESSERA_SHM_RING_BYTES=2097152 TESSERA_SHM_CROSS_MEMORY=1 "
            "TESSERA_SHM_MIN_LEND_BYTES=2097152 TESSERA_COALESCE=1 TESSERA_COALESCE_MAX_MESSAGE_BYTES=16384 "
            "TESSERA_COALESCE_MAX_BATCH_BYTES=65536 TESSERA_COALESCE_MAX_DELAY_US=1000") in terminal.getvalue()
