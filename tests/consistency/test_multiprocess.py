"""I1-I4 with real processes on loopback: the consistency workload is run
through tessera-launch for BSP, SSP(1), SSP(3) and ASP, and the recorded
events of all workers are checked by tessera-consistency-check."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build"))
CONFIG = REPO / "configs" / "consistency_check.yaml"


@pytest.mark.parametrize("model,staleness", [("bsp", 0), ("ssp", 1), ("ssp", 3), ("asp", 0)])
def test_invariants_hold_across_processes(tmp_path, model, staleness):
    records = tmp_path / "records"
    records.mkdir()
    run = subprocess.run(
        [sys.executable, str(REPO / "launcher" / "tessera-launch"), "local", "--config", str(CONFIG),
         "--build-dir", str(BUILD), "--run-dir", str(tmp_path / "run"), "--quiet", "--timeout", "120",
         "--set", f"worker.program={BUILD / 'tests' / 'consistency' / 'tessera-consistency-workload'}",
         "--set", f"worker.args.records={records}",
         "--set", f"worker.args.consistency={model}",
         "--set", f"worker.args.staleness={staleness}"],
        capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = subprocess.run(
        [str(BUILD / "tests" / "consistency" / "tessera-consistency-check"), "--records", str(records),
         "--workers", "3", "--consistency", model, "--staleness", str(staleness)],
        capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "I1 0, I2 0, I3 0, I4 0" in check.stdout
