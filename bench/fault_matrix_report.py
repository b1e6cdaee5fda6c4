#!/usr/bin/python3
"""Table and timelines of the fault-matrix experiment (bench/run_fault_matrix.sh).

    fault_matrix_report.py OUT [--docs-png PATH]

OUT/runs/ holds one directory per run, named SCENARIO-REPEAT, with:
  scenario.json  {"scenario", "title", "message_faults", "repeat"} (the script's)
  run/           the launcher's run directory: summary.json (its "faults" carry
                 the detection, failover and rejoin times the launcher read
                 from the logs, launcher/tessera_launch/fault_logs.py),
                 progress.jsonl (the audit workload's TESSERA_PROGRESS lines:
                 {"step", "acked", "t"} every 10 clocks, plus the launcher's
                 "elapsed" and "worker") and events.jsonl
  audit.json     tests/audit/audit_check.py's verdict (absent: it could not run)

Writes OUT/report.md (the table), OUT/report.json (every run's numbers),
OUT/fault_<scenario>.png (acknowledged pushes per second over time, first
repeat, the faults marked) and OUT/fault_matrix.png (every scenario, one
panel each), and prints the table.

Figures, per fault (seconds from the moment the launcher sent the signal):
  detection   the coordinator's `lost ...` line;
  failover    (servers) the first push a worker had acknowledged on the map
              that failed the server over;
  rejoin      (restarts) the coordinator's `... rejoined` line;
  dip         acknowledged pushes per second of all workers in the 2 s after
              the fault against the 2 s before it (the "before" window
              starts no earlier than the first progress record);
  recovery    the first moment, in steps of 50 ms, at which the last 0.5 s
              carried at least 80% of the before rate, once it had fallen
              below that (0: the first 0.5 s after the fault already did).
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path

WINDOW_SECONDS = 2.0        # the dip: this long before and after the fault
RECOVERY_WINDOW = 0.5       # recovery: trailing window
RECOVERY_FRACTION = 0.8     # ... carrying this share of the pre-fault rate
RECOVERY_STEP = 0.05
GOAL_FAILOVER_SECONDS = 1.0  # the issue's goals
SCENARIO_ORDER = ["baseline", "e1e2-kill-server", "e3-pause-server", "e5-message-faults", "e5-loss-1", "e5-loss-5",
                  "e5-loss-10", "e7-restart-worker", "server-restart", "e8-coordinator-failover", "e9-restore"]


# --------------------------------------------------------------------------
# Pure parts (tested by bench/test_fault_matrix_report.py)
# --------------------------------------------------------------------------


def parse_jsonl(text: str) -> list:
    """The JSON objects of a JSON-lines text; a last line cut short is skipped."""
    out = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if number != len(lines):
                raise
    return out


def ack_increments(progress: list) -> list:
    """[(elapsed, pushes acknowledged since the worker's previous record)],
    in time order, from progress records {"worker", "acked", "t", "elapsed"}.

    A worker's first record counts every push it acknowledged (from 0). A
    record whose `acked` or `t` is below the worker's previous one comes from
    a new process of that rank (a restart: its counters start at 0), and
    counts from 0 again."""
    last = {}  # worker -> (acked, t)
    out = []
    for r in sorted((r for r in progress if isinstance(r.get("acked"), (int, float))
                     and isinstance(r.get("elapsed"), (int, float)) and "worker" in r),
                    key=lambda r: r["elapsed"]):
        worker, acked, t = r["worker"], r["acked"], r.get("t")
        prev = last.get(worker)
        if prev is None or acked < prev[0] or (t is not None and prev[1] is not None and t < prev[1]):
            delta = acked
        else:
            delta = acked - prev[0]
        last[worker] = (acked, t)
        out.append((r["elapsed"], delta))
    return out


def rate(increments: list, start: float, end: float) -> float:
    """Acknowledged pushes per second in (start, end]."""
    if end <= start:
        return 0.0
    return sum(d for t, d in increments if start < t <= end) / (end - start)


def dip(increments: list, at: float, window: float = WINDOW_SECONDS) -> dict:
    """Throughput in the `window` seconds before `at` and after it.

    before: (max(at - window, first record), at]; after: (at, min(at +
    window, last record)] (`after_cut` when the job ended first). dip_percent:
    how much lower after is than before (negative: higher)."""
    if not increments:
        return {"before": None, "after": None, "dip_percent": None, "after_cut": False}
    first, last = increments[0][0], increments[-1][0]
    b0 = max(at - window, first)
    before = rate(increments, b0, at) if at > b0 else None
    a1 = min(at + window, last)
    after = rate(increments, at, a1) if a1 > at else None
    pct = None
    if before and after is not None:
        pct = round(100.0 * (1.0 - after / before), 1)
    return {"before": _round(before, 1), "after": _round(after, 1), "dip_percent": pct,
            "after_cut": a1 < at + window}


def recovery_seconds(increments: list, at: float, base: float, fraction: float = RECOVERY_FRACTION,
                     window: float = RECOVERY_WINDOW, step: float = RECOVERY_STEP):
    """Seconds from `at` to the first moment u (u >= at + window, in `step`s)
    at which the rate over (u - window, u] is at least fraction * base, once it
    has been below that; 0.0 when the first window already was; None when it
    never came back before the last record (or base is unknown)."""
    if not increments or not base:
        return None
    last = increments[-1][0]
    target = fraction * base
    u = at + window
    dipped = False
    i = 0
    while u <= last + 1e-9:
        if rate(increments, u - window, u) >= target:
            return round(u - at, 2) if dipped else 0.0
        dipped = True
        i += 1
        u = at + window + i * step
    return None


def lowest_rate(increments: list, at: float, window: float = RECOVERY_WINDOW, span: float = WINDOW_SECONDS,
                step: float = RECOVERY_STEP):
    """The lowest rate over a trailing `window` ending in [at + window, at +
    span] (steps of `step`, up to the last record): how deep the stall was."""
    if not increments:
        return None
    last = increments[-1][0]
    rates = []
    i = 0
    while at + window + i * step <= min(at + span, last) + 1e-9:
        u = at + window + i * step
        rates.append(rate(increments, u - window, u))
        i += 1
    return round(min(rates), 1) if rates else None


def timeline(increments: list, bin_seconds: float = 0.1) -> tuple:
    """(bin starts, pushes/s) over every bin from 0 to the last record."""
    if not increments:
        return [], []
    n = int(increments[-1][0] // bin_seconds) + 1
    bins = [0.0] * n
    for t, d in increments:
        bins[min(int(t // bin_seconds), n - 1)] += d
    return [i * bin_seconds for i in range(n)], [b / bin_seconds for b in bins]


def fault_label(fault: dict) -> str:
    """"kill server-1 at 2 s", "pause server-1 1.5 s at 2 s"."""
    extra = f" {fault['duration_seconds']:g} s" if fault.get("action") == "pause" and fault.get(
        "duration_seconds") else ""
    trigger = fault.get("trigger") or ""
    timed = re.match(r"^(\d+(?:\.\d+)?) s after every process started", trigger)
    when = f"at {float(timed[1]):g} s" if timed else trigger
    return f"{fault.get('action')} {fault.get('target')}{extra} {when}".strip()


def run_rows(scenario: str, repeat: int, summary: dict, progress: list, verdict) -> dict:
    """One run's numbers: the job, its audit verdict, and one entry per fault."""
    incs = ack_increments(progress)
    job_rate = rate(incs, incs[0][0], incs[-1][0]) if len(incs) > 1 else None
    faults = []
    for f in summary.get("faults") or []:
        entry = {"fault": fault_label(f), "target": f.get("target"), "action": f.get("action"),
                 "fired": bool(f.get("fired")), "elapsed": f.get("elapsed"),
                 "duration_seconds": f.get("duration_seconds")}
        for key in ("detection_seconds", "failover_seconds", "failover_seconds_last_worker", "rereplication_seconds",
                    "rejoin_seconds", "recovered", "note"):
            entry[key] = f.get(key)
        if f.get("elapsed") is not None:
            d = dip(incs, f["elapsed"])
            entry.update(rate_before=d["before"], rate_after=d["after"], dip_percent=d["dip_percent"],
                         after_cut=d["after_cut"],
                         lowest_rate=lowest_rate(incs, f["elapsed"]),
                         recovery_seconds=recovery_seconds(incs, f["elapsed"], d["before"]))
        else:
            entry.update(rate_before=None, rate_after=None, dip_percent=None, after_cut=False,
                         lowest_rate=None, recovery_seconds=None)
        faults.append(entry)
    audit = None
    if verdict is not None:
        audit = {k: verdict.get(k) for k in ("issued", "acknowledged", "applied", "lost", "duplicates", "phantoms",
                                             "values", "replicas", "ok")}
        audit["servers"] = len(verdict.get("servers") or [])
        # Acknowledged pushes a checkpoint restore lost by design (E9): not
        # violations, listed exactly in the run's audit.json.
        audit["lost_to_restore"] = verdict.get("lost_to_restore", 0)
    return {"scenario": scenario, "repeat": repeat, "status": summary.get("status"),
            "reason": summary.get("reason"), "wall_seconds": _round(summary.get("wall_seconds"), 2),
            "job_rate": _round(job_rate, 1), "acked_total": sum(d for _, d in incs), "audit": audit,
            "faults": faults}


def _round(v, digits):
    return None if v is None else round(v, digits)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table_rows(runs: list) -> list:
    """Rows of the table: per scenario and fault (by its place in the
    scenario's list), medians over repeats of the figures, the audit summed
    over repeats. A scenario without faults gets one row."""
    by_scenario = {}
    for r in runs:
        by_scenario.setdefault(r["scenario"], []).append(r)
    rows = []
    for scenario in sorted(by_scenario, key=lambda s: (SCENARIO_ORDER.index(s) if s in SCENARIO_ORDER else 99, s)):
        rs = sorted(by_scenario[scenario], key=lambda r: r["repeat"])
        audits = [r["audit"] for r in rs if r["audit"]]
        audit = None
        if audits:
            audit = {k: sum(a.get(k) or 0 for a in audits) for k in ("issued", "acknowledged", "applied", "lost",
                                                                       "duplicates", "phantoms", "values", "replicas",
                                                                       "lost_to_restore")}
            audit["passed"] = sum(1 for a in audits if a["ok"])
        common = {"scenario": scenario, "runs": len(rs), "ok_runs": sum(1 for r in rs if r["status"] == "ok"),
                  "audited_runs": len(audits), "audit": audit, "job_rate": _median(r["job_rate"] for r in rs)}
        nfaults = max(len(r["faults"]) for r in rs)
        if nfaults == 0:
            rows.append(dict(common, fault=None))
            continue
        for i in range(nfaults):
            fs = [r["faults"][i] for r in rs if len(r["faults"]) > i]
            row = dict(common, fault=fs[0]["fault"])
            for key in ("detection_seconds", "failover_seconds", "failover_seconds_last_worker",
                        "rereplication_seconds", "rejoin_seconds", "rate_before", "rate_after", "dip_percent",
                        "lowest_rate", "recovery_seconds"):
                row[key] = _median(f[key] for f in fs)
            row["recovered"] = f"{sum(1 for f in fs if f['recovered'])}/{len(fs)}"
            row["never_recovered_throughput"] = sum(1 for f in fs if f["fired"] and f["recovery_seconds"] is None)
            row["notes"] = sorted({f["note"] for f in fs if f.get("note")})
            rows.append(row)
    return rows


def _s(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def markdown(rows: list, titles: dict) -> str:
    base = next((r["job_rate"] for r in rows if r["scenario"] == "baseline" and r["job_rate"]), None)

    def job_rate(r):
        text = _s(r["job_rate"], ".0f")
        if base and r["job_rate"] is not None and r["scenario"] != "baseline":
            text += f" ({100 * r['job_rate'] / base:.0f}%)"
        return text

    header = ["scenario", "fault", "detection (s)", "failover (s)", "re-replicated (s)", "rejoin (s)",
              "pushes/s before -> after",
              "dip", "lowest 0.5 s (pushes/s)", "throughput back to 80% (s)", "recovered",
              "job pushes/s (of baseline)", "issued / acknowledged / applied", "lost", "duplicates",
              "replica mismatches", "audit"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        a = r["audit"]
        lost = "" if not a else f"{a['lost']}" + (
            f" (+{a['lost_to_restore']} to the restore)" if a.get("lost_to_restore") else "")
        audit_cells = (f"{a['issued']} / {a['acknowledged']} / {a['applied']} | {lost} | {a['duplicates']} | "
                       f"{a['replicas']} | {'PASS' if a['passed'] == r['runs'] else 'FAIL'} "
                       f"{a['passed']}/{r['runs']}") if a else "- | - | - | - | not run"
        status = "" if r["ok_runs"] == r["runs"] else f" (job ok {r['ok_runs']}/{r['runs']})"
        name = titles.get(r["scenario"], r["scenario"]) + status
        if r["fault"] is None:
            out.append(f"| {name} | - | - | - | - | - | - | - | - | - | - | {job_rate(r)} | {audit_cells} |")
            continue
        recovery = _s(r["recovery_seconds"], ".2f")
        if r["never_recovered_throughput"]:
            recovery += f" ({r['never_recovered_throughput']} run(s): never)"
        flow = (f"{_s(r['rate_before'], '.0f')} -> {_s(r['rate_after'], '.0f')}"
                if r["rate_before"] is not None else "-")
        dip_cell = "-" if r["dip_percent"] is None else f"{r['dip_percent']:.0f}%"
        out.append(f"| {name} | {r['fault']} | {_s(r['detection_seconds'])} | {_s(r['failover_seconds'])} | "
                   f"{_s(r.get('rereplication_seconds'))} | {_s(r['rejoin_seconds'])} | {flow} | {dip_cell} | "
                   f"{_s(r['lowest_rate'], '.0f')} | {recovery} | "
                   f"{r['recovered']} | {job_rate(r)} | {audit_cells} |")
    return "\n".join(out)


def goals(rows: list, runs: list) -> list:
    """Lines comparing the results with the issue's goals: the slowest
    failover of any run, the audit counts summed over every run."""
    failovers = [(r["scenario"], f["fault"], f["failover_seconds"]) for r in runs for f in r["faults"]
                 if f["failover_seconds"] is not None]
    # rows of one scenario share its audit: count each scenario once
    seen, lost, dups, replicas, restored = set(), 0, 0, 0, 0
    for r in rows:
        if r["audit"] and r["scenario"] not in seen:
            seen.add(r["scenario"])
            lost += r["audit"]["lost"]
            restored += r["audit"].get("lost_to_restore") or 0
            dups += r["audit"]["duplicates"]
            replicas += r["audit"]["replicas"]
    lines = []
    if failovers:
        worst = max(failovers, key=lambda x: x[2])
        lines.append(f"- failover under {GOAL_FAILOVER_SECONDS:g} s: "
                     f"{'met' if worst[2] < GOAL_FAILOVER_SECONDS else 'not met'} "
                     f"(slowest of {len(failovers)} failovers {worst[2]:.3f} s, {worst[0]}: {worst[1]})")
    audited = sum(1 for r in runs if r["audit"])
    scope = f"{audited} of {len(runs)} runs audited"

    def verdict(count):
        return "not met" if count else ("met" if audited == len(runs) else "not shown")

    restore = (f"; besides, {restored} acknowledged pushes lost by design to checkpoint restores when every copy "
               f"of a shard died, each listed in its run's audit.json" if restored else "")
    lines.append(f"- zero acknowledged pushes lost: {verdict(lost)} ({lost} lost; {scope}{restore})")
    lines.append(f"- zero duplicates: {verdict(dups)} ({dups} duplicates; {replicas} replica mismatches; {scope})")
    return lines


# --------------------------------------------------------------------------
# Reading OUT and drawing
# --------------------------------------------------------------------------


def read_run(path: Path):
    meta = json.loads((path / "scenario.json").read_text())
    run = path / "run"
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {
        "status": "failed", "reason": "no summary.json (the launcher did not finish)"}
    progress = parse_jsonl((run / "progress.jsonl").read_text()) if (run / "progress.jsonl").exists() else []
    events = parse_jsonl((run / "events.jsonl").read_text()) if (run / "events.jsonl").exists() else []
    verdict = json.loads((path / "audit.json").read_text()) if (path / "audit.json").exists() else None
    return meta, summary, progress, events, verdict


def record_interval(progress: list):
    """The median time between two progress records of one worker."""
    gaps = []
    last = {}
    for r in sorted((r for r in progress if "worker" in r and isinstance(r.get("elapsed"), (int, float))),
                    key=lambda r: r["elapsed"]):
        if r["worker"] in last:
            gaps.append(r["elapsed"] - last[r["worker"]])
        last[r["worker"]] = r["elapsed"]
    return statistics.median(gaps) if gaps else None


def draw(ax, meta: dict, run: dict, progress: list, events: list) -> None:
    incs = ack_increments(progress)
    # Bins and smoothing follow the records: 0.1 s and 0.5 s at full speed
    # (a record every ~40 ms per worker), wider for a slow job (E5).
    smooth_s = max(RECOVERY_WINDOW, 3 * (record_interval(progress) or 0))
    bin_s = max(0.1, smooth_s / 5)
    k = max(1, round(smooth_s / bin_s))
    xs, ys = timeline(incs, bin_s)
    ax.plot(xs, ys, color="tab:blue", alpha=0.35, linewidth=0.8, drawstyle="steps-post",
            label=f"per {bin_s:.2g} s")
    if ys:
        smooth = [sum(ys[max(0, i - k + 1):i + 1]) / k for i in range(len(ys))]
        ax.plot([x + bin_s for x in xs], smooth, color="tab:blue", linewidth=1.6,
                label=f"trailing {k * bin_s:.2g} s")
    for e in events:
        if e.get("elapsed") is None or e.get("kind") == "skipped":
            continue
        fault = e.get("kind") == "fault"
        ax.axvline(e["elapsed"], color="red" if fault else "grey", linestyle="--" if fault else ":", linewidth=1.2)
        ax.annotate(e.get("what", ""), (e["elapsed"], 0.98), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=7, color="red" if fault else "grey")
    for f in run["faults"]:
        t0 = f.get("elapsed")
        if t0 is None:
            continue
        for key, color in (("detection_seconds", "darkorange"), ("failover_seconds", "green"),
                           ("rejoin_seconds", "purple")):
            if f.get(key) is not None:
                ax.axvline(t0 + f[key], color=color, linestyle=":", linewidth=1,
                           label=key.replace("_seconds", ""))
        if f.get("action") == "pause" and f.get("duration_seconds"):
            ax.axvspan(t0, t0 + f["duration_seconds"], color="red", alpha=0.08, label="paused")
    a = run["audit"]
    verdict = (f"audit {'PASS' if a['ok'] else 'FAIL'}: {a['acknowledged']} acked, lost {a['lost']}, "
               f"dup {a['duplicates']}") if a else "audit not run"
    title = meta.get("title") or meta["scenario"]
    if meta.get("message_faults"):
        title += f" (TESSERA_FAULTS={meta['message_faults']})"
    ax.set_title(f"{title}\njob {run['status']}; {verdict}", fontsize=9)
    ax.set_xlabel("seconds since the launch")
    ax.set_ylabel("acknowledged pushes/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--docs-png", type=Path, help="also copy fault_matrix.png here")
    args = parser.parse_args(argv)
    out = args.out
    runs, drawn, titles = [], {}, {}
    for d in sorted(p for p in (out / "runs").iterdir() if (p / "scenario.json").exists()) \
            if (out / "runs").is_dir() else []:
        meta, summary, progress, events, verdict = read_run(d)
        row = run_rows(meta["scenario"], int(meta.get("repeat", 1)), summary, progress, verdict)
        row["title"] = meta.get("title")
        row["message_faults"] = meta.get("message_faults")
        row["dir"] = str(d)
        runs.append(row)
        titles[meta["scenario"]] = meta.get("title") or meta["scenario"]
        if meta["scenario"] not in drawn or row["repeat"] < drawn[meta["scenario"]][1]["repeat"]:
            drawn[meta["scenario"]] = (meta, row, progress, events)
    if not runs:
        print(f"fault_matrix_report: no runs in {out / 'runs'}", file=sys.stderr)
        return 1
    rows = table_rows(runs)
    table = markdown(rows, titles)
    goal_lines = goals(rows, runs)
    repeats = max(r["repeat"] for r in runs)
    text = "\n".join([
        "# Fault matrix", "",
        f"Audit workload (tests/audit/audit_job.yaml: 3 servers, replication 2, 3 workers, BSP), "
        f"{repeats} run(s) per scenario; figures are medians over runs, audit counts sums over runs. "
        "Times in seconds from the fault's signal; throughput is acknowledged pushes per second of all "
        f"workers, {WINDOW_SECONDS:g} s before vs after the fault.", "",
        table, "", "Goals (from the issue):", *goal_lines, ""])
    specs = sorted({(r["scenario"], r["message_faults"]) for r in runs if r.get("message_faults")})
    if specs:
        text += "\nMessage faults (every process, the whole job):\n" + "\n".join(
            f"- {titles.get(s, s)}: TESSERA_FAULTS={spec}" for s, spec in specs) + "\n"
    notes = sorted({(r["scenario"], n) for r in rows if r["fault"] for n in r.get("notes", [])})
    if notes:
        text += "\nNotes from the launcher:\n" + "\n".join(f"- {s}: {n}" for s, n in notes) + "\n"
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        text += "\nJobs that did not end ok:\n" + "\n".join(
            f"- {r['scenario']} repeat {r['repeat']}: {r['reason']}" for r in failed) + "\n"
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps({"table": rows, "runs": runs, "goals": goal_lines}, indent=1) + "\n")
    print(text)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    order = sorted(drawn, key=lambda s: (SCENARIO_ORDER.index(s) if s in SCENARIO_ORDER else 99, s))
    written = [out / "report.md", out / "report.json"]
    for scenario in order:
        meta, row, progress, events = drawn[scenario]
        fig, ax = plt.subplots(figsize=(8, 3.6))
        draw(ax, meta, row, progress, events)
        fig.tight_layout()
        path = out / f"fault_{scenario}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    fig, axes = plt.subplots(len(order), 1, figsize=(8, 2.9 * len(order)), squeeze=False)
    for ax, scenario in zip(axes[:, 0], order):
        meta, row, progress, events = drawn[scenario]
        draw(ax, meta, row, progress, events)
    fig.tight_layout()
    fig.savefig(out / "fault_matrix.png", dpi=90)
    written.append(out / "fault_matrix.png")
    if args.docs_png:
        args.docs_png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.docs_png, dpi=90)
        written.append(args.docs_png)
    plt.close(fig)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
