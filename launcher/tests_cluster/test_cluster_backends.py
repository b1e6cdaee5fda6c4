"""The same small job (configs/local.yaml: 2 servers, 2 workers, logistic
regression cut down to run in a few seconds) through the mpirun, slurm and
ssh back-ends, with real Open MPI, real Slurm daemons and a real sshd on
this machine. Packages come from scripts/setup.sh (apt). Slurm's daemons
and sshd are started by the test and stopped after it; a test skips, with
the reason, only when its daemons cannot run here."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "multihost"))
from netns_hosts import sshd_config  # noqa: E402

LAUNCH = REPO / "launcher" / "tessera-launch"
CONFIG = REPO / "configs" / "local.yaml"
#: Small enough to run in seconds on two loaded cores.
SMALL = ["--set", "worker.args.train_examples=20000", "--set", "worker.args.test_examples=2000",
         "--set", "worker.args.epochs=1", "--set", "timeouts.assemble_seconds=20"]
PROCESSES = ["coordinator", "server-0", "server-1", "worker-0", "worker-1"]


def setup_packages():
    """scripts/setup.sh installs what is missing (no network when nothing is)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, f"scripts/setup.sh failed:\n{proc.stdout}{proc.stderr}"


def launch(*args, env=None, timeout=120):
    proc = subprocess.run([sys.executable, str(LAUNCH), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env, cwd=REPO)
    return proc


def check_ok(proc, run_dir: Path, carrier_logs=()):
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"status {proc.returncode}:\n{output[-4000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["reason"]
    assert summary["processes"] == {name: 0 for name in PROCESSES}, summary["processes"]
    assert (summary["servers"], summary["workers"]) == (2, 2)
    reports = summary["worker_reports"]
    assert [r["rank"] for r in reports] == [0, 1], reports
    for r in reports:
        assert r["steps"] > 0 and r["bytes_pushed"] > 0 and r["bytes_pulled"] > 0, r
        assert 0.5 < r["report"]["test_auc"] <= 1.0, r
    assert len(summary["server_addresses"]) == 2
    for name in PROCESSES:  # each process's own log, lines prefixed with its name
        lines = (run_dir / "logs" / f"{name}.log").read_text().splitlines()
        assert lines and all(line.startswith(f"[{name}]") for line in lines), name
    assert (run_dir / "progress.jsonl").read_text().strip(), "no progress records"
    for carrier in carrier_logs:
        assert (run_dir / "logs" / f"{carrier}.log").exists(), carrier
    return summary


def no_job_processes_left(run_dir: Path) -> list:
    """Processes still running whose command line names the run directory
    or a Tessera binary started for it."""
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run_dir) in cmdline and state not in ("Z", "X"):
            left.append(f"{pid}: {cmdline}")
    return left


