"""Unit tests of bench/paired_report.py: placements found from the probes,
steady repeats, the pooled ratio per placement, unusable input. No processes;
well under a second.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider bench/test_paired_report.py
"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("paired_report", Path(__file__).resolve().parent / "paired_report.py")
pr = importlib.util.module_from_spec(_spec)
sys.modules["paired_report"] = pr
_spec.loader.exec_module(pr)


def test_placements_are_cut_where_sorted_probes_jump():
    groups = pr.placements([50, 52, 330, -1, 49, 340, 300, 55])
    assert [(lo, hi) for lo, hi, _ in groups] == [(49, 55), (300, 340)]
    assert groups[0][2] == pytest.approx(51)
    assert pr.placement_of(groups, 52) == 0
    assert pr.placement_of(groups, 320) == 1
    assert pr.placement_of(groups, 100) is None
    assert pr.placements([-1, 0]) == []


def test_a_repeat_counts_only_when_its_probes_agree():
    groups = pr.placements([50, 330])
    result = {"size": 1, "mode": "sequential", "mbps": [10, 20, 30, 40], "probe_ns": [50, 50, 330, 330, 50]}
    samples, dropped = pr.steady_samples(result, groups)
    assert samples == {0: [10], 1: [30]}
    assert dropped == 2


def test_ratios_compare_like_placements_only():
    # Raw is fast near (100) and slow far (20); Tessera is 0.9 of raw in
    # both, but ran mostly far. A pooled median would say 0.2.
    raw = [{"size": 1048576, "mode": "inflight8", "mbps": [100, 100, 20], "probe_ns": [50, 50, 50, 330], "round": 1},
           {"size": 1048576, "mode": "inflight8", "mbps": [20, 20], "probe_ns": [330, 330, 330], "round": 2}]
    tessera = [{"size": 1048576, "mode": "inflight8", "op": "push", "mbps": [18, 18, 90],
                "probe_ns": [330, 330, 50, 50], "round": 1},
               {"size": 1048576, "mode": "inflight8", "op": "push", "mbps": [18], "probe_ns": [330, 330], "round": 2}]
    rows, total, dropped, groups = pr.compare(raw, tessera)
    assert total == 9 and dropped == 2  # raw's third repeat of round 1, Tessera's second
    by_placement = {round(r["placement_ns"]): r for r in rows}
    assert by_placement[50]["ratio"] == pytest.approx(0.9)
    assert by_placement[50]["n_tessera"] == 1 and by_placement[50]["n_raw"] == 2
    assert by_placement[330]["ratio"] == pytest.approx(0.9)
    assert by_placement[330]["n_tessera"] == 2 and by_placement[330]["n_raw"] == 2
    table = pr.markdown(rows, total, dropped, groups)
    assert "| 1 MiB | 8 in flight | push | 50 ns | 1 / 2 | 90 | 100 | 0.90 |" in table
    assert "2 of 9 repeats were dropped" in table


def test_a_placement_only_one_side_saw_has_no_ratio():
    raw = [{"size": 4096, "mode": "sequential", "mbps": [10], "probe_ns": [50, 50], "round": 1}]
    tessera = [{"size": 4096, "mode": "sequential", "op": "pull", "mbps": [5], "probe_ns": [330, 330], "round": 1}]
    rows, *_ = pr.compare(raw, tessera)
    assert [(round(r["placement_ns"]), r["ratio"]) for r in rows] == [(50, None), (330, None)]


def test_unusable_input_is_named(tmp_path, capsys):
    assert pr.main(["paired_report.py", str(tmp_path), "1"]) == 2
    assert "raw-1.json is missing" in capsys.readouterr().err
    (tmp_path / "raw-1.json").write_text(json.dumps({"results": [{"size": 1, "mode": "sequential", "mbps": [1]}]}))
    (tmp_path / "tessera-1").mkdir()
    (tmp_path / "tessera-1" / "summary.json").write_text(json.dumps({"worker_reports": []}))
    assert pr.main(["paired_report.py", str(tmp_path), "1"]) == 2
    assert "no worker report" in capsys.readouterr().err
    (tmp_path / "tessera-1" / "summary.json").write_text(
        json.dumps({"worker_reports": [{"report": {"results": []}}]}))
    assert pr.main(["paired_report.py", str(tmp_path), "1"]) == 2
    assert "no probe_ns" in capsys.readouterr().err
    with pytest.raises(pr.Unusable, match="no probe ran"):
        pr.compare([{"size": 1, "mode": "sequential", "mbps": [1], "probe_ns": [-1, -1]}], [])


def test_a_whole_run_reads_back_from_its_files(tmp_path, capsys):
    (tmp_path / "raw-1.json").write_text(json.dumps(
        {"results": [{"size": 16777216, "mode": "sequential", "mbps": [4000], "probe_ns": [60, 61]}]}))
    (tmp_path / "tessera-1").mkdir()
    (tmp_path / "tessera-1" / "summary.json").write_text(json.dumps({"worker_reports": [{"report": {"results": [
        {"size": 16777216, "mode": "sequential", "op": "pullview", "mbps": [3800], "probe_ns": [59, 60]}]}}]}))
    assert pr.main(["paired_report.py", str(tmp_path), "1"]) == 0
    assert "| 16 MiB | sequential | pull, view | 60 ns | 1 / 1 | 3,800 | 4,000 | 0.95 |" in capsys.readouterr().out


def test_each_op_is_also_compared_with_the_baseline_doing_its_work(tmp_path, capsys):
    def raw(work, mbps):
        return {"size": 1048576, "mode": "inflight8", "mbps": [mbps], "probe_ns": [60, 60], "round": 1,
                "work": work}

    def tessera(op, mbps):
        return {"size": 1048576, "mode": "inflight8", "op": op, "mbps": [mbps], "probe_ns": [60, 60], "round": 1}

    raws = [raw("none", 6000), raw("accumulate", 5000), raw("copy", 4000)]
    rows, total, dropped, groups = pr.compare(raws, [tessera("push", 4500), tessera("pull", 3800),
                                                     tessera("pullview", 5700)])
    by_op = {r["op"]: r for r in rows}
    assert by_op["push"]["ratio"] == pytest.approx(0.75)
    assert by_op["push"]["work"] == "accumulate" and by_op["push"]["work_ratio"] == pytest.approx(0.9)
    assert by_op["pull"]["work"] == "copy" and by_op["pull"]["work_ratio"] == pytest.approx(0.95)
    assert by_op["pullview"]["work"] == "none" and by_op["pullview"]["work_ratio"] == pytest.approx(0.95)
    table = pr.markdown(rows, total, dropped, groups)
    assert "| 1 MiB | 8 in flight | pull | 60 ns | 1 / 1 | 3,800 | 6,000 | 0.63 | + copy | 1 | 4,000 | 0.67 | 0.95 |" \
        in table

    # From files: raw-copy-R.json is read beside raw-R.json; without the
    # work files the table keeps its plain columns.
    (tmp_path / "raw-1.json").write_text(json.dumps({"results": [dict(raws[0])]}))
    (tmp_path / "tessera-1").mkdir()
    (tmp_path / "tessera-1" / "summary.json").write_text(
        json.dumps({"worker_reports": [{"report": {"results": [tessera("pull", 3800)]}}]}))
    assert pr.main(["paired_report.py", str(tmp_path), "1"]) == 0
    assert "| 1 MiB | 8 in flight | pull | 60 ns | 1 / 1 | 3,800 | 6,000 | 0.63 |\n" in capsys.readouterr().out
    (tmp_path / "raw-copy-1.json").write_text(json.dumps({"results": [dict(raws[2])]}))
    assert pr.main(["paired_report.py", str(tmp_path), "1"]) == 0
    assert "| 0.63 | + copy | 1 | 4,000 | 0.67 | 0.95 |" in capsys.readouterr().out
