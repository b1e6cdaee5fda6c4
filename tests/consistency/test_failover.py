"""Failover with real processes on loopback (issue: replication).

The consistency workload (accumulate optimizer, +1 gradients, every event
recorded) runs through tessera-launch with 3 servers and replication 2, and
the test SIGKILLs one server in the middle of it. Server 1 is the primary of
a third of the shards and the backup of another third, so one kill loses a
primary (E1) and a backup (E2) at once. The job must finish without an error
in any worker, and tessera-consistency-check must find every pull exact:
no acknowledged push lost (I2, I3: a pull counts fewer pushes than it must)
and none applied twice (I4: more pushes than were issued)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jobprocs import command_line, find_process, job_environment, wait_for_address, wait_for_process  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build"))
CONFIG = REPO / "configs" / "consistency_check.yaml"
WORKLOAD = BUILD / "tests" / "consistency" / "tessera-consistency-workload"
CHECK = BUILD / "tests" / "consistency" / "tessera-consistency-check"


def find_server(coordinator: str, name: str):
    """The pid of the tessera-server called `name` that joined `coordinator`."""
    return find_process("tessera-server", coordinator, name)


def start_job(tmp_path, records, *overrides):
    argv = [sys.executable, str(REPO / "launcher" / "tessera-launch"), "local", "--config", str(CONFIG),
            "--build-dir", str(BUILD), "--run-dir", str(tmp_path / "run"), "--timeout", "150",
            "--set", f"worker.program={WORKLOAD}", "--set", f"worker.args.records={records}",
            "--set", "cluster.servers=3", "--set", "cluster.replication=2"]
    for override in overrides:
        argv += ["--set", override]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("model,staleness", [("bsp", 0), ("ssp", 2)])
def test_a_server_killed_mid_job_loses_no_acknowledged_push(tmp_path, model, staleness):
    records = tmp_path / "records"
    records.mkdir()
    job = start_job(tmp_path, records, f"worker.args.consistency={model}", f"worker.args.staleness={staleness}",
                    "worker.args.clocks=400")
    address = wait_for_address(tmp_path / "run", job)
    pid = wait_for_process("tessera-server", address, "server-1")
    time.sleep(2.0)  # let the workers get going
    assert job.poll() is None, "the job ended before the fault: make it longer\n" + job.stdout.read()
    os.kill(pid, signal.SIGKILL)
    out, _ = job.communicate(timeout=180)
    assert job.returncode == 0, out[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    # The coordinator saw the loss and failed over (it did not fail the job).
    log = (tmp_path / "run" / "logs" / "coordinator.log").read_text()
    assert re.search(r"lost server 1 .*fail over to their backups \(map epoch 2\)", log), log[-3000:]
    # Every worker finished, and the job ran on well after the kill.
    assert sorted(p.name for p in records.iterdir()) == ["worker-0.txt", "worker-1.txt", "worker-2.txt"]
    check = subprocess.run([str(CHECK), "--records", str(records), "--workers", "3", "--consistency", model,
                            "--staleness", str(staleness)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "I1 0, I2 0, I3 0, I4 0" in check.stdout, check.stdout


def test_a_restarted_server_rejoins_and_takes_over_after_a_second_loss(tmp_path):
    """Server 1 is killed and a new process started for its rank: it rejoins
    empty. Then server 2 is killed: its shards' lost copies are re-made on
    the rejoined server by state transfer, with training going on, and every
    pull is still exact."""
    records = tmp_path / "records"
    records.mkdir()
    job = start_job(tmp_path, records, "worker.args.clocks=700")
    address = wait_for_address(tmp_path / "run", job)
    pid = wait_for_process("tessera-server", address, "server-1")
    argv, env = command_line(pid), dict(os.environ, **job_environment(pid))  # the job key is a flag in argv
    time.sleep(1.5)
    assert job.poll() is None, "the job ended before the fault: make it longer\n" + job.stdout.read()
    os.kill(pid, signal.SIGKILL)
    time.sleep(1.0)  # lost, failed over
    with open(tmp_path / "server-1-again.log", "w") as log:
        again = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        time.sleep(1.0)  # rejoined
        pid2 = find_server(address, "server-2")
        assert pid2 is not None
        assert job.poll() is None, "the job ended before the second fault: make it longer\n" + job.stdout.read()
        os.kill(pid2, signal.SIGKILL)
        out, _ = job.communicate(timeout=180)
        assert job.returncode == 0, out[-4000:]
        assert again.wait(timeout=30) == 0, (tmp_path / "server-1-again.log").read_text()[-3000:]
    finally:
        if again.poll() is None:
            again.kill()
    log = (tmp_path / "run" / "logs" / "coordinator.log").read_text()
    assert re.search(r"server 1 rejoined from .* \(incarnation 1\)", log), log[-3000:]
    assert re.search(r"lost server 2 .*fail over.*lost copies re-made", log), log[-3000:]
    again_log = (tmp_path / "server-1-again.log").read_text()
    assert "served" in again_log, again_log[-2000:]
    check = subprocess.run([str(CHECK), "--records", str(records), "--workers", "3", "--consistency", "bsp",
                            "--staleness", "0"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "I1 0, I2 0, I3 0, I4 0" in check.stdout, check.stdout


def run_logreg(tmp_path, name, kill_at_step=None):
    """configs/local.yaml's logistic regression under BSP (2 servers,
    replication 2); with kill_at_step, server 1 is SIGKILLed once a worker
    reports that step. Returns the workers' final losses."""
    run = tmp_path / name
    argv = [sys.executable, str(REPO / "launcher" / "tessera-launch"), "local",
            "--config", str(REPO / "configs" / "local.yaml"), "--build-dir", str(BUILD), "--run-dir", str(run),
            "--timeout", "240", "--quiet", "--set", "worker.args.consistency=bsp",
            "--set", "worker.args.train_examples=200000", "--set", "worker.args.epochs=2",
            "--set", "cluster.replication=2"]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill_at_step is not None:
        address = wait_for_address(run, job)
        deadline = time.monotonic() + 200
        killed = False
        while not killed and time.monotonic() < deadline and job.poll() is None:
            progress = run / "progress.jsonl"
            steps = [json.loads(line).get("step", 0) for line in progress.read_text().splitlines()
                     if line.strip()] if progress.exists() else []
            if steps and max(steps) >= kill_at_step:
                pid = find_server(address, "server-1")
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
        assert killed, "the job ended before the kill"
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    if kill_at_step is not None:
        log = (run / "logs" / "coordinator.log").read_text()
        assert "lost server 1" in log, log[-2000:]
    return [w["final_loss"] for w in summary["worker_reports"]]


def test_logreg_with_a_primary_killed_halfway_ends_with_the_fault_free_loss(tmp_path):
    """Same seed, BSP: every acknowledged push survives and none is applied
    twice, so the model ends where a run without the fault ends (within 1%;
    the order in which two workers' pushes add up may differ)."""
    clean = run_logreg(tmp_path, "clean")
    faulted = run_logreg(tmp_path, "faulted", kill_at_step=500)  # of 1000 steps per worker
    assert len(clean) == len(faulted) == 2
    for a, b in zip(clean, faulted):
        assert abs(a - b) <= 0.01 * abs(a), (clean, faulted)
