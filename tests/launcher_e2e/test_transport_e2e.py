"""cluster.transport rdma and auto on this machine, which has no RDMA
device: with auto every process logs one line that RDMA is unavailable
and it falls back to ZeroMQ, and the job succeeds; with rdma.required the
processes refuse to start, and the launcher's output names the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

PROCESSES = ["coordinator", "server-0", "server-1", "worker-0", "worker-1"]
#: configs/local.yaml cut down to a few seconds.
SMALL = ["--set", "worker.args.train_examples=20000", "--set", "worker.args.test_examples=2000",
         "--set", "worker.args.epochs=1"]
SYSFS_RDMA = Path("/sys/class/infiniband")


@pytest.fixture(autouse=True)
def no_rdma_device():
    if SYSFS_RDMA.is_dir() and any(SYSFS_RDMA.iterdir()):
        pytest.skip("this machine has an RDMA device; these checks are for one without")


def is_notice(line: str) -> bool:
    return "RDMA unavailable" in line and "falling back to ZeroMQ" in line


def test_auto_falls_back(launcher, binaries, source_dir):
    result = launcher.local("--config", str(source_dir / "configs" / "local.yaml"), *SMALL,
                            "--set", "cluster.transport=auto", "--quiet", "--timeout", "150")
    assert result.returncode == 0, result.describe()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["reason"]
    for name in PROCESSES:
        lines = (result.run_dir / "logs" / f"{name}.log").read_text().splitlines()
        notices = [line for line in lines if is_notice(line)]
        assert len(notices) == 1, f"{name}: {len(notices)} fallback notices, expected one:\n" + "\n".join(
            notices or lines[-20:])
    config = (result.run_dir / "config.yaml").read_text()
    assert "transport: auto" in config


def test_rdma_required_fails(launcher, binaries, source_dir):
    result = launcher.local("--config", str(source_dir / "configs" / "local.yaml"), *SMALL,
                            "--set", "cluster.transport=rdma", "--set", "rdma.required=true",
                            "--set", "timeouts.assemble_seconds=10", "--quiet", "--timeout", "60")
    assert result.returncode == 1, result.describe()
    # The final block shows the failed process's last lines: the transport's refusal and its reason.
    assert re.search(r"RDMA is required.*unusable: \S", result.output), result.describe()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    culprit = summary["first_failure"]
    assert culprit in PROCESSES, summary
    log = (result.run_dir / "logs" / f"{culprit}.log").read_text()
    assert "RDMA is required" in log, log[-2000:]
    assert not any(is_notice(line) for line in log.splitlines()), "required RDMA must not fall back"
