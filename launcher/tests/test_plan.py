"""`tessera-launch plan`: the arithmetic on small hand-computed inputs, the
model file and --table parsing, and the command line (output, JSON, errors)."""

import json
from fractions import Fraction

import pytest

from conftest import LAUNCHER_DIR
from tessera_launch.cli import main
from tessera_launch.plan import (PlanError, PlanInputs, TableSpec, load_model, parse_table_flag, plan)

REPO = LAUNCHER_DIR.parent
EXAMPLE = REPO / "configs" / "models" / "plan_example.yaml"

# A dense table of 100 rows of 10 floats. Per worker and step:
#   push       100 x (8 + 10 x 4) = 4,800 B    pull keys 100 x 8 = 800 B
#   pull reply 100 x 10 x 4       = 4,000 B    forward   100 x (8 + 40) = 4,800 B
#   worker out = 5,600 B, worker in = 4,000 B; stored row 10 x 4 + 32 = 72 B
DENSE = TableSpec(name="mlp", kind="dense", rows=100, dim=10)


def inputs(*tables, **kwargs):
    kwargs.setdefault("workers", 4)
    kwargs.setdefault("bandwidth_gbps", 10.0)
    return PlanInputs(tables=tables, **kwargs)


# -- the arithmetic ---------------------------------------------------------


def test_dense_table_traffic_and_bandwidth_bound_is_the_worker_count():
    p = plan(inputs(DENSE, workers=4))
    t = p.tables[0]
    assert (t.push_bytes, t.pull_key_bytes, t.pull_reply_bytes, t.forward_bytes) == (4800, 800, 4000, 4800)
    assert (p.worker_out, p.worker_in) == (5600, 4000)
    assert (p.servers_in, p.servers_out) == (4 * 5600, 4 * 4000)
    # Without replication the servers move exactly W x a worker's bytes.
    assert p.servers_bandwidth == 4
    assert (t.row_bytes, p.state_bytes, p.servers_memory) == (72, 7200, 1)
    assert (p.servers, p.decided_by) == (4, ("bandwidth",))
    # 5,600 B at 10 Gbit/s = 1.25e9 B/s.
    assert p.step_seconds == pytest.approx(5600 / 1.25e9)
    assert p.server_step_seconds == pytest.approx(5600 / 1.25e9)


@pytest.mark.parametrize("workers", [1, 3, 7, 32])
def test_without_replication_the_bandwidth_bound_is_w(workers):
    assert plan(inputs(DENSE, workers=workers)).servers_bandwidth == workers


def test_replication_adds_the_forwarded_pushes():
    # R = 2: in = 4 x 5,600 + 1 x 4 x 4,800 = 41,600; out = 4 x 4,000 + 19,200 = 35,200
    # S_bw = ceil(41,600 / 5,600) = ceil(7.43) = 8
    p = plan(inputs(DENSE, workers=4, replication=2))
    assert (p.servers_in, p.servers_out) == (41600, 35200)
    assert p.servers_bandwidth == 8
    # R = 3: in = 22,400 + 2 x 19,200 = 60,800 -> ceil(10.86) = 11, a little under W x R
    p = plan(inputs(DENSE, workers=4, replication=3))
    assert p.servers_in == 60800
    assert p.servers_bandwidth == 11
    # Memory counts every copy: 3 x 7,200 B.
    assert p.state_bytes * 3 == 21600


def test_sparse_table_moves_rows_per_step():
    # 50 of 1,000 rows of 8: push 50 x (8 + 32) = 2,000, keys 400, reply 1,600
    sparse = TableSpec(name="emb", kind="sparse", rows=1000, dim=8, rows_per_step=50, optimizer="adagrad")
    p = plan(inputs(sparse, workers=3))
    t = p.tables[0]
    assert (t.push_bytes, t.pull_key_bytes, t.pull_reply_bytes) == (2000, 400, 1600)
    assert (p.worker_out, p.worker_in, p.servers_in) == (2400, 1600, 7200)
    assert p.servers_bandwidth == 3
    # Stored: every row, not rows_per_step; adagrad keeps dim floats more.
    assert t.row_bytes == (8 + 8) * 4 + 32
    assert p.state_bytes == 1000 * 96


