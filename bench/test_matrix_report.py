"""Unit tests of bench/matrix_report.py (the performance matrix of
bench/run_matrix.sh): ratios and spreads over rounds, goals applied to the
right cells, cells below a goal marked, missing cells shown, the parsing of
the drivers' output. Synthetic inputs only; no processes.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider bench/test_matrix_report.py
"""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("matrix_report", Path(__file__).resolve().parent / "matrix_report.py")
mr = importlib.util.module_from_spec(_spec)
sys.modules["matrix_report"] = mr
_spec.loader.exec_module(mr)

MIB = 1 << 20


def tessera(rnd, transport, op, mode, size, mbps, kind="dense", **extra):
    return {"round": rnd, "source": "tessera", "kind": kind, "transport": transport, "op": op, "mode": mode,
            "size": size, "mbps": mbps, **extra}


def raw(rnd, mode, size, mbps, kind="dense"):
    return {"round": rnd, "source": "raw", "kind": kind, "mode": mode, "size": size, "mbps": mbps}


def memcpy(rnd, size, mbps):
    return {"round": rnd, "source": "memcpy", "kind": "dense", "size": size, "mbps": mbps}


def meta(**kw):
    m = {"rounds": 3, "sizes": [MIB], "ops": ["push"], "modes": ["sequential"], "kinds": ["dense"],
         "transports": ["tcp"], "dims": [16, 64]}
    m.update(kw)
    return m


def row_of(rows, cell):
    found = [r for r in rows if r["cell"] == cell]
    assert len(found) == 1, cell
    return found[0]


def test_ratio_is_the_median_of_per_round_ratios_with_min_max_spread():
    # Tessera 100, 300, 200 against 200, 300, 100: round ratios 0.5, 1.0, 2.0 (their mean, 1.17, is not it).
    recs = [tessera(1, "tcp", "push", "sequential", MIB, 100), raw(1, "sequential", MIB, 200),
            tessera(2, "tcp", "push", "sequential", MIB, 300), raw(2, "sequential", MIB, 300),
            tessera(3, "tcp", "push", "sequential", MIB, 200), raw(3, "sequential", MIB, 100)]
    rows = mr.build_rows(meta(), recs)
    assert len(rows) == 1
    r = rows[0]
    assert r["ratio"]["raw"] == pytest.approx((1.0, 0.5, 2.0))
    assert r["mbps"] == pytest.approx((200, 100, 300))
    assert r["baseline_mbps"]["raw"] == pytest.approx((200, 100, 300))
    assert "1.00 (0.50–2.00)" in mr.markdown_table(rows)


def test_ratios_pair_runs_of_the_same_round_only():
    # Round 2 has no baseline: its Tessera value must not be divided by another round's.
    recs = [tessera(1, "tcp", "push", "sequential", MIB, 100), raw(1, "sequential", MIB, 100),
            tessera(2, "tcp", "push", "sequential", MIB, 900), raw(3, "sequential", MIB, 300),
            tessera(3, "tcp", "push", "sequential", MIB, 150)]
    r = mr.build_rows(meta(), recs)[0]
    assert r["ratio"]["raw"] == pytest.approx((0.75, 0.5, 1.0))


def test_below_goal_is_marked_and_met_goal_is_not():
    recs = []
    for rnd in (1, 2, 3):
        recs += [tessera(rnd, "tcp", "push", "sequential", MIB, 85), tessera(rnd, "tcp", "pull", "sequential", MIB, 95),
                 raw(rnd, "sequential", MIB, 100)]
    rows = mr.build_rows(meta(ops=["push", "pull"]), recs)
    push = row_of(rows, ("dense", "tcp", "push", "sequential", MIB))
    pull = row_of(rows, ("dense", "tcp", "pull", "sequential", MIB))
    assert any("below goal" in m for m in push["marks"])
    assert push["goals"] == [("raw", 0.9, "below")]
    assert not any("below goal" in m for m in pull["marks"])
    assert pull["goals"] == [("raw", 0.9, "met")]
    assert mr.below_goal(rows) == [push]
    table = mr.markdown_table(rows)
    push_line = [line for line in table.splitlines() if "| push |" in line][0]
    assert "below goal" in push_line and "0.85" in push_line


def test_missing_cell_is_shown_as_failed_not_dropped():
    # 64 MiB never ran (nor in any round): it keeps its row, marked.
    recs = [tessera(1, "tcp", "push", "sequential", MIB, 100), raw(1, "sequential", MIB, 100)]
    rows = mr.build_rows(meta(rounds=1, sizes=[MIB, 64 * MIB]), recs)
    assert [r["cell"][4] for r in rows] == [MIB, 64 * MIB]
    missing = rows[1]
    assert missing["mbps"] is None
    assert any("failed" in m for m in missing["marks"])
    assert missing in mr.below_goal(rows)
    line = mr.markdown_table(rows).splitlines()[-1]
    assert "64 MiB" in line and "failed" in line


