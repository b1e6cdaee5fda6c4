"""I1-I4 with real processes on loopback: the consistency workload is run
through tessera-launch for BSP, SSP(1), SSP(3) and ASP, and the recorded
events of all workers are checked by tessera-consistency-check."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build"))
CONFIG = REPO / "configs" / "consistency_check.yaml"
WORKLOAD = BUILD / "tests" / "consistency" / "tessera-consistency-workload"


def launch_workload(tmp_path, records, *overrides):
    """Runs the consistency workload through tessera-launch with the given
    --set overrides; returns the finished process."""
    argv = [sys.executable, str(REPO / "launcher" / "tessera-launch"), "local", "--config", str(CONFIG),
            "--build-dir", str(BUILD), "--run-dir", str(tmp_path / "run"), "--quiet", "--timeout", "120",
            "--set", f"worker.program={WORKLOAD}", "--set", f"worker.args.records={records}"]
    for override in overrides:
        argv += ["--set", override]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("model,staleness", [("bsp", 0), ("ssp", 1), ("ssp", 3), ("asp", 0)])
def test_invariants_hold_across_processes(tmp_path, model, staleness):
    records = tmp_path / "records"
    records.mkdir()
    run = launch_workload(tmp_path, records, f"worker.args.consistency={model}",
                          f"worker.args.staleness={staleness}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = subprocess.run(
        [str(BUILD / "tests" / "consistency" / "tessera-consistency-check"), "--records", str(records),
         "--workers", "3", "--consistency", model, "--staleness", str(staleness)],
        capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "I1 0, I2 0, I3 0, I4 0" in check.stdout


@pytest.mark.parametrize("policy", ["continue", "stop"])
def test_worker_killed_mid_job_under_bsp(tmp_path, policy):
    """Worker 2 kills itself (SIGKILL) at clock 5 of 40. With `continue` the
    others finish and the job is ok; with `stop` the job fails naming it."""
    records = tmp_path / "records"
    records.mkdir()
    run = launch_workload(tmp_path, records, "worker.args.clocks=40", "worker.args.die-rank=2",
                          "worker.args.die-at-clock=5", "timeouts.lease_seconds=2",
                          "timeouts.heartbeat_seconds=0.4", f"cluster.on_worker_loss={policy}")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    lost = [w for w in summary["worker_reports"] if w.get("lost")]
    if policy == "continue":
        assert run.returncode == 0, run.stdout[-3000:]
        assert summary["status"] == "ok"
        assert [w["rank"] for w in lost] == [2], summary["worker_reports"]
        assert "worker 2" in lost[0]["lost"]
        assert sorted(p.name for p in records.iterdir()) == ["worker-0.txt", "worker-1.txt"]
    else:
        assert run.returncode == 1
        assert summary["status"] == "failed"
        assert "worker-2" in summary["reason"] or "worker 2" in summary["reason"], summary["reason"]