def test_tables_add_up():
    sparse = TableSpec(name="emb", kind="sparse", rows=1000, dim=8, rows_per_step=50)
    p = plan(inputs(DENSE, sparse, workers=2))
    assert (p.worker_out, p.worker_in) == (5600 + 2400, 4000 + 1600)
    assert p.state_bytes == 7200 + 1000 * (8 * 4 + 32)


def test_compression_shrinks_pushed_values_only_and_forwards_stay_fp32():
    # C = 1/4: push 100 x (8 + 10) = 1,800; worker out 2,600, in 4,000 (now the busier side)
    p = plan(inputs(DENSE, workers=4, compression_ratio=Fraction(1, 4)))
    assert p.tables[0].push_bytes == 1800
    assert (p.worker_out, p.worker_in) == (2600, 4000)
    assert p.servers_bandwidth == 4  # ceil(16,000 / 4,000)
    # R = 2: the forward is decoded fp32, 4,800 B: out = 16,000 + 19,200 = 35,200 -> ceil(8.8) = 9
    p = plan(inputs(DENSE, workers=4, compression_ratio=Fraction(1, 4), replication=2))
    assert p.tables[0].forward_bytes == 4800
    assert (p.servers_in, p.servers_out) == (10400 + 19200, 35200)
    assert p.servers_bandwidth == 9


def test_optimizer_state_floats_follow_the_server():
    rows = {}
    for name in ("sgd", "accumulate", "momentum", "adagrad", "adam", "ftrl"):
        rows[name] = plan(inputs(TableSpec(name="t", kind="dense", rows=1, dim=10, optimizer=name))).tables[0]
    assert {n: t.optimizer_floats for n, t in rows.items()} == {
        "sgd": 0, "accumulate": 0, "momentum": 10, "adagrad": 10, "adam": 21, "ftrl": 20}
    assert rows["adam"].row_bytes == (10 + 21) * 4 + 32


def test_memory_bound_decides_when_memory_is_small():
    # 1,000,000 rows x ((100 + 201 adam) x 4 + 32) B = 1,236,000,000 B;
    # usable 0.5 GiB x 0.7 = 375,809,638.4 B -> ceil(3.29) = 4 servers, one worker's traffic needs 1.
    big = TableSpec(name="big", kind="dense", rows=1_000_000, dim=100, optimizer="adam")
    p = plan(inputs(big, workers=1, memory_gib=Fraction(1, 2)))
    assert p.state_bytes == 1_236_000_000
    assert p.usable_bytes_per_server == Fraction(1, 2) * (1 << 30) * Fraction(7, 10)
    assert (p.servers_bandwidth, p.servers_memory) == (1, 4)
    assert (p.servers, p.decided_by) == (4, ("memory",))
    # Replication doubles it: ceil(6.58) = 7; a larger usable fraction lowers it.
    assert plan(inputs(big, workers=1, memory_gib=Fraction(1, 2), replication=2)).servers_memory == 7
    assert plan(inputs(big, workers=1, memory_gib=Fraction(1, 2), memory_fraction=Fraction(1))).servers_memory == 3
    # Each server's link is then less busy than a worker's.
    assert p.server_step_seconds < p.step_seconds


def test_replication_raises_servers_to_at_least_r():
    # 100 rows of 1, one worker, R = 10: worker out 100 x 20 = 2,000 B, forward 100 x 12 = 1,200 B;
    # in = 2,000 + 9 x 1,200 = 12,800 -> S_bw = ceil(6.4) = 7, below R.
    narrow = TableSpec(name="w", kind="dense", rows=100, dim=1)
    p = plan(inputs(narrow, workers=1, replication=10))
    assert p.servers_bandwidth == 7
    assert p.servers_memory == 1
    assert (p.servers, p.decided_by) == (10, ("replication",))
    assert p.vshards == 256  # 16 x 10 = 160 -> 256


