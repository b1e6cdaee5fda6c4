"""Unit tests of bench/fault_matrix_report.py's pure parts: reading
progress.jsonl and summary.json into rows, the throughput dip, recovery, and
the table. No processes, no plots; about a second.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider bench/test_fault_matrix_report.py
"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("fault_matrix_report",
                                               Path(__file__).resolve().parent / "fault_matrix_report.py")
fm = importlib.util.module_from_spec(_spec)
sys.modules["fault_matrix_report"] = fm
_spec.loader.exec_module(fm)


def progress_lines(workers=3, until=6.0, every=0.1, per_record=40, stall=None, restart=None):
    """Records as the launcher writes them: each worker acknowledges
    `per_record` pushes every `every` seconds; none in the (stall] span; worker
    `restart[0]` starts again from 0 at restart[1]."""
    out = []
    acked = {w: 0 for w in range(workers)}
    t0 = {w: 0.0 for w in range(workers)}
    n = int(round(until / every))
    for i in range(1, n + 1):
        t = round(i * every, 3)
        for w in range(workers):
            if stall and stall[0] < t <= stall[1]:
                continue
            if restart and w == restart[0] and abs(t - restart[1]) < 1e-9:
                acked[w], t0[w] = 0, t - 0.05
            acked[w] += per_record
            out.append(json.dumps({"step": i * 10, "acked": acked[w], "t": round(t - t0[w], 3),
                                   "time": 1.7e9 + t, "elapsed": t, "worker": w}))
    return "\n".join(out) + "\n"


def test_parse_jsonl_skips_a_cut_last_line_only():
    assert fm.parse_jsonl('{"a": 1}\n\n{"b": 2}\n{"c": ') == [{"a": 1}, {"b": 2}]
    with pytest.raises(ValueError):
        fm.parse_jsonl('{"a": \n{"b": 2}\n')


def test_ack_increments_count_every_acknowledged_push_once():
    progress = fm.parse_jsonl(progress_lines(until=1.0))
    incs = fm.ack_increments(progress)
    assert len(incs) == 30
    assert sum(d for _, d in incs) == 3 * 10 * 40
    assert all(d == 40 for _, d in incs)
    assert [t for t, _ in incs] == sorted(t for t, _ in incs)


def test_a_restarted_worker_counts_from_zero_again():
    progress = fm.parse_jsonl(progress_lines(workers=1, until=1.0, restart=(0, 0.5)))
    incs = fm.ack_increments(progress)
    assert sum(d for _, d in incs) == 10 * 40  # the old process's 160 and the new one's 240
    # t going back alone also marks a new process
    records = [{"worker": 0, "acked": 40, "t": 1.0, "elapsed": 1.0},
               {"worker": 0, "acked": 80, "t": 2.0, "elapsed": 2.0},
               {"worker": 0, "acked": 100, "t": 0.5, "elapsed": 3.0}]
    assert [d for _, d in fm.ack_increments(records)] == [40, 40, 100]


def test_records_without_acked_are_ignored():
    records = [{"worker": 0, "step": 10, "loss": 0.5, "elapsed": 1.0}, {"worker": 0, "acked": 40, "elapsed": 1.1}]
    assert fm.ack_increments(records) == [(1.1, 40)]


def test_rate_and_dip():
    incs = fm.ack_increments(fm.parse_jsonl(progress_lines(until=6.0, stall=(2.0, 2.5))))
    # 3 workers x 40 pushes every 0.1 s = 1200 pushes/s
    assert fm.rate(incs, 1.0, 2.0) == pytest.approx(1200)
    d = fm.dip(incs, 2.0)
    assert d["before"] == pytest.approx(1200)  # (0.1, 2.0]: the first record is the base
    assert d["after"] == pytest.approx(1200 * 1.5 / 2)  # 0.5 s of 2 stalled
    assert d["dip_percent"] == pytest.approx(25.0)
    assert d["after_cut"] is False
    assert fm.lowest_rate(incs, 2.0) == pytest.approx(0.0)


def test_dip_window_is_cut_at_the_job_end():
    incs = fm.ack_increments(fm.parse_jsonl(progress_lines(until=3.0)))
    d = fm.dip(incs, 2.0)
    assert d["after_cut"] is True and d["after"] == pytest.approx(1200)
    assert fm.dip([], 2.0)["dip_percent"] is None


def test_recovery_seconds():
    incs = fm.ack_increments(fm.parse_jsonl(progress_lines(until=6.0, stall=(2.0, 3.0))))
    # records again from 3.1 s; the trailing 0.5 s carries 80% of 1200/s (4 records of 120) once it ends at 3.4 s
    assert fm.recovery_seconds(incs, 2.0, 1200) == pytest.approx(1.4, abs=0.051)
    healthy = fm.ack_increments(fm.parse_jsonl(progress_lines(until=6.0)))
    assert fm.recovery_seconds(healthy, 2.0, 1200) == 0.0
    never = fm.ack_increments(fm.parse_jsonl(progress_lines(until=6.0, stall=(2.0, 9.0))))
    assert fm.recovery_seconds(never, 2.0, 1200) is None
    assert fm.recovery_seconds(incs, 2.0, None) is None


def test_timeline_bins():
    xs, ys = fm.timeline([(0.05, 10), (0.15, 20), (0.35, 30)], 0.1)
    assert xs == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert ys == pytest.approx([100, 200, 0, 300])


def summary_with(*faults, status="ok"):
    return {"status": status, "reason": None, "wall_seconds": 9.123, "faults": list(faults)}


KILL = {"index": 0, "target": "server-1", "action": "kill", "trigger": "2 s after every process started",
        "fired": True, "seconds": 2.001, "elapsed": 2.0, "detection_seconds": 0.49, "failover_seconds": 0.493,
        "failover_seconds_last_worker": 0.5, "failover_epoch": 2, "recovered": True, "note": None}
VERDICT = {"issued": 100, "acknowledged": 98, "applied": 99, "rows": 64, "servers": ["a", "b"], "lost": 0,
           "duplicates": 0, "phantoms": 0, "values": 0, "replicas": 0, "ok": True}


def test_run_rows_from_summary_progress_and_verdict():
    progress = fm.parse_jsonl(progress_lines(until=6.0, stall=(2.0, 2.5)))
    row = fm.run_rows("e1e2-kill-server", 1, summary_with(KILL), progress, VERDICT)
    assert row["status"] == "ok" and row["wall_seconds"] == 9.12
    assert row["acked_total"] == 3 * 55 * 40
    assert row["audit"] == {"issued": 100, "acknowledged": 98, "applied": 99, "lost": 0, "duplicates": 0,
                            "phantoms": 0, "values": 0, "replicas": 0, "ok": True, "servers": 2,
                            "lost_to_restore": 0}
    (f,) = row["faults"]
    assert f["fault"] == "kill server-1 at 2 s"
    assert f["detection_seconds"] == 0.49 and f["failover_seconds"] == 0.493 and f["recovered"] is True
    assert f["dip_percent"] == pytest.approx(25.0)
    assert f["rate_before"] == pytest.approx(1200)


def test_a_fault_that_did_not_fire_and_a_missing_audit():
    skipped = {"index": 0, "target": "worker-1", "action": "restart", "trigger": "2 s after every process started",
               "fired": False, "elapsed": None, "detection_seconds": None, "recovered": None,
               "note": "the job ended before it was due"}
    row = fm.run_rows("e7-restart-worker", 1, summary_with(skipped, status="failed"),
                      fm.parse_jsonl(progress_lines(until=1.0)), None)
    assert row["audit"] is None
    assert row["faults"][0]["dip_percent"] is None and row["faults"][0]["recovery_seconds"] is None
    (t,) = fm.table_rows([row])
    assert t["ok_runs"] == 0 and t["audit"] is None and t["recovered"] == "0/1"
    assert "not run" in fm.markdown([t], {})


def test_pause_label():
    pause = dict(KILL, action="pause", duration_seconds=1.5)
    assert fm.fault_label(pause) == "pause server-1 1.5 s at 2 s"
    assert fm.fault_label(dict(KILL, trigger="worker-0 reported step 100")) == \
        "kill server-1 worker-0 reported step 100"


def test_table_medians_sums_and_goals():
    progress = fm.parse_jsonl(progress_lines(until=6.0, stall=(2.0, 2.5)))
    runs = [fm.run_rows("e1e2-kill-server", r, summary_with(dict(KILL, failover_seconds=s)), progress,
                        dict(VERDICT, duplicates=dup, ok=not dup))
            for r, (s, dup) in enumerate([(0.4, 0), (0.6, 0), (1.5, 1)], 1)]
    runs.append(fm.run_rows("baseline", 1, summary_with(), fm.parse_jsonl(progress_lines(until=3.0)), VERDICT))
    rows = fm.table_rows(runs)
    assert [r["scenario"] for r in rows] == ["baseline", "e1e2-kill-server"]
    base, kill = rows
    assert base["fault"] is None and base["job_rate"] == pytest.approx(1200)
    assert kill["failover_seconds"] == pytest.approx(0.6)  # the median of 3
    assert kill["audit"]["issued"] == 300 and kill["audit"]["duplicates"] == 1 and kill["audit"]["passed"] == 2
    md = fm.markdown(rows, {"e1e2-kill-server": "E1/E2"})
    lines = md.splitlines()
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| E1/E2 | kill server-1 at 2 s | 0.490 | 0.600 |" in md and "FAIL 2/3" in md
    g = fm.goals(rows, runs)
    assert g[0].startswith("- failover under 1 s: not met (slowest of 3 failovers 1.500 s")
    assert g[1] == "- zero acknowledged pushes lost: met (0 lost; 4 of 4 runs audited)"
    assert g[2].startswith("- zero duplicates: not met (1 duplicates")
    e9 = fm.run_rows("e9-restore", 1, summary_with(KILL), progress, dict(VERDICT, lost_to_restore=7))
    e9_rows = fm.table_rows(runs + [e9])
    assert "| 0 (+7 to the restore) |" in fm.markdown(e9_rows, {})
    assert fm.goals(e9_rows, runs + [e9])[1].startswith(
        "- zero acknowledged pushes lost: met (0 lost; 5 of 5 runs audited; besides, 7 acknowledged pushes lost by "
        "design to checkpoint restores")
    runs.append(fm.run_rows("baseline", 2, summary_with(status="failed"), [], None))
    assert fm.goals(fm.table_rows(runs), runs)[1] == \
        "- zero acknowledged pushes lost: not shown (0 lost; 4 of 5 runs audited)"


def test_main_writes_the_report(tmp_path):
    run = tmp_path / "runs" / "e1e2-kill-server-1"
    (run / "run").mkdir(parents=True)
    (run / "scenario.json").write_text(json.dumps({"scenario": "e1e2-kill-server", "title": "E1/E2: kill server-1",
                                                   "message_faults": None, "repeat": 1}))
    (run / "run" / "summary.json").write_text(json.dumps(summary_with(KILL)))
    (run / "run" / "progress.jsonl").write_text(progress_lines(until=6.0, stall=(2.0, 2.5)))
    (run / "run" / "events.jsonl").write_text(json.dumps({"elapsed": 2.0, "what": "fault 0: kill server-1",
                                                          "kind": "fault"}) + "\n")
    (run / "audit.json").write_text(json.dumps(VERDICT))
    assert fm.main([str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["table"][0]["detection_seconds"] == 0.49
    assert "E1/E2: kill server-1" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "fault_e1e2-kill-server.png").stat().st_size > 0