def test_a_cell_run_in_fewer_rounds_says_so():
    recs = [tessera(1, "tcp", "push", "sequential", 4096, 10), raw(1, "sequential", 4096, 10)]
    r = mr.build_rows(meta(rounds=2, sizes=[4096]), recs)[0]
    assert "ran in 1 of 2 rounds" in r["marks"]


def test_expected_cells_skip_stream_pulls_and_cover_sparse_dims():
    cells = mr.expected_cells(meta(rounds=1, sizes=[4096], ops=["push", "pull", "pullview"],
                                   modes=["sequential", "stream"], kinds=["dense", "sparse"],
                                   transports=["tcp", "shm"]))
    dense = [c for c in cells if c[0] == "dense"]
    assert len(dense) == 2 * (3 + 1)
    assert ("dense", "tcp", "pull", "stream", 4096) not in cells
    assert ("dense", "shm", "push", "stream", 4096) in cells
    sparse = [c for c in cells if c[0] == "sparse"]
    assert sorted(sparse) == sorted((("sparse", t, op, mr.SPARSE_MODE, d) for t in ("tcp", "shm")
                                     for op in ("push", "pull") for d in (16, 64)))


@pytest.mark.parametrize("cell,goals", [
    (("dense", "tcp", "push", "sequential", 4096), []),
    (("dense", "tcp", "pull", "inflight8", 4096), [("raw_seq", 1.5)]),
    (("dense", "tcp", "push", "stream", MIB), [("raw", 0.9)]),
    (("dense", "tcp", "pullview", "inflight8", 16 * MIB), [("raw", 0.9)]),
    (("dense", "tcp", "push", "sequential", 256 << 10), []),
    (("dense", "tcp", "push", "sequential", 64 * MIB), []),
    (("dense", "shm", "push", "sequential", MIB), [("tcp", 1.0)]),
    (("dense", "shm", "pull", "inflight8", 16 * MIB), [("tcp", 1.0), ("memcpy", 1.0)]),
    (("dense", "shm", "pull", "sequential", 64 * MIB), [("tcp", 1.0)]),
    (("dense", "shm", "pullview", "sequential", 16 * MIB), [("tcp", 1.0)]),
    (("sparse", "tcp", "pull", mr.SPARSE_MODE, 16), [("raw", 0.6)]),
    (("sparse", "tcp", "push", mr.SPARSE_MODE, 64), [("raw", 0.6)]),
    (("sparse", "tcp", "push", mr.SPARSE_MODE, 32), []),
    (("sparse", "shm", "push", mr.SPARSE_MODE, 64), [("tcp", 1.0)]),
])
def test_goals_apply_to_the_right_cells(cell, goals):
    assert mr.goals_of(cell) == goals


def test_shm_is_compared_with_tcp_and_memcpy_of_the_same_round():
    size = 16 * MIB
    recs = [tessera(1, "tcp", "pull", "sequential", size, 1000), tessera(1, "shm", "pull", "sequential", size, 1500),
            memcpy(1, size, 3000), raw(1, "sequential", size, 1000),
            tessera(2, "tcp", "pull", "sequential", size, 2000), tessera(2, "shm", "pull", "sequential", size, 1000),
            memcpy(2, size, 2000), raw(2, "sequential", size, 1000)]
    rows = mr.build_rows(meta(rounds=2, sizes=[size], ops=["pull"], transports=["tcp", "shm"]), recs)
    shm = row_of(rows, ("dense", "shm", "pull", "sequential", size))
    assert shm["ratio"]["tcp"] == pytest.approx((1.0, 0.5, 1.5))
    assert shm["ratio"]["memcpy"] == pytest.approx((0.5, 0.5, 0.5))
    assert [g[2] for g in shm["goals"]] == ["met", "below"]  # × TCP median 1.0 meets 1.0; × memcpy 0.5 does not
    tcp = row_of(rows, ("dense", "tcp", "pull", "sequential", size))
    assert tcp["ratio"]["tcp"] is None and tcp["ratio"]["memcpy"] is None


def test_four_kib_in_flight_compares_with_raw_sequential():
    recs = [tessera(1, "tcp", "push", "inflight8", 4096, 30), raw(1, "inflight8", 4096, 40),
            raw(1, "sequential", 4096, 25)]
    r = mr.build_rows(meta(rounds=1, sizes=[4096], modes=["inflight8"]), recs)[0]
    assert r["ratio"]["raw"] == pytest.approx((0.75, 0.75, 0.75))
    assert r["ratio"]["raw_seq"] == pytest.approx((1.2, 1.2, 1.2))
    assert r["goals"] == [("raw_seq", 1.5, "below")]
    assert "× raw sequential ≥ 1.5: 1.20" in mr.markdown_table([r])


