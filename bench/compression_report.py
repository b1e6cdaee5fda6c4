#!/usr/bin/python3
"""Table of a compression run (bench/run_compression.sh).

    compression_report.py OUT RATE

OUT/variants.tsv lists NAME, PUSH_SPEC, PULL_SPEC and the run directory of
every variant; the first one is the baseline. For each run it reads
summary.json: wall time (the largest train_seconds of the workers), wire
bytes pushed and pulled (summed over workers), and the final test loss.
Writes OUT/compression.md and prints it.
"""
import json
import sys
from pathlib import Path


def read(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    if s.get("status") != "ok":
        raise SystemExit(f"compression_report: {run} failed: {s.get('reason')}")
    reports = [w["report"] for w in s["worker_reports"]]
    stats = [r["worker_stats"] for r in reports]
    return {
        "seconds": max(r["train_seconds"] for r in reports),
        "pushed": sum(x["wire_bytes_pushed"] for x in stats),
        "pulled": sum(x["wire_bytes_pulled"] for x in stats),
        "loss": reports[0]["test_loss"],
        "auc": reports[0]["test_auc"],
    }


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, rate = Path(sys.argv[1]), sys.argv[2]
    rows = []
    for line in (out / "variants.tsv").read_text().splitlines():
        name, push, pull, run = line.split("\t")
        rows.append((name, push or "none", pull or "none", read(Path(run))))
    base = rows[0][3]
    lines = [f"Link: {rate} (shared by every process of the job)", "",
             "| variant | push codec | pull codec | wall time (s) | time / none | pushed MB | pulled MB "
             "| final test loss | loss vs none |", "|---|---|---|---|---|---|---|---|---|"]
    for name, push, pull, r in rows:
        lines.append(f"| {name} | `{push}` | `{pull}` | {r['seconds']:.2f} | {r['seconds'] / base['seconds']:.2f} "
                     f"| {r['pushed'] / 1e6:.2f} | {r['pulled'] / 1e6:.2f} | {r['loss']:.4f} "
                     f"| {100 * (r['loss'] / base['loss'] - 1):+.2f}% |")
    text = "\n".join(lines) + "\n"
    (out / "compression.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
