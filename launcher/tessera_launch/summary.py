"""The run summary: what a job did, in one JSON file and one printed block.

The coordinator's summary file is the source of truth for the job's verdict
and the per-worker numbers; the workers' TESSERA_RESULT lines fill in what it
lacks (and are all there is when the coordinator died). The supervisor's
Outcome says how the processes ended. `build_summary` combines the three into
the dict written as RUNDIR/summary.json (fields documented in
docs/launcher.md); `format_report` renders the block printed at the end.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Optional

from .processes import Outcome, describe_exit

#: Per-worker fields the coordinator reports at the top level of an entry;
#: everything else a worker reports lives under "report".
WORKER_TOP_FIELDS = ("steps", "final_loss", "bytes_pushed", "bytes_pulled")


def read_coordinator_summary(path: Path) -> tuple:
    """Returns (summary dict, None) or (None, why it is unusable)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "the coordinator wrote no summary file"
    except OSError as e:
        return None, f"the coordinator's summary file cannot be read: {e.strerror}"
    try:
        data = json.loads(text)
    except ValueError as e:
        return None, f"the coordinator's summary file is not valid JSON: {e}"
    if not isinstance(data, dict):
        return None, "the coordinator's summary file does not hold a JSON object"
    return data, None


def _number(value) -> Optional[float]:
    """The value as a finite float, or None if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _finite(value):
    """Replaces non-finite floats (NaN, inf) with None, recursively, so that
    the summary stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def merge_worker_reports(coordinator_workers, results_by_rank: dict) -> list:
    """Per-worker entries, sorted by rank: the coordinator's, with fields only
    a worker's TESSERA_RESULT line has filled in. A worker the coordinator
    does not list but that printed a result gets an entry marked
    "source": "worker". Coordinator values win where both have one."""
    entries: dict = {}
    for item in coordinator_workers if isinstance(coordinator_workers, list) else []:
        if isinstance(item, dict) and isinstance(item.get("rank"), int) and not isinstance(item.get("rank"), bool):
            entry = dict(item)
            entry["report"] = dict(item["report"]) if isinstance(item.get("report"), dict) else {}
            entries[item["rank"]] = entry
    for rank, result in results_by_rank.items():
        entry = entries.setdefault(rank, {"rank": rank, "source": "worker", "report": {}})
        for key, value in result.items():
            if key in WORKER_TOP_FIELDS:
                entry.setdefault(key, value)
            elif key != "rank":
                entry["report"].setdefault(key, value)
    return [entries[rank] for rank in sorted(entries)]


def _sum(entries, key) -> float:
    return sum(_number(e.get(key)) or 0 for e in entries)


def _mean(values) -> Optional[float]:
    numbers = [v for v in (_number(x) for x in values) if v is not None]
    return sum(numbers) / len(numbers) if numbers else None


def _verdict(outcome: Outcome, coordinator: Optional[dict], coordinator_error: Optional[str]) -> tuple:
    """(status, reason): ok only if every process ended well and the
    coordinator says ok; otherwise every reason known, most telling first."""
    coord_status = coordinator.get("status") if coordinator else None
    coord_reason = str(coordinator.get("reason") or "") if coordinator else ""
    if outcome.status == "completed" and coord_status == "ok":
        return "ok", coord_reason or "all workers finished"
    reasons = []
    if outcome.status != "completed":
        reasons.append(outcome.reason)
    if coordinator_error:
        reasons.append(coordinator_error)
    elif coord_status != "ok" and coord_reason:
        # The coordinator knows who is missing or lost: when it failed by
        # itself (was not stopped by the launcher), its diagnosis comes first.
        first = "coordinator" not in outcome.stopped and outcome.status == "failed"
        reasons.insert(0 if first else len(reasons), f"coordinator: {coord_reason}")
    elif coord_status not in ("ok", "failed"):
        reasons.append(f"the coordinator's summary has no valid status (got {coord_status!r})")
    return "failed", "; ".join(reasons) or "the coordinator reported failure"