def test_ties_name_every_bound():
    p = plan(inputs(DENSE, workers=1, replication=2))  # in = 5,600 + 4,800 -> ceil(1.86) = 2
    assert (p.servers, p.decided_by) == (2, ("bandwidth", "replication"))


@pytest.mark.parametrize("workers, vshards, lo, hi", [
    (1, 64, 64, 64),     # the minimum
    (3, 64, 21, 22),     # 48 -> 64; 21 or 22 per server
    (4, 64, 16, 16),     # 64 exactly
    (5, 128, 25, 26),    # 80 -> 128
    (8, 128, 16, 16),
    (9, 256, 28, 29),    # 144 -> 256
    (100, 2048, 20, 21),  # 1,600 -> 2,048
])
def test_vshards_is_the_smallest_power_of_two_of_at_least_64_and_16_per_server(workers, vshards, lo, hi):
    p = plan(inputs(DENSE, workers=workers))
    assert p.servers == workers
    assert p.vshards == vshards
    assert (p.shards_per_server_min, p.shards_per_server_max) == (lo, hi)
    assert p.shard_imbalance == pytest.approx(hi * workers / vshards)


def test_vshards_rule_holds_everywhere():
    for workers in range(1, 300):
        p = plan(inputs(DENSE, workers=workers))
        v = p.vshards
        assert v & (v - 1) == 0 and v >= 64 and v >= 16 * p.servers
        assert v == 64 or v // 2 < 16 * p.servers  # the smallest such
        assert p.shard_imbalance < 1 + 1 / 16


@pytest.mark.parametrize("kwargs, field", [
    (dict(workers=0), "workers"),
    (dict(replication=0), "replication"),
    (dict(bandwidth_gbps=0.0), "bandwidth_gbps"),
    (dict(memory_gib=Fraction(0)), "memory_gib"),
    (dict(compression_ratio=Fraction(3, 2)), "compression_ratio"),
    (dict(memory_fraction=Fraction(0)), "memory_fraction"),
])
def test_plan_refuses_bad_inputs(kwargs, field):
    with pytest.raises(PlanError, match=field):
        plan(inputs(DENSE, **kwargs))


def test_plan_refuses_bad_tables():
    with pytest.raises(PlanError, match="no tables"):
        plan(inputs())
    with pytest.raises(PlanError, match="given twice"):
        plan(inputs(DENSE, DENSE))
    with pytest.raises(PlanError, match="kind must be dense or sparse"):
        plan(inputs(TableSpec(name="t", kind="ragged", rows=1, dim=1)))
    with pytest.raises(PlanError, match="rows_per_step is required"):
        plan(inputs(TableSpec(name="t", kind="sparse", rows=10, dim=1)))


# -- reading tables ---------------------------------------------------------


def test_table_flag():
    assert parse_table_flag("mlp:dense:100:10") == DENSE
    assert parse_table_flag("emb:sparse:1000:8:50", "adam") == TableSpec(
        name="emb", kind="sparse", rows=1000, dim=8, rows_per_step=50, optimizer="adam")


@pytest.mark.parametrize("text, message", [
    ("mlp:dense:100", "expected NAME:KIND:ROWS:DIM"),
    ("mlp:tensor:100:10", "kind must be dense or sparse, got 'tensor'"),
    ("mlp:dense:0:10", "rows must be a positive integer, got 0"),
    ("mlp:dense:100:ten", "dim must be a positive integer, got 'ten'"),
    ("emb:sparse:1000:8", "rows_per_step is required"),
    ("emb:sparse:1000:8:2000", r"rows_per_step \(2000\) must not exceed rows \(1000\)"),
    ("mlp:dense:100:10:5", "rows_per_step is for sparse tables"),
])
def test_table_flag_errors(text, message):
    with pytest.raises(PlanError, match=message):
        parse_table_flag(text)


