#!/usr/bin/python3
"""Table and plot of a straggler experiment (bench/run_straggler.sh).

    straggler_report.py OUT

OUT holds one launcher run directory per run, named SCENARIO-MODEL-REPEAT
(e.g. rotating-ssp-1). For every run it reads summary.json (every worker's
TESSERA_RESULT report) and progress.jsonl (worker 0's test loss over time),
then writes OUT/straggler.md (one table per scenario, medians over repeats),
OUT/straggler.json (every run's numbers) and OUT/straggler.png (test loss
against training time, first repeat of each model), and prints the table.

Training time of a run: the largest train_seconds of its workers, i.e. from
the "start" barrier until the last worker has taken its last step. Final loss:
the test log-loss every worker evaluates after the last epoch's barrier.
"""
import json
import re
import statistics
import sys
from pathlib import Path

import yaml

MODEL_ORDER = ["bsp", "ssp", "asp"]
RUN_NAME = re.compile(r"^(?P<scenario>[a-z]+)-(?P<model>bsp|ssp|asp)-(?P<repeat>\d+)$")
GOAL_TIME_RATIO = 0.7   # SSP's training time at most this fraction of BSP's
GOAL_LOSS_DELTA = 0.01  # and its final loss within 1% of BSP's


def read_run(path: Path) -> dict:
    summary = json.loads((path / "summary.json").read_text())
    if summary.get("status") != "ok":
        raise SystemExit(f"straggler_report: run {path} did not succeed: {summary.get('reason')}")
    reports = [w["report"] for w in summary["worker_reports"] if w.get("report")]
    if len(reports) != len(summary["worker_reports"]) or not reports:
        raise SystemExit(f"straggler_report: run {path} lacks worker reports")
    args = yaml.safe_load((path / "config.yaml").read_text())["worker"]["args"]
    curve = []
    with open(path / "progress.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("worker") == 0 and r.get("test_loss") is not None and r.get("t") is not None:
                curve.append((r["t"], r["test_loss"]))
    curve.sort()
    return {
        "train_seconds": max(r["train_seconds"] for r in reports),
        "steps": max(r["steps"] for r in reports),
        "test_loss": reports[0]["test_loss"],
        "test_auc": reports[0]["test_auc"],
        "clock_wait_seconds": statistics.mean(r["worker_stats"]["clock_wait_seconds"] for r in reports),
        "staleness": args.get("staleness"),
        "step_ms": args.get("step_ms"),
        "slowdown": args.get("straggler_slowdown"),
        "period": args.get("straggler_period"),
        "curve": curve,
    }


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    runs = {}  # (scenario, model) -> [run]
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        m = RUN_NAME.match(d.name)
        if m and (d / "summary.json").exists():
            runs.setdefault((m["scenario"], m["model"]), []).append(read_run(d))
    if not runs:
        print(f"straggler_report: no runs in {out}", file=sys.stderr)
        return 1
    scenarios = sorted({s for s, _ in runs}, key=lambda s: (s != "rotating", s))

    lines = []
    for scenario in scenarios:
        models = [m for m in MODEL_ORDER if (scenario, m) in runs]
        med = {m: {k: statistics.median(r[k] for r in runs[(scenario, m)])
                   for k in ("train_seconds", "steps", "test_loss", "test_auc", "clock_wait_seconds")}
               for m in models}
        first = runs[(scenario, models[0])][0]
        lines.append(f"### {scenario} straggler: step {first['step_ms']} ms, slowdown {first['slowdown']}x"
                     + (f", a new slow worker every {first['period']} step(s)" if scenario == "rotating" else ""))
        lines.append("")
        lines.append("| model | steps per worker | training time (s) | time / BSP | final test loss | loss vs BSP "
                     "| mean Clock() wait per worker (s) | repeats |")
        lines.append("|---|---|---|---|---|---|---|---|")
        base = med.get("bsp")
        for m in models:
            v = med[m]
            label = {"bsp": "BSP", "ssp": f"SSP({runs[(scenario, m)][0]['staleness']})", "asp": "ASP"}[m]
            ratio = f"{v['train_seconds'] / base['train_seconds']:.2f}" if base else "-"
            delta = f"{100 * (v['test_loss'] / base['test_loss'] - 1):+.2f}%" if base else "-"
            lines.append(f"| {label} | {int(v['steps'])} | {v['train_seconds']:.2f} | {ratio} | {v['test_loss']:.4f} "
                         f"| {delta} | {v['clock_wait_seconds']:.2f} | {len(runs[(scenario, m)])} |")
        if base and "ssp" in med:
            t = med["ssp"]["train_seconds"] / base["train_seconds"]
            d = abs(med["ssp"]["test_loss"] / base["test_loss"] - 1)
            met = t <= GOAL_TIME_RATIO and d <= GOAL_LOSS_DELTA
            lines.append("")
            lines.append(f"Goal (SSP time <= {GOAL_TIME_RATIO}x BSP, loss within {GOAL_LOSS_DELTA:.0%}): "
                         f"{'met' if met else 'not met'} (time {t:.2f}x, loss {100 * d:.2f}% off)")
        lines.append("")
    table = "\n".join(lines)
    (out / "straggler.md").write_text(table + "\n")
    (out / "straggler.json").write_text(json.dumps(
        {f"{s}-{m}": rs for (s, m), rs in runs.items()}, indent=1) + "\n")
    print(table)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4.2), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios):
        for m in MODEL_ORDER:
            if (scenario, m) not in runs:
                continue
            r = runs[(scenario, m)][0]
            label = {"bsp": "BSP", "ssp": f"SSP({r['staleness']})", "asp": "ASP"}[m]
            ts, losses = zip(*r["curve"]) if r["curve"] else ((), ())
            ax.plot(ts, losses, marker=".", label=f"{label}: {r['train_seconds']:.1f} s")
        ax.set_title(f"{scenario} straggler ({r['slowdown']}x compute)")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test log-loss (worker 0)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "straggler.png", dpi=110)
    print(f"\nwrote {out / 'straggler.md'}, {out / 'straggler.json'}, {out / 'straggler.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
