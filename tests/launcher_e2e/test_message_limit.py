"""A job whose servers accept messages of at most 1 MiB (limits.max_message_mb)
moves 4 MiB rows: the launcher gives the workers the same limit, a worker
splits each push into pieces of columns that fit it, and the server sends
pull replies (whole ones for views too) in pieces that fit it. Before,
the server's transport dropped the 4 MiB push, and the worker's its 1 MiB
reply pieces with their headers, and the job hung."""

from __future__ import annotations

import json
import re


def test_rows_larger_than_the_message_limit_go_in_pieces_both_ways(launcher, binaries, source_dir):
    result = launcher.local(
        "--config", str(source_dir / "configs" / "bench_push_pull.yaml"),
        "--set", f"worker.program={binaries / 'bench' / 'tessera-push-pull-bench'}",
        "--set", "limits.max_message_mb=1", "--set", "transfer.part_bytes=0", "--set", "shm.enabled=false",
        "--set", "worker.args.sizes=4194304", "--set", "worker.args.ops=push,pull,pullview",
        "--set", "worker.args.modes=sequential", "--set", "worker.args.repeats=1",
        "--set", "worker.args.min_seconds=0.01", "--set", "worker.args.min_messages=3",
        "--quiet", "--timeout", "90", timeout=120)
    assert result.returncode == 0, result.describe()
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["reason"]
    worker = (result.run_dir / "logs" / "worker-0.log").read_text()
    for op in ("push", "pull", "pullview"):
        assert f"size 4194304 {op} sequential" in worker, worker[-3000:]
    argv = (result.run_dir / "logs" / "launcher.log").read_text()
    assert re.search(r"--transfer_max_message_mb 1\b", argv), argv[-2000:]  # the worker was told the limit
    for name in ("server-0", "worker-0"):
        log = (result.run_dir / "logs" / f"{name}.log").read_text()
        assert "exceed max_message_bytes" not in log, log[-3000:]