def interrupt_midway(args, run_dir: Path, env=None) -> subprocess.CompletedProcess:
    """Starts a full-size job, sends SIGINT once a worker has reported
    progress, and returns the launcher's result."""
    proc = subprocess.Popen([sys.executable, str(LAUNCH), *args, "--run-dir", str(run_dir), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    progress = run_dir / "progress.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.exists() and progress.stat().st_size > 0:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def wait_gone(run_dir: Path, seconds: float = 15) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = no_job_processes_left(run_dir)
        if not left:
            return []
        time.sleep(0.2)
    return no_job_processes_left(run_dir)


# -- mpirun --------------------------------------------------------------------


def test_mpirun(tmp_path, build_dir):
    setup_packages()
    assert shutil.which("mpirun"), "scripts/setup.sh did not install mpirun"
    run_dir = tmp_path / "run"
    proc = launch("mpirun", "--config", str(CONFIG), "--run-dir", str(run_dir), "--build-dir", str(build_dir),
                  "--quiet", "--timeout", "100", *SMALL)
    check_ok(proc, run_dir, ["mpirun"])

    stopped = tmp_path / "stopped"
    result = interrupt_midway(["mpirun", "--config", str(CONFIG), "--build-dir", str(build_dir)], stopped)
    assert result.returncode == 130, result.stdout[-3000:]
    assert json.loads((stopped / "summary.json").read_text())["end"] == "interrupted"
    assert wait_gone(stopped) == []


# -- slurm ---------------------------------------------------------------------


@pytest.fixture
def slurm(tmp_path):
    """A one-node Slurm cluster (scripts/slurm_local.sh); yields the
    environment clients need."""
    setup_packages()
    state = tmp_path / "slurm"
    script = REPO / "scripts" / "slurm_local.sh"
    started = subprocess.run([str(script), "start", str(state)], capture_output=True, text=True, timeout=120)
    try:
        if started.returncode == 3:
            pytest.skip(f"Slurm's daemons cannot run here: {started.stderr.strip()}")
        assert started.returncode == 0, f"slurm_local.sh start failed:\n{started.stdout}{started.stderr}"
        yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        subprocess.run([str(script), "stop", str(state)], capture_output=True, timeout=60)


def test_slurm_srun_and_submit(tmp_path, build_dir, slurm):
    run_dir = tmp_path / "srun"
    proc = launch("slurm", "--config", str(CONFIG), "--run-dir", str(run_dir), "--build-dir", str(build_dir),
                  "--quiet", "--timeout", "100", *SMALL, env=slurm)
    check_ok(proc, run_dir, ["srun"])

    submitted = tmp_path / "submitted"
    proc = launch("slurm", "--submit", "--wait", "--config", str(CONFIG), "--run-dir", str(submitted),
                  "--build-dir", str(build_dir), "--timeout", "100", *SMALL, env=slurm)
    check_ok(proc, submitted, ["srun"])
    assert (submitted / "logs" / "sbatch.out").exists()
    script = (submitted / "job.sbatch").read_text()
    assert "#SBATCH --ntasks=5" in script and "--in-run-dir" in script, script
    assert (submitted / "slurm-job-id").read_text().strip().isdigit()
    assert "==== tessera job logreg-local: OK ====" in proc.stdout

    stopped = tmp_path / "stopped"
    result = interrupt_midway(["slurm", "--config", str(CONFIG), "--build-dir", str(build_dir)], stopped, env=slurm)
    assert result.returncode == 130, result.stdout[-3000:]
    assert wait_gone(stopped) == []


# -- ssh -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    """An sshd on a free loopback port, with its own config, host key and
    authorized key; yields (port, ssh.args for the launcher)."""
    setup_packages()
    if os.geteuid() != 0:
        pytest.skip("sshd for another user's login needs root here")
    d = tmp_path / "sshd"
    d.mkdir(mode=0o700)
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = free_port()
    (d / "sshd_config").write_text(sshd_config("127.0.0.1", port, d / "host_key", d / "authorized_keys",
                                               d / "sshd.pid"))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    daemon = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and daemon.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        if daemon.poll() is not None:
            pytest.skip(f"sshd cannot run here: {(d / 'sshd.log').read_text()[-500:]}")
        args = ["-i", str(d / "client_key"), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR"]
        yield port, args
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


def test_ssh(tmp_path, build_dir, sshd):
    port, ssh_args = sshd
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# test hosts\nlocalhost port={port} roles=coordinator,server slots=3\n"
                        f"127.0.0.1 port={port} roles=worker slots=2\n")
    ssh_set = ["--set", "ssh.args=" + json.dumps(ssh_args)]
    run_dir = tmp_path / "run"
    proc = launch("ssh", "--hostfile", str(hostfile), "--config", str(CONFIG), "--run-dir", str(run_dir),
                  "--build-dir", str(build_dir), "--quiet", "--timeout", "100", *SMALL, *ssh_set)
    check_ok(proc, run_dir, ["ssh-coordinator", "ssh-server-0", "ssh-worker-1"])

    # An unreachable host is reported before anything starts.
    bad = tmp_path / "bad-hosts"
    bad.write_text(f"localhost port={free_port()} slots=5\n")
    proc = launch("ssh", "--hostfile", str(bad), "--config", str(CONFIG), "--run-dir", str(tmp_path / "bad"),
                  "--build-dir", str(build_dir), *ssh_set)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "host localhost is unreachable over ssh" in proc.stderr, proc.stderr
    assert not (tmp_path / "bad").exists()

    # Ctrl-C stops the remote processes too.
    stopped = tmp_path / "stopped"
    result = interrupt_midway(["ssh", "--hostfile", str(hostfile), "--config", str(CONFIG), "--build-dir",
                               str(build_dir), *ssh_set], stopped)
    assert result.returncode == 130, result.stdout[-3000:]
    assert wait_gone(stopped) == []
