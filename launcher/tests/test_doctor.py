"""`tessera-launch doctor` against fake_probe.py: a stand-in probe that
reports what each test asks for (no RDMA, usable RDMA, a low memlock limit,
a wrong port, garbage, a failure), and stand-ins for ssh, srun and mpirun
that run it once per host on this machine."""

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import LAUNCHER_DIR
from tessera_launch.cli import main
from tessera_launch.doctor import format_bytes, memlock_advice, report_problems

REPO = LAUNCHER_DIR.parent
FAKE_PROBE = Path(__file__).resolve().parent / "fake_probe.py"
LOCAL = str(REPO / "configs" / "local.yaml")
NO_DEVICE = "no RDMA device (ibv_get_device_list: Function not implemented)"


@pytest.fixture
def probe_build(fake_build):
    """The fake build tree with BUILD/rdma/tessera-doctor-probe."""
    path = fake_build / "rdma" / "tessera-doctor-probe"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_PROBE} probe "$@"\n')
    path.chmod(0o755)
    return fake_build


@pytest.fixture
def spec(tmp_path, monkeypatch):
    """Sets what the fake probes report: spec({"*": {...}, "node1": {...}})."""
    path = tmp_path / "probe-spec.json"
    record = tmp_path / "probe-argv.jsonl"
    monkeypatch.setenv("FAKE_PROBE_SPEC", str(path))
    monkeypatch.setenv("FAKE_PROBE_RECORD", str(record))
    path.write_text("{}")

    def set_spec(value):
        path.write_text(json.dumps(value))

    set_spec.record = record
    return set_spec


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """ssh, srun and mpirun on PATH: the fake_probe.py stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ssh", "srun", "mpirun"):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_PROBE} {tool} "$@"\n')
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(name, raising=False)
    return bin_dir


def doctor(capsys, build, *args, config=LOCAL):
    """Runs the doctor in-process: (exit status, stdout, stderr)."""
    code = main(["doctor", "--config", config, "--build-dir", str(build), *args])
    out, err = capsys.readouterr()
    return code, out, err


def doctor_json(capsys, build, *args, config=LOCAL):
    code, out, err = doctor(capsys, build, "--json", *args, config=config)
    report = json.loads(out)
    assert report["exit_status"] == code
    return code, report


# -- this host -------------------------------------------------------------------


def test_tcp_job_on_a_host_without_rdma_is_fine(capsys, probe_build, spec):
    code, out, _ = doctor(capsys, probe_build)
    assert code == 0, out
    assert "transport: tcp -> ZeroMQ over tcp" in out
    assert "reachable     yes: 127.0.0.1:" in out
    assert f"RDMA          unusable: {NO_DEVICE}" in out
    assert "not needed: cluster.transport tcp uses no RDMA" in out
    assert "CUDA          none (libcuda.so.1 not found)" in out
    assert "GPUDirect     no (no nvidia_peermem or nv_peer_mem kernel module)" in out
    assert "same-host pairs: shared memory (shm.enabled) for frames of 64 KiB or more" in out
    assert "pull values of 2 MiB or more read in place" in out
    assert out.rstrip().endswith("the job could run as configured")
    argv = json.loads(spec.record.read_text().splitlines()[0])[1:]
    assert argv == ["--pool-bytes", "67108864", "--listen", "127.0.0.1", "--listen-seconds", "10"]


def test_auto_falls_back_to_zeromq_and_says_why(capsys, probe_build, spec):
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=auto", "--set", "rdma.pool_bytes=1048576")
    assert code == 0, out
    assert f"transport: auto -> ZeroMQ over tcp (RDMA unavailable: {NO_DEVICE})" in out
    assert f"uses          ZeroMQ over tcp (RDMA unavailable: {NO_DEVICE})" in out
    assert "registration  failed (1 MiB): no device" in out
    assert json.loads(spec.record.read_text().splitlines()[0])[2] == "1048576"  # --pool-bytes


def test_required_rdma_missing_fails_with_the_reason(capsys, probe_build, spec):
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=rdma", "--set", "rdma.required=true")
    assert code == 1, out
    assert ("transport: rdma + rdma.required -> the job would fail: RDMA is required but unusable on "
            f"{os.uname().nodename} ({NO_DEVICE})") in out
    assert f"RDMA is required (rdma.required) but unusable: {NO_DEVICE}" in out
    assert out.rstrip().endswith("the job could NOT run as configured")
    code, report = doctor_json(capsys, probe_build, "--set", "cluster.transport=auto", "--set", "rdma.required=true")
    assert code == 1 and not report["ok"]
    assert report["problems"] == [f"{os.uname().nodename}: RDMA is required (rdma.required) but unusable: "
                                  f"{NO_DEVICE}"]


def test_usable_rdma_is_used(capsys, probe_build, spec):
    spec({"*": {"rdma_usable": True, "memlock_soft": None, "memlock_hard": None, "cuda": ["H100"],
                "gpudirect": True}})
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=rdma", "--set", "rdma.required=true")
    assert code == 0, out
    assert "transport: rdma + rdma.required -> RDMA (verbs) on every host" in out
    assert "devices       mlx5_0: port 1 ACTIVE InfiniBand mtu 4096" in out
    assert "memlock       unlimited: enough for the RDMA pools (1.06 GiB)" in out
    assert "GPUDirect     available" in out
    assert "CUDA          1 device(s): H100 (140.40 GiB)" in out
    assert "GPU memory: GPUDirect RDMA on" in out


def test_memlock_too_low_for_the_pools(capsys, probe_build, spec):
    # The eager pool fits (the test registration works), the registration cache would not.
    spec({"*": {"rdma_usable": True, "memlock_soft": 128 << 20, "memlock_hard": 128 << 20}})
    code, report = doctor_json(capsys, probe_build, "--set", "cluster.transport=auto")
    assert code == 0  # not required: a warning
    host = report["hosts"][0]
    assert host["memlock"]["too_low"] and host["memlock"]["needed"] == (64 << 20) + (1 << 30)
    assert "limits.conf" in host["memlock"]["advice"] and "hard memlock unlimited" in host["memlock"]["advice"]
    assert host["uses"] == "RDMA (verbs)"
    assert len(report["warnings"]) == 1
    assert "memlock soft limit 128 MiB is below the 1.06 GiB" in report["warnings"][0]
    # Required: registrations past the limit would fail the processes.
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=rdma", "--set", "rdma.required=true")
    assert code == 1, out
    assert "TOO LOW for the RDMA pools" in out and "rdma.required" in out.split("problems")[-1]
    # The hard limit is high enough: raising the soft one is all it takes.
    spec({"*": {"rdma_usable": True, "memlock_soft": 128 << 20, "memlock_hard": None}})
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=auto")
    assert code == 0 and "`ulimit -l unlimited`" in out
    # Large enough pools for the limit: no warning.
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=auto", "--set", "rdma.pool_bytes=1048576",
                          "--set", "rdma.max_pinned_bytes=4194304")
    assert code == 0 and "warnings" not in out and "enough for the RDMA pools (5 MiB)" in out


def test_memlock_below_the_pool_makes_rdma_unusable(capsys, probe_build, spec):
    spec({"*": {"rdma_usable": True, "memlock_soft": 8 << 20, "memlock_hard": 8 << 20}})
    code, report = doctor_json(capsys, probe_build, "--set", "cluster.transport=auto")
    assert code == 0  # auto falls back
    assert report["hosts"][0]["uses"] == ("ZeroMQ over tcp (RDMA unavailable: the test registration of 64 MiB "
                                          "failed: ibv_reg_mr: Cannot allocate memory)")
    assert "memlock soft limit 8 MiB" in report["warnings"][0] and "falls back" in report["warnings"][0]
    # Root (CAP_IPC_LOCK) registers past the limit: it is not enforced, no warning.
    spec({"*": {"rdma_usable": True, "memlock_soft": 8 << 20, "registration_ok": True}})
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=auto")
    assert code == 0 and "warnings" not in out and "not enforced for this user" in out


def test_failed_test_registration_means_no_rdma(capsys, probe_build, spec):
    spec({"*": {"rdma_usable": True, "registration_ok": False, "memlock_soft": None}})
    code, out, _ = doctor(capsys, probe_build, "--set", "cluster.transport=rdma", "--set", "rdma.required=true")
    assert code == 1
    assert "the test registration of 64 MiB failed: ibv_reg_mr: Cannot allocate memory" in out


def test_unreachable_port_fails(capsys, probe_build, spec):
    spec({"*": {"wrong_port": True}})
    code, report = doctor_json(capsys, probe_build)
    assert code == 1
    reach = report["hosts"][0]["reachable"]
    assert not reach["ok"] and reach["error"] == "Connection refused"
    assert report["problems"] == [f"{os.uname().nodename}: cannot be reached from this host at "
                                  f"{reach['address']}: Connection refused"]
    # A probe that could not listen on the bind address says so; nothing to connect to.
    spec({"*": {"listen_error": True}})
    code, report = doctor_json(capsys, probe_build)
    assert code == 1
    assert report["hosts"][0]["reachable"] == {
        "ok": False, "address": "127.0.0.1:0",
        "error": "the probe could not listen there: cannot listen on 127.0.0.1: Cannot assign requested address"}


@pytest.mark.parametrize("mode, message", [
    ("garbage", "the probe printed 'probe v0 starting up' instead of a JSON report"),
    ("fail", "the probe exited with status 4 before reporting: tessera-doctor-probe: cannot read "
             "/sys/class/infiniband: Permission denied"),
    ("partial", "the probe's report is not as expected: lacks memlock.soft"),
])
def test_a_probe_that_misbehaves_fails(capsys, probe_build, spec, mode, message):
    spec({"*": {"mode": mode}})
    code, out, _ = doctor(capsys, probe_build)
    assert code == 1, out
    assert message in out
    if mode == "partial":
        assert "is not as expected: lacks memlock.soft" in out


def test_a_silent_probe_times_out(capsys, probe_build, spec):
    spec({"*": {"mode": "silent"}})
    code, out, _ = doctor(capsys, probe_build, "--timeout", "1")
    assert code == 1
    assert "no report within the time allowed (0 of 1 hosts reported)" in out


def test_missing_probe_names_the_path_and_how_to_build_it(capsys, fake_build):
    code, out, _ = doctor(capsys, fake_build)
    assert code == 1
    assert f"not found at {fake_build}/rdma/tessera-doctor-probe" in out
    assert f"cmake --build {fake_build} --target tessera-doctor-probe" in out


def test_config_errors_exit_2(capsys, probe_build, tmp_path):
    code, out, err = doctor(capsys, probe_build, "--set", "rdma.required=true")
    assert code == 2 and "rdma.required is true, but cluster.transport is tcp" in err
    code, out, err = doctor(capsys, probe_build, "--set", "cluster.transport=verbs")
    assert code == 2 and "cluster.transport must be one of" in err


def test_json_report_shape(capsys, probe_build, spec):
    code, report = doctor_json(capsys, probe_build, "--set", "cluster.transport=auto")
    assert code == 0
    assert (report["backend"], report["transport"], report["ok"]) == ("local", "auto", True)
    assert report["rdma"] == {"required": False, "pool_bytes": 64 << 20, "max_pinned_bytes": 1 << 30}
    host = report["hosts"][0]
    assert host["probe"]["listen"]["host"] == "127.0.0.1" and host["reachable"]["ok"]
    assert host["uses"].startswith("ZeroMQ over tcp (RDMA unavailable")
    assert report["would_use"][0].startswith("transport: auto -> ZeroMQ over tcp")


# -- other back-ends: the hosts they would use ---------------------------------------


def hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_ssh_checks_every_placed_host(capsys, probe_build, spec, fake_tools, tmp_path, monkeypatch):
    hosts = hostfile(tmp_path, "node1 roles=coordinator,server slots=3 addr=127.0.0.1\n"
                               "node2 roles=worker slots=2 addr=127.0.0.1\nnode3 addr=127.0.0.1\n")
    spec({"node2": {"rdma_usable": True, "memlock_soft": None}})
    code, report = doctor_json(capsys, probe_build, "--backend", "ssh", "--hostfile", hosts,
                               "--set", "cluster.transport=auto")
    assert code == 0, report
    assert [h["host"] for h in report["hosts"]] == ["node1", "node2"]  # node3 takes no process
    assert report["would_use"][0] == (f"transport: auto -> RDMA on node2; ZeroMQ over tcp on node1 (RDMA "
                                      f"unavailable: {NO_DEVICE})")
    monkeypatch.setenv("FAKE_SSH_DOWN", "node2")
    code, out, _ = doctor(capsys, probe_build, "--backend", "ssh", "--hostfile", hosts)
    assert code == 1
    assert ("node2: host node2 is unreachable over ssh: ssh: connect to host node2 port 22: Connection refused"
            in out)
    assert "host node1" in out


def test_ssh_reports_a_probe_missing_on_a_host(capsys, probe_build, spec, fake_tools, tmp_path):
    hosts = hostfile(tmp_path, "node1 slots=5 addr=127.0.0.1\n")
    code, out, _ = doctor(capsys, probe_build, "--backend", "ssh", "--hostfile", hosts,
                          "--set", f"ssh.build_dir={tmp_path}/elsewhere")
    assert code == 1
    assert f"node1: the probe tessera-doctor-probe was not found at {tmp_path}/elsewhere/rdma/" in out


def test_slurm_probes_every_node_of_the_allocation(capsys, probe_build, spec, fake_tools, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    monkeypatch.setenv("FAKE_CARRIER_RECORD", str(tmp_path / "srun-argv"))
    spec({"node1": {"wrong_port": True}})
    code, report = doctor_json(capsys, probe_build, "--backend", "slurm")
    argv = json.loads((tmp_path / "srun-argv").read_text())
    assert argv[:8] == ["--nodes", "3", "--ntasks", "3", "--ntasks-per-node", "1", "--kill-on-bad-exit=0",
                        "--job-name"]
    assert sorted(h["host"] for h in report["hosts"]) == ["node0", "node1", "node2"]
    assert code == 1 and len(report["problems"]) == 1 and report["problems"][0].startswith(
        "node1: cannot be reached from this host")


def test_mpirun_probes_one_rank_per_host(capsys, probe_build, spec, fake_tools, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CARRIER_RECORD", str(tmp_path / "mpirun-argv"))
    hosts = hostfile(tmp_path, "# Open MPI hostfile\nnodeA slots=4\nnodeB slots=4\nnodeA\n")
    code, report = doctor_json(capsys, probe_build, "--backend", "mpirun", "--set", f"mpirun.hostfile={hosts}")
    assert code == 0, report["problems"]
    argv = json.loads((tmp_path / "mpirun-argv").read_text())
    assert argv[:6] == ["-np", "2", "--map-by", "ppr:1:node", "--hostfile", hosts]
    assert sorted(h["host"] for h in report["hosts"]) == ["node0", "node1"]
    # A node without the probe: its wrapper says so.
    code, out, _ = doctor(capsys, tmp_path, "--backend", "mpirun", "--set", f"mpirun.hostfile={hosts}")
    assert code == 1 and out.count(f"the probe tessera-doctor-probe was not found at {tmp_path}/rdma/") == 2


# -- pieces ----------------------------------------------------------------------------


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 65536, 64 << 20, (64 << 20) + (1 << 30), 1536)] == [
        "512 bytes", "64 KiB", "64 MiB", "1.06 GiB", "1.50 KiB"]


def test_report_problems_name_missing_and_mistyped_keys():
    assert report_problems({"host": "x"})[0] == "lacks rdma.usable"
    problems = report_problems({"host": 3, "memlock": {"soft": True}})
    assert "host is 3" in problems and "memlock.soft is true" in problems


def test_memlock_advice_depends_on_the_hard_limit():
    assert "`ulimit -l 2097152`" in memlock_advice({"soft": 1, "hard": 2 << 30}, 1 << 30)
    assert "hard memlock unlimited" in memlock_advice({"soft": 1, "hard": 2}, 1 << 30)


def test_reports_run_together_by_a_carrier_are_split():
    from tessera_launch.doctor import json_objects
    assert json_objects('{"host": "a"}{"host": "b"} ') == ([{"host": "a"}, {"host": "b"}], "")
    assert json_objects('{"host": "a"} warning: x') == ([{"host": "a"}], "warning: x")
    assert json_objects("[1]") == ([], "[1]")


def test_ssh_host_whose_address_cannot_be_resolved(capsys, probe_build, spec, fake_tools, tmp_path):
    hosts = hostfile(tmp_path, "node1 slots=3 addr=127.0.0.1\nno-such-host.invalid slots=3\n")
    code, report = doctor_json(capsys, probe_build, "--backend", "ssh", "--hostfile", hosts)
    assert code == 1
    assert [h["host"] for h in report["hosts"]] == ["node1"]
    assert len(report["problems"]) == 1
    assert report["problems"][0].startswith("no-such-host.invalid: cannot resolve its address")