def test_sparse_cells_use_raw_at_their_message_size():
    recs = [tessera(1, "tcp", "push", mr.SPARSE_MODE, 16, 300, kind="sparse", msg_bytes=250000),
            tessera(1, "tcp", "push", mr.SPARSE_MODE, 64, 600, kind="sparse", msg_bytes=900000),
            raw(1, mr.SPARSE_RAW_MODE, 250000, 1000, kind="sparse"),
            raw(1, mr.SPARSE_RAW_MODE, 900000, 1000, kind="sparse"),
            raw(1, mr.SPARSE_RAW_MODE, 250000, 50, kind="dense")]  # a dense baseline: not this cell's
    m = meta(rounds=1, kinds=["sparse"], dims=[16, 64])
    m["ops"] = []
    rows = mr.build_rows(m, recs)
    d16 = row_of(rows, ("sparse", "tcp", "push", mr.SPARSE_MODE, 16))
    d64 = row_of(rows, ("sparse", "tcp", "push", mr.SPARSE_MODE, 64))
    assert d16["ratio"]["raw"] == pytest.approx((0.3, 0.3, 0.3))
    assert d16["goals"] == [("raw", 0.6, "below")]
    assert d64["goals"] == [("raw", 0.6, "met")]
    pull = row_of(rows, ("sparse", "tcp", "pull", mr.SPARSE_MODE, 16))
    assert any("failed" in m for m in pull["marks"])


def test_goal_without_its_baseline_is_marked_not_met():
    recs = [tessera(1, "tcp", "push", "sequential", MIB, 100)]
    r = mr.build_rows(meta(rounds=1), recs)[0]
    assert r["goals"] == [("raw", 0.9, "missing")]
    assert any("not measured" in m for m in r["marks"])


def test_parsing_the_drivers_output():
    dense = {"results": [{"size": 4096, "op": "pull", "mode": "inflight8", "median_mbps": 12.5, "mbps": [12.5],
                          "probe_ns": [1, 2]}]}
    assert mr.dense_records(dense, 2, "shm") == [
        {"round": 2, "source": "tessera", "kind": "dense", "transport": "shm", "op": "pull", "mode": "inflight8",
         "size": 4096, "mbps": 12.5, "probe_ns": [1, 2]}]
    sparse = {"results": [{"dim": 16, "op": "push", "payload_bytes_per_s": 2.5e9, "unique_per_batch": 3472.6}]}
    (rec,) = mr.sparse_records(sparse, 1, "tcp")
    assert rec["mbps"] == pytest.approx(2500.0)
    assert rec["size"] == 16 and rec["mode"] == mr.SPARSE_MODE
    assert rec["msg_bytes"] == int(3472.6 * 72) // 4 * 4
    # A run that failed part way: the results it printed before, from its log.
    log = ("[worker-0] noise\n"
           '[worker-0] TESSERA_PROGRESS {"step":8,"result":{"size":4096,"op":"push","mode":"sequential",'
           '"median_mbps":20.0,"mbps":[20.0],"probe_ns":[]}}\n'
           '[worker-0] TESSERA_PROGRESS {"step":9, "broken\n')
    assert [r["op"] for r in mr.progress_report(log, "dense")["results"]] == ["push"]
    assert mr.progress_report(log, "sparse")["results"] == []


def test_add_and_report_round_trip(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "worker-0.log").write_text(
        '[worker-0] TESSERA_PROGRESS {"step":1,"result":{"size":1048576,"op":"push","mode":"sequential",'
        '"median_mbps":950.0,"mbps":[950.0],"probe_ns":[]}}\n')
    rawf = tmp_path / "raw.json"
    rawf.write_text(json.dumps({"sizes": [MIB], "results": [{"size": MIB, "mode": "sequential", "median_mbps": 1000.0,
                                                             "mbps": [1000.0], "probe_ns": []}]}))
    results = tmp_path / "results.jsonl"
    assert mr.main(["add", str(results), "--round", "1", "--source", "tessera", "--kind", "dense",
                    "--transport", "tcp", str(run)]) == 0
    assert mr.main(["add", str(results), "--round", "1", "--source", "raw", str(rawf)]) == 0
    recs = mr.load_records(str(results))
    assert sum("failed" in r for r in recs) == 1  # no summary.json: the run did not finish
    metaf = tmp_path / "meta.json"
    metaf.write_text(json.dumps(meta(rounds=1, ops=["push", "pull"])))
    capsys.readouterr()
    assert mr.main(["report", str(metaf), str(results), "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "| dense | tcp | push | sequential | 1 MiB | 950 | 1,000 | 0.95 |" in out
    assert "| dense | tcp | pull | sequential | 1 MiB | – |" in out
    assert "Runs that failed" in out
    assert (tmp_path / "p.png").stat().st_size > 0