def build_summary(*, job_name: str, run_dir: Path, config_source: str, worker_count: int,
                  server_count: int, outcome: Outcome, coordinator: Optional[dict],
                  coordinator_error: Optional[str], results_by_rank: dict, wall_seconds: float,
                  started_at: str, finished_at: str, skipped=(), warnings=()) -> dict:
    """The summary.json content. `results_by_rank` maps worker rank to its
    TESSERA_RESULT object; `coordinator` is the coordinator's summary (or
    None, with `coordinator_error` saying why)."""
    status, reason = _verdict(outcome, coordinator, coordinator_error)
    reports = merge_worker_reports((coordinator or {}).get("workers"), results_by_rank)
    auc_values = [e["report"].get("test_auc", e.get("test_auc")) for e in reports]
    warnings = list(warnings)
    if outcome.stragglers:
        warnings.append(f"stopped after the coordinator finished: {', '.join(outcome.stragglers)}")
    return _finite({
        "status": status,
        "reason": reason,
        "job": job_name,
        "config": config_source,
        "run_dir": str(run_dir),
        "workers": worker_count,
        "servers": server_count,
        "steps": int(_sum(reports, "steps")),
        "final_loss": _mean(e.get("final_loss") for e in reports),
        "test_auc": _mean(auc_values),
        "bytes_pushed": int(_sum(reports, "bytes_pushed")),
        "bytes_pulled": int(_sum(reports, "bytes_pulled")),
        "wall_seconds": round(wall_seconds, 3),
        "started_at": started_at,
        "finished_at": finished_at,
        "end": outcome.status,
        "first_failure": outcome.culprit,
        "processes": dict(outcome.exit_codes),
        "stopped": list(outcome.stopped),
        "skipped": list(skipped),
        "warnings": warnings,
        "worker_reports": reports,
        "server_addresses": (coordinator or {}).get("servers", []),
        "faults": [],  # run_job fills in the config's faults and what followed each (fault_logs.py)
    })


def write_text_atomically(path: Path, text: str) -> None:
    """Writes a temporary file next to `path`, then renames it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_summary(summary: dict, path: Path) -> None:
    """Writes summary.json atomically (temporary file, then rename)."""
    write_text_atomically(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")


def _bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _secs(value) -> str:
    return "-" if value is None else f"{value:.3f} s"


def describe_fault(fault: dict) -> str:
    """One line for a summary.json fault entry: what was done, when, and
    the figures that followed."""
    head = f"{fault.get('index')}: {fault.get('action')} {fault.get('target')}"
    if fault.get("seconds") is None:
        return f"{head}: skipped ({fault.get('skipped') or fault.get('note') or 'did not fire'})"
    parts = [f"{head} at {fault['seconds']:.3f} s", f"detected {_secs(fault.get('detection_seconds'))}"]
    if "failover_seconds" in fault:
        parts.append(f"failover {_secs(fault.get('failover_seconds'))}")
    if "rereplication_seconds" in fault:
        parts.append(f"re-replicated {_secs(fault.get('rereplication_seconds'))}")
    if "rejoin_seconds" in fault:
        parts.append(f"rejoin {_secs(fault.get('rejoin_seconds'))}")
    recovered = fault.get("recovered")
    parts.append("recovered" if recovered else "not recovered" if recovered is False else "recovery unknown")
    text = ", ".join(parts)
    return text + (f" ({fault['note']})" if fault.get("note") else "")


def format_report(summary: dict, tails: dict = None) -> list:
    """The final block: the summary's key numbers, and for a failed job the
    processes that did not exit 0 and the last lines of those named in
    `tails` (name -> lines)."""
    status = summary["status"]
    lines = [
        f"==== tessera job {summary['job']}: {status.upper()} ====",
        f"reason        {summary['reason']}",
        f"processes     {summary['servers']} servers, {summary['workers']} workers"
        + (f" (skipped: {', '.join(summary['skipped'])})" if summary["skipped"] else ""),
        f"steps         {summary['steps']}",
        f"final loss    {_fmt(summary['final_loss'], '.4g')}",
        f"test AUC      {_fmt(summary['test_auc'])}",
        f"pushed        {_bytes(summary['bytes_pushed'])}    pulled {_bytes(summary['bytes_pulled'])}",
        f"wall time     {summary['wall_seconds']:.1f} s",
        f"run dir       {summary['run_dir']}",
        f"summary       {Path(summary['run_dir']) / 'summary.json'}",
    ]
    lines += [f"warning       {w}" for w in summary["warnings"]]
    lines += [f"fault         {describe_fault(f)}" for f in summary.get("faults") or []]
    if status != "ok":
        stopped = summary["stopped"]
        bad = {n: c for n, c in summary["processes"].items() if c not in (0, None) and n not in stopped}
        if bad:
            lines.append("failed        " + ", ".join(f"{n} ({describe_exit(c)})" for n, c in bad.items()))
        if stopped:
            lines.append(f"stopped       {', '.join(stopped)} (by the launcher)")
        for name, tail in (tails or {}).items():
            if tail:
                lines.append(f"last lines of {name}:")
                lines += [f"  {line}" for line in tail]
    return lines