def test_the_example_model_loads():
    tables = load_model(EXAMPLE)
    assert [t.kind for t in tables] == ["dense", "sparse", "sparse"]
    assert all(t.rows_per_step <= t.rows for t in tables if t.kind == "sparse")


def test_model_file_optimizer_defaults(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("optimizer: adagrad\ntables:\n"
                    "  - {name: a, kind: dense, rows: 10, dim: 4}\n"
                    "  - {name: b, kind: dense, rows: 10, dim: 4, optimizer: adam}\n")
    assert [t.optimizer for t in load_model(path)] == ["adagrad", "adam"]
    # --optimizer wins over the file's default, not over a table's own.
    assert [t.optimizer for t in load_model(path, "sgd")] == ["sgd", "adam"]


@pytest.mark.parametrize("text, message", [
    ("tables: []\n", "m.yaml:1: tables must be a non-empty list"),
    ("models: 1\n", "m.yaml:1: unknown key 'models'"),
    ("tables:\n  - name: a\n    kind: dense\n    rows: 10\n", "m.yaml:2: tables\\[0\\] \\(a\\): dim is required"),
    ("tables:\n  - name: a\n    kind: sparse\n    rows: 10\n    dim: 4\n    rows_per_step: -1\n",
     "m.yaml:6: tables\\[0\\] \\(a\\): rows_per_step must be a positive integer, got -1"),
    ("tables:\n  - name: a\n    kind: dense\n    rows: 10\n    dim: 4\n    optimizer: lamb\n",
     "m.yaml:6: .*optimizer must be one of"),
    ("tables:\n  - name: a\n    kind: dense\n    rows: 10\n    dim: 4\n    dims: 4\n", "m.yaml:6: .*unknown key 'dims'"),
    ("tables:\n  - {name: a, kind: dense, rows: 1, dim: 1}\n  - {name: a, kind: dense, rows: 1, dim: 1}\n",
     "m.yaml:3: .*another table is named 'a'"),
    ("tables:\n  - {name: a, kind: dense, rows: 1, dim: 1, dim: 2}\n", "duplicate key"),
    ("tables:\n  - {name: a, kind: [dense], rows: 1, dim: 1}\n", "m.yaml:2: .*kind must be dense or sparse"),
    ("tables:\n  - {name: a, kind: dense, rows: 1, dim: 1, optimizer: [adam]}\n", "optimizer must be one of"),
    ("optimizer: lamb\ntables:\n  - {name: a, kind: dense, rows: 1, dim: 1}\n", "m.yaml:1: optimizer must be"),
    ("- 1\n", "a model file is a mapping"),
])
def test_model_file_errors_name_the_line_and_field(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(PlanError, match=message):
        load_model(path)


# -- the command line -------------------------------------------------------


def test_cli_prints_the_arithmetic_and_the_cluster_snippet(capsys):
    code = main(["plan", "--model", str(EXAMPLE), "--workers", "8", "--bandwidth-gbps", "25"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.endswith("cluster:\n  servers: 8\n  workers: 8\n  vshards: 128\n  replication: 1\n")
    assert "S_bw = ceil(max(servers in, servers out) / max(worker out, worker in))\n" in out
    assert "= ceil(8) = 8\n" in out  # without replication exactly W
    assert "S_mem = ceil(109 GiB / 44.8 GiB) = ceil(2.429) = 3\n" in out
    assert "= 8, decided by bandwidth" in out
    assert "V = 128" in out
    assert "push 2,400 x (8 + 1,024 x 4) B" in out


def test_cli_tables_from_flags_with_exact_numbers(capsys):
    code = main(["plan", "--table", "mlp:dense:100:10", "--workers", "4", "--bandwidth-gbps", "10"])
    out = capsys.readouterr().out
    assert code == 0
    assert "push 100 x (8 + 10 x 4) B = 4.69 KiB" in out  # 4,800 B
    assert "= ceil(21.9 KiB / 5.47 KiB) = ceil(4) = 4\n" in out  # 22,400 / 5,600 exactly
    assert "/ 10 Gbit/s = 4.48 us" in out  # 5,600 B / 1.25e9 B/s


def test_cli_json(capsys):
    code = main(["plan", "--table", "mlp:dense:100:10", "--table", "emb:sparse:1000:8:50", "--workers", "2",
                 "--bandwidth-gbps", "10", "--replication", "2", "--optimizer", "adagrad", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["worker_out_bytes"] == 8000 and result["worker_in_bytes"] == 5600
    # in = 2 x 8,000 + 1 x 2 x (4,800 + 2,000) = 29,600 -> ceil(3.7) = 4
    assert result["servers_in_bytes"] == 29600
    assert result["servers"] == 4 and result["decided_by"] == ["bandwidth"]
    assert result["cluster"] == {"servers": 4, "workers": 2, "vshards": 64, "replication": 2}
    assert [t["optimizer"] for t in result["tables"]] == ["adagrad", "adagrad"]


def test_cli_reads_workers_and_replication_from_a_job_config(capsys):
    code = main(["plan", "--table", "mlp:dense:100:10", "--config", str(REPO / "configs" / "dlrm.yaml"),
                 "--bandwidth-gbps", "10"])
    out = capsys.readouterr().out
    assert code == 0
    assert "The config" in out and "has servers 2, workers 2, vshards 64, replication 2" in out
    assert "  workers: 2\n" in out and "  replication: 2\n" in out
    # Flags win over the config.
    main(["plan", "--table", "mlp:dense:100:10", "--config", str(REPO / "configs" / "dlrm.yaml"),
          "--bandwidth-gbps", "10", "--workers", "3", "--replication", "1", "--json"])
    assert json.loads(capsys.readouterr().out)["cluster"]["workers"] == 3


@pytest.mark.parametrize("argv, message", [
    (["--table", "mlp:tensor:100:10", "--workers", "2", "--bandwidth-gbps", "1"], "kind must be dense or sparse"),
    (["--table", "e:sparse:10:4:0", "--workers", "2", "--bandwidth-gbps", "1"], "rows_per_step must be a positive"),
    (["--workers", "2", "--bandwidth-gbps", "1"], "no tables"),
    (["--table", "mlp:dense:100:10", "--bandwidth-gbps", "1"], "--workers is required"),
    (["--model", "/nonexistent/model.yaml", "--workers", "2", "--bandwidth-gbps", "1"], "no such file"),
])
def test_cli_bad_input_exits_2_naming_the_field(capsys, argv, message):
    assert main(["plan"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera-launch: error: ") and message in err


@pytest.mark.parametrize("argv, message", [
    (["--table", "mlp:dense:1:1", "--workers", "0", "--bandwidth-gbps", "1"], "argument --workers"),
    (["--table", "mlp:dense:1:1", "--workers", "2"], "--bandwidth-gbps"),
    (["--table", "mlp:dense:1:1", "--workers", "2", "--bandwidth-gbps", "fast"], "argument --bandwidth-gbps"),
    (["--table", "mlp:dense:1:1", "--workers", "2", "--bandwidth-gbps", "1", "--compression-ratio", "2"],
     "argument --compression-ratio"),
    (["--table", "mlp:dense:1:1", "--workers", "2", "--bandwidth-gbps", "1", "--optimizer", "lamb"],
     "argument --optimizer"),
])
def test_cli_bad_arguments_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["plan"] + argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_help_explains_the_inputs(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in ("--model", "--table", "rows_per_step", "--workers", "--bandwidth-gbps", "--memory-gib",
                 "--replication", "--compression-ratio", "exit status"):
        assert word in out
