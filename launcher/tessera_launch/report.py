"""tessera-launch report RUN: a run directory as plots and a Markdown page.

Reads RUN/summary.json and RUN/progress.jsonl (written by every back-end
that supervises a job) and writes, into RUN (or --out):

- loss.png: each worker's training loss (the windowed "loss" of its progress
  lines) and, where present, the test loss, against seconds since the job
  started;
- throughput.png: steps per second of the whole job (every worker's steps
  summed, in 1-second bins) against the same time axis;
- report.md: the outcome, the key numbers per worker, the process faults
  with what followed each (detection, failover, rejoin), and both plots.

Events are marked on both plots as vertical lines: workers that were lost
(from summary.json) and any record in RUN/events.jsonl ({"elapsed": s,
"what": "..."}). The fault schedule (faults.py) writes one there per fault
(red, labelled), and one when a paused process resumes or a killed one is
started again (grey); a fault skipped because its target had exited is not
drawn. Matplotlib is Debian's
(python3-matplotlib, installed by scripts/setup.sh).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


class ReportError(Exception):
    """A run directory that cannot be reported on; the message says why."""


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="a run directory (holds summary.json and progress.jsonl)")
    parser.add_argument("--out", metavar="DIR", help="where to write report.md and the PNGs (default: RUN)")


def _read_jsonl(path: Path) -> list:
    records = []
    if not path.exists():
        return records
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ReportError(f"{path}:{n}: not JSON ({e.msg})") from None
    return records


def load(run: Path) -> tuple:
    summary_path = run / "summary.json"
    if not summary_path.exists():
        raise ReportError(f"{run} has no summary.json (is it a run directory of a finished job?)")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReportError(f"{summary_path}: not JSON ({e.msg})") from None
    progress = _read_jsonl(run / "progress.jsonl")
    events = _read_jsonl(run / "events.jsonl")
    for w in summary.get("worker_reports") or []:
        if w.get("lost"):
            events.append({"elapsed": None, "what": f"worker {w.get('rank')} lost: {w['lost']}"})
    return summary, progress, events


def throughput(progress: list, bin_seconds: float = 1.0) -> tuple:
    """(bin centres, steps/s): step increases of every worker, binned by time."""
    last: dict = {}
    bins: dict = {}
    for r in sorted(progress, key=lambda r: r.get("elapsed", 0)):
        worker, step, t = r.get("worker"), r.get("step"), r.get("elapsed")
        if worker is None or step is None or t is None:
            continue
        if worker in last and step > last[worker]:
            b = int(t // bin_seconds)
            bins[b] = bins.get(b, 0) + (step - last[worker])
        last[worker] = step
    xs = sorted(bins)
    return [(b + 0.5) * bin_seconds for b in xs], [bins[b] / bin_seconds for b in xs]


def _mark_events(ax, events: list) -> None:
    for e in events:
        if e.get("elapsed") is None or e.get("kind") == "skipped":
            continue
        follow_up = e.get("kind") in ("resume", "restart")
        color = "grey" if follow_up else "red"
        ax.axvline(e["elapsed"], color=color, linestyle=":" if follow_up else "--", linewidth=1)
        ax.annotate(e.get("what", "event"), (e["elapsed"], 1.0), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=7, color=color)


def plot(out: Path, progress: list, events: list) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    workers = sorted({r["worker"] for r in progress if "worker" in r})
    for w in workers:
        pts = [(r["elapsed"], r["loss"]) for r in progress if r.get("worker") == w and r.get("loss") is not None]
        if pts:
            ax.plot(*zip(*pts), marker=".", linewidth=1, label=f"worker {w} train loss")
    test = [(r["elapsed"], r["test_loss"]) for r in progress if r.get("test_loss") is not None]
    if test:
        ax.plot(*zip(*sorted(test)), "k^", label="test loss")
    _mark_events(ax, events)
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("log-loss")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    plt.close(fig)
    written.append(out / "loss.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs, ys = throughput(progress)
    ax.step(xs, ys, where="mid")
    _mark_events(ax, events)
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("steps/s (all workers)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=100)
    plt.close(fig)
    written.append(out / "throughput.png")
    return written


def _fmt(v, spec=".4f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def _secs(v) -> str:
    return f"{v:.3f} s" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def fault_table(faults: list) -> list:
    """report.md lines for summary.json's "faults" (none: no lines)."""
    if not faults:
        return []
    lines = ["", "## Faults", "",
             "| # | fault | at (since start) | wall time | detection | failover | re-replicated | rejoin | recovered "
             "| note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for f in faults:
        what = f"{f.get('action')} {f.get('target')}"
        if f.get("action") == "pause" and f.get("duration_seconds") is not None:
            what += f" for {f['duration_seconds']:g} s"
        recovered = {True: "yes", False: "no"}.get(f.get("recovered"), "-")
        note = f.get("note") or (f.get("skipped") and f"skipped: {f['skipped']}") or ""
        lines.append(f"| {f.get('index')} | {what} | {_secs(f.get('seconds'))} | {f.get('time') or '-'} "
                     f"| {_secs(f.get('detection_seconds'))} | {_secs(f.get('failover_seconds'))} "
                     f"| {_secs(f.get('rereplication_seconds'))} | {_secs(f.get('rejoin_seconds'))} | {recovered} "
                     f"| {note.replace('|', '/')} |")
    lines += ["", "Times are seconds from the fault: detection to the coordinator's `lost` line, failover to "
                  "the first worker's `first push acknowledged` on the new shard map, re-replicated to the "
                  "coordinator's last `in sync` line for the copies the failover re-made, rejoin to the "
                  "coordinator's `rejoined` line (docs/fault_injection.md)."]
    return lines


def markdown(summary: dict, events: list) -> str:
    lines = [f"# Run {summary.get('job', '?')}", "",
             f"- status: **{summary.get('status')}** ({summary.get('reason', '')})",
             f"- wall time: {_fmt(summary.get('wall_seconds'), '.1f')} s; steps: {summary.get('steps', '-')}; "
             f"final loss: {_fmt(summary.get('final_loss'))}; test AUC: {_fmt(summary.get('test_auc'))}",
             f"- bytes pushed: {summary.get('bytes_pushed', '-')}; pulled: {summary.get('bytes_pulled', '-')}", "",
             "| worker | steps | final loss | test loss | test AUC | wire bytes pushed | wire bytes pulled |",
             "|---|---|---|---|---|---|---|"]
    for w in summary.get("worker_reports") or []:
        r = w.get("report") or {}
        stats = r.get("worker_stats") or {}
        lines.append(f"| {w.get('rank')} | {w.get('steps', '-')} | {_fmt(w.get('final_loss'))} "
                     f"| {_fmt(r.get('test_loss'))} | {_fmt(r.get('test_auc'))} "
                     f"| {stats.get('wire_bytes_pushed', '-')} | {stats.get('wire_bytes_pulled', '-')} |")
    lines += fault_table(summary.get("faults") or [])
    # Faults are in their table; the rest (lost workers, ...) is listed here.
    others = [e for e in events if "fault" not in e]
    if others:
        lines += ["", "Events:", ""] + [f"- {e.get('what')}" + (f" at {e['elapsed']:.1f} s" if e.get("elapsed")
                                                                   is not None else "") for e in others]
    lines += ["", "![loss](loss.png)", "", "![throughput](throughput.png)", ""]
    return "\n".join(lines)


def run(args) -> int:
    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir
    summary, progress, events = load(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = plot(out, progress, events)
    (out / "report.md").write_text(markdown(summary, events), encoding="utf-8")
    for p in [out / "report.md", *written]:
        print(f"wrote {p}")
    return 0
