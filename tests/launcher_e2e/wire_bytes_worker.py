#!/usr/bin/python3
"""The worker program of tests/launcher_e2e/test_wire_bytes.py, run by
tessera-launch: a fixed mix of pushes, pulls and clocks over TCP loopback
(rows of 16 bytes and of 1 KiB, so that ZeroMQ frames of both header sizes
go out; one table with compressed pushes and pulls, whose messages carry
encoded parts), then it holds still with every connection open until the
test has measured the sockets, and finishes with its stats in the report.

Flags besides the launcher's (Worker.from_args):
  --quiet-file PATH    written (JSON: pid, stats, transport stats) once the
                       workload is done and every request answered
  --release-file PATH  waited for (up to --hold-seconds) before finishing
  --steps N            workload iterations
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import tessera


def main(argv) -> int:
    worker, rest = tessera.Worker.from_args(argv)
    p = argparse.ArgumentParser(prog="wire_bytes_worker.py")
    p.add_argument("--quiet-file", required=True)
    p.add_argument("--release-file", required=True)
    p.add_argument("--hold-seconds", type=float, default=60)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args(rest)

    small, wide, packed = 1, 2, 3
    worker.create_table(small, 4, optimizer="accumulate")
    worker.create_table(wide, 256, optimizer="accumulate")
    worker.create_table(packed, 64, optimizer="accumulate", compression="topk:ratio=0.1,raw_below=1",
                        pull_compression="fp16:raw_below=1")
    rng = np.random.default_rng(7)
    for step in range(args.steps):
        keys = rng.integers(1, 1000, size=8, dtype=np.uint64)
        worker.push(small, keys, np.ones((8, 4), dtype=np.float32))
        worker.pull(small, keys)
        keys = rng.integers(1, 100, size=16, dtype=np.uint64)
        worker.push(wide, keys, np.full((16, 256), 0.5, dtype=np.float32))
        worker.pull(wide, keys)
        keys = np.arange(1 + step, 33 + step, dtype=np.uint64)
        worker.push(packed, keys, rng.standard_normal((32, 64)).astype(np.float32))
        worker.pull(packed, keys)
        worker.clock()

    stats = worker.stats()
    quiet = {"pid": os.getpid(), "stats": stats, "transport": worker.transport_stats()}
    tmp = args.quiet_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(quiet, f)
    os.replace(tmp, args.quiet_file)
    deadline = time.monotonic() + args.hold_seconds
    while not os.path.exists(args.release_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.finish(args.steps, 0.0, json.dumps({"worker_stats": worker.stats()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
