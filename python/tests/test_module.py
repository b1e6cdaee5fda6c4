"""The tessera module against a real job on loopback: push/pull round trips
(NumPy and torch, flat and 2-D, dense and sparse tables), zero-copy pulls,
argument errors, deduplicated lookups, futures, flags, finish and the stdout
line protocol."""
import json

import numpy as np
import pytest

import tessera
from conftest import run_workers

try:
    import torch
except ImportError:  # the NumPy half of the module works without torch
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="no torch for /usr/bin/python3 (apt install python3-torch)")


def keys_of(*ids):
    return np.array(ids, dtype=np.uint64)


def test_worker_properties(worker):
    assert worker.rank == 0
    assert worker.num_workers == 1
    assert worker.num_servers == 2
    assert worker.incarnation == 0
    before = worker.current_clock
    worker.clock()
    assert worker.current_clock == before + 1


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("flat", [False, True])
def test_numpy_push_pull_round_trip(worker, table_id, kind, flat):
    n, width = 50, 3
    worker.create_table(table_id, width, kind=kind, dense_rows=n if kind == "dense" else 0, optimizer="accumulate")
    keys = np.arange(n, dtype=np.uint64)[::-1].copy()  # spread over both servers, not in order
    values = np.random.default_rng(1).standard_normal((n, width)).astype(np.float32)
    worker.push(table_id, keys, values.reshape(-1) if flat else values)
    got = worker.pull(table_id, keys)
    assert got.dtype == np.float32 and got.shape == (n, width)
    np.testing.assert_array_equal(got, values)  # accumulate onto zero rows: exact
    # Duplicate keys in a push are applied once per occurrence.
    worker.push(table_id, keys_of(7, 7), np.ones((2, width), np.float32))
    np.testing.assert_array_equal(worker.pull(table_id, keys_of(7))[0], values[n - 1 - 7] + 2)


def test_priority_is_a_keyword_of_push_and_pull(worker, table_id):
    width = 2
    worker.create_table(table_id, width, optimizer="accumulate")
    keys = keys_of(3, 1, 4, 1, 5)
    values = np.arange(len(keys) * width, dtype=np.float32).reshape(-1, width)
    futures = [worker.push_async(table_id, keys, values, priority=p) for p in (2, 0, 1)]
    for f in futures:
        f.wait()
    worker.push(table_id, keys_of(9), np.ones((1, width), np.float32), priority=-3)
    got = worker.pull_async(table_id, keys_of(3, 9), priority=5).wait()
    np.testing.assert_array_equal(got, [values[0] * 3, [1, 1]])
    np.testing.assert_array_equal(worker.pull(table_id, keys_of(1), priority=1)[0], (values[1] + values[3]) * 3)
    with pytest.raises(TypeError):
        worker.push(table_id, keys_of(9), np.ones((1, width), np.float32), 7)  # priority is keyword-only


def test_transfer_options_are_checked_before_connecting():
    for bad in ({"part_bytes": -1}, {"row_piece_bytes": -1}, {"max_bytes_in_flight_per_server": -1}):
        with pytest.raises(tessera.InvalidArgumentError,
                           match="part_bytes, row_piece_bytes and max_bytes_in_flight_per_server"):
            tessera.Worker.connect("tcp://127.0.0.1:1", **bad)


def test_a_table_with_a_disk_tier_keeps_every_row(worker, table_id):
    """A table whose memory holds 10 rows on each server (the bucket store's
    own memory is 1 MiB; a row of width 4 with ACCUMULATE and a budget counts
    72 bytes): 2,000 rows pushed three times each come back exact, though
    most of them sit on the servers' disks (docs/embeddings.md)."""
    width, n = 4, 2000
    worker.create_table(table_id, width, optimizer="accumulate", memory_budget_bytes=(1 << 20) + 10 * 72,
                        disk_tier=True)
    keys = np.arange(n, dtype=np.uint64) * 7919
    values = np.arange(n * width, dtype=np.float32).reshape(n, width)
    for _ in range(3):
        worker.push(table_id, keys, values)
    got = worker.pull(table_id, keys[::-1].copy())
    np.testing.assert_array_equal(got, 3 * values[::-1])


def test_a_disk_tier_needs_a_budget(worker, table_id):
    with pytest.raises(tessera.InvalidArgumentError, match="memory_budget_bytes"):
        worker.create_table(table_id, 4, disk_tier=True)


def test_sgd_table_applies_learning_rate(worker, table_id):
    worker.create_table(table_id, 2, optimizer="sgd", learning_rate=0.5, init="zeros")
    worker.push(table_id, keys_of(1, 2), np.array([[1, 2], [3, 4]], np.float32))
    np.testing.assert_allclose(worker.pull(table_id, keys_of(2, 1)), [[-1.5, -2], [-0.5, -1]])


@needs_torch
@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_torch_push_pull_round_trip(worker, table_id, kind):
    n, width = 20, 4
    worker.create_table(table_id, width, kind=kind, dense_rows=n if kind == "dense" else 0, optimizer="accumulate")
    keys = torch.randperm(n)  # int64 ids, reinterpreted as uint64 keys
    values = torch.randn(n, width)
    worker.push(table_id, keys, values)
    out = torch.full((n, width), -1.0)
    result = worker.pull(table_id, keys, out=out)
    assert result is out  # written in place, returned as given
    assert torch.equal(out, values)
    flat = torch.empty(n * width)
    worker.pull(table_id, keys, out=flat)
    assert torch.equal(flat.view(n, width), values)
    # A tensor that requires grad is read without a copy too (detached view).
    worker.push(table_id, keys, values.clone().requires_grad_(True).reshape(-1))
    assert torch.equal(torch.from_numpy(worker.pull(table_id, keys)), 2 * values)


@needs_torch
def test_pull_into_out_is_zero_copy(worker, table_id):
    worker.create_table(table_id, 8, optimizer="accumulate")
    keys = np.arange(100, dtype=np.uint64)
    worker.push(table_id, keys, np.ones((100, 8), np.float32))
    out = np.zeros((100, 8), np.float32)
    address = out.__array_interface__["data"][0]
    assert worker.pull(table_id, keys, out=out) is out
    assert out.__array_interface__["data"][0] == address
    assert (out == 1).all()
    future = worker.pull_async(table_id, keys, out=out.reshape(-1))
    flat = future.wait()
    assert np.shares_memory(flat, out)
    assert future.ready()
    tensor = torch.zeros(100, 8)
    worker.pull(table_id, keys, out=tensor)
    assert (tensor == 1).all()


def test_async_push_and_pull(worker, table_id):
    worker.create_table(table_id, 2, optimizer="accumulate")
    keys = keys_of(3, 4, 5)
    futures = [worker.push_async(table_id, keys, np.full((3, 2), i, np.float32)) for i in range(10)]
    for f in futures:
        assert f.wait() is None
        assert f.ready()
    # Dropped without waiting: the Future keeps the buffers until the request is done.
    worker.push_async(table_id, keys, np.full(6, 100, np.float32))
    pulled = worker.pull_async(table_id, keys).wait()
    np.testing.assert_array_equal(pulled, np.full((3, 2), 145, np.float32))  # 0+1+...+9 + 100
    assert worker.pull_async(table_id, keys).wait(timeout=30).shape == (3, 2)


@needs_torch
def test_pull_unique_and_push_aggregated(worker, table_id):
    width = 4
    worker.create_table(table_id, width, optimizer="accumulate")
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 20, size=500).astype(np.uint64)  # many duplicates
    grads = rng.integers(-8, 8, size=(500, width)).astype(np.float32)  # integers: exact sums
    before = worker.stats()["bytes_pushed"]
    worker.push_aggregated(table_id, keys, grads)
    distinct = np.unique(keys)
    assert worker.stats()["bytes_pushed"] - before == distinct.size * (8 + 4 * width)  # one row per key sent
    expected = np.zeros((20, width), np.float32)
    np.add.at(expected, keys.astype(np.int64), grads)
    np.testing.assert_array_equal(worker.pull(table_id, np.arange(20, dtype=np.uint64)), expected)
    before = worker.stats()["bytes_pulled"]
    rows = worker.pull_unique(table_id, keys)
    assert worker.stats()["bytes_pulled"] - before == distinct.size * (8 + 4 * width)
    np.testing.assert_array_equal(rows, expected[keys.astype(np.int64)])
    np.testing.assert_array_equal(rows, worker.pull(table_id, keys))
    out = torch.zeros(500, width)
    assert worker.pull_unique(table_id, torch.from_numpy(keys.astype(np.int64)), out=out) is out
    assert torch.equal(out, torch.from_numpy(rows))


def test_sparse_batch():
    batch = tessera.SparseBatch(np.array([9, 4, 9, 9, 1], np.uint64))
    assert batch.unique.tolist() == [9, 4, 1]
    assert batch.inverse.tolist() == [0, 1, 0, 0, 2]
    assert len(batch) == 5
    rows = np.array([[1, 1], [2, 2], [3, 3]], np.float32)
    np.testing.assert_array_equal(batch.gather(rows), rows[[0, 1, 0, 0, 2]])
    sums = batch.scatter_add(np.arange(10, dtype=np.float32).reshape(5, 2))
    np.testing.assert_array_equal(sums, [[0 + 4 + 6, 1 + 5 + 7], [2, 3], [8, 9]])
    with pytest.raises(ValueError, match="read-only"):
        batch.unique[0] = 1


@needs_torch
def test_bad_arguments_raise_value_errors(worker, table_id):
    worker.create_table(table_id, 4)
    keys = keys_of(1, 2, 3)
    good = np.zeros((3, 4), np.float32)
    cases = [
        (lambda: worker.push(table_id, keys.astype(np.float64), good), "keys must be uint64"),
        (lambda: worker.push(table_id, keys.astype(np.int32), good), "keys must be uint64"),
        (lambda: worker.push(table_id, keys.reshape(3, 1), good), "keys must be 1-D"),
        (lambda: worker.push(table_id, np.array([1, -2, 3]), good), "non-negative, got -2"),
        (lambda: worker.push(table_id, torch.tensor([1, -2, 3]), good), "non-negative"),
        (lambda: worker.push(table_id, keys, good.astype(np.float64)),
         r"float32 C-contiguous of shape \(n, width\) = \(3, 4\) or flat \(12,\).*got float64"),
        (lambda: worker.push(table_id, keys, np.zeros((3, 5), np.float32)), r"got float32 of shape \(3, 5\)"),
        (lambda: worker.push(table_id, keys, np.zeros(11, np.float32)), r"shape \(11,\)"),
        (lambda: worker.push(table_id, keys, np.zeros((3, 8), np.float32)[:, ::2]), "C-contiguous"),
        (lambda: worker.push(table_id, keys, torch.zeros(4, 3).t()), "contiguous tensor"),
        (lambda: worker.push(table_id, keys, torch.zeros(3, 4, dtype=torch.float64)), "got float64"),
        (lambda: worker.pull(table_id, keys, out=np.zeros((3, 4), np.float64)), "out must be float32"),
        (lambda: worker.pull(table_id, keys, out=np.zeros((4, 4), np.float32)), r"shape \(4, 4\)"),
        (lambda: worker.pull(table_id, keys, out=[0.0] * 12), "out must be a NumPy array"),
        (lambda: worker.create_table(table_id + 1, 4, optimiser="sgd"),
         "unknown table option 'optimiser'; valid options: .*optimizer"),
        (lambda: worker.create_table(table_id + 1, 4, optimizer="sgdd"), "must be one of 'sgd', 'accumulate'"),
        (lambda: worker.create_table(table_id + 1, 4, kind="sparse", consistency=3), "must be one of 'bsp'"),
        (lambda: worker.create_table(table_id + 1, 0), r"width must be in \[1, "),
        (lambda: worker.create_table(table_id + 1, 4, staleness=-1), "staleness must be in"),
        (lambda: worker.create_table(table_id + 1, 4, learning_rate="fast"), "learning_rate must be a number"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert isinstance(info.value, tessera.InvalidArgumentError)
        assert info.value.code == "INVALID_ARGUMENT"
    read_only = np.zeros((3, 4), np.float32)
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match="writable"):
        worker.pull(table_id, keys, out=read_only)


def test_request_errors_carry_the_status_message(worker, table_id):
    with pytest.raises(tessera.Error, match=f"table {table_id + 5} was not created") as info:
        worker.pull(table_id + 5, keys_of(1))
    assert info.value.code == "NOT_FOUND"
    worker.create_table(table_id, 4, kind="dense", dense_rows=10)
    with pytest.raises(tessera.Error) as info:  # the servers refuse a different width for the same id
        worker.create_table(table_id, 5, kind="dense", dense_rows=10)
    assert str(info.value)
    with pytest.raises(tessera.Error) as info:  # beyond the dense rows: the server's message
        worker.pull(table_id, keys_of(10))
    assert "10" in str(info.value)


def test_stats_is_a_dict(worker):
    stats = worker.stats()
    for key in ("pushes", "pulls", "bytes_pushed", "bytes_pulled", "clocks", "staleness_histogram"):
        assert key in stats
    assert len(stats["staleness_histogram"]) == 17
    assert worker.transport_stats()["messages_sent"] > 0


def test_table_option_defaults_follow_the_header():
    d = tessera.TABLE_OPTION_DEFAULTS
    assert d["kind"] == "sparse" and d["optimizer"] == "sgd" and d["consistency"] == "bsp"
    assert d["learning_rate"] == 0.01 and d["init"] == "zeros"


@needs_torch
def test_emit_lines(capsys):
    tessera.emit_progress({"epoch": 1, "step": np.int64(20), "loss": np.float32(0.5), "bad": float("nan")})
    tessera.emit_result({"steps": 20, "final_loss": torch.tensor(0.25), "hist": np.arange(3)})
    lines = capsys.readouterr().out.splitlines()
    tag, payload = lines[0].split(" ", 1)
    assert tag == "TESSERA_PROGRESS"
    assert json.loads(payload) == {"epoch": 1, "step": 20, "loss": 0.5, "bad": None}
    tag, payload = lines[1].split(" ", 1)
    assert tag == "TESSERA_RESULT"
    assert json.loads(payload) == {"steps": 20, "final_loss": 0.25, "hist": [0, 1, 2]}


def test_from_args_takes_the_launcher_flags_and_finish_reports(make_job):
    job = make_job(servers=1, workers=1)
    worker, rest = tessera.Worker.from_args(
        ["--coordinator", job.address, "--epochs", "3", "--rank", "0", "--name", "worker-0",
         "--request_timeout_seconds", "20", "--lr=0.5", "--connect-timeout-seconds", "30", "data.txt"])
    assert rest == ["--epochs", "3", "--lr=0.5", "data.txt"]
    with worker:
        assert worker.rank == 0
        worker.finish(12, 0.125, {"test_auc": 0.75})
    assert job.wait_coordinator() == 0
    summary = job.summary()
    assert summary["status"] == "ok"
    (report,) = summary["workers"]
    assert report["steps"] == 12 and report["final_loss"] == 0.125 and report["report"] == {"test_auc": 0.75}
    with pytest.raises(tessera.Error, match="closed"):
        worker.pull(1, keys_of(1))


def test_from_args_needs_the_coordinator():
    with pytest.raises(ValueError, match="coordinator"):
        tessera.Worker.from_args(["--rank", "0", "--epochs", "3"])
    with pytest.raises(ValueError, match="rank"):
        tessera.Worker.from_args(["--coordinator", "tcp://127.0.0.1:1", "--rank", "zero"])


def test_from_args_takes_the_transport_flags_and_names_a_bad_one(tmp_path):
    """The transport flags the launcher passes every worker program
    (transport/transport_flags.h) are from_args's too: consumed, checked
    before anything connects, a bad value named with its flag."""
    with pytest.raises(ValueError, match="--shm_ring_bytes"):
        tessera.Worker.from_args(["--coordinator", "tcp://127.0.0.1:1", "--shm_ring_bytes", "3000000", "--epochs", "3"])
    with pytest.raises(ValueError, match="--coalesce"):
        tessera.Worker.from_args(["--coordinator", "tcp://127.0.0.1:1", "--coalesce", "maybe"])
    # A job key file that does not exist stops the worker naming the flag (nothing listens at port 1).
    with pytest.raises(tessera.Error, match="--job_keys"):
        tessera.Worker.from_args(["--coordinator", "tcp://127.0.0.1:1", "--connect_timeout_seconds", "0.5",
                                  "--job_keys", str(tmp_path / "none.keys")])
    with pytest.raises(tessera.Error, match="--job_keys"):
        tessera.Worker.connect("tcp://127.0.0.1:1", connect_timeout=0.5, job_keys=str(tmp_path / "none.keys"))


def test_connect_to_nobody_times_out():
    with pytest.raises(tessera.Error, match="127.0.0.1:9"):
        tessera.Worker.connect("tcp://127.0.0.1:9", connect_timeout=0.5)


def test_two_workers_see_each_others_pushes_after_clock(make_job):
    job = make_job(servers=2, workers=2)

    def body(w):
        w.create_table(1, 2, optimizer="accumulate")  # BSP
        keys = np.arange(10, dtype=np.uint64)
        w.push(1, keys, np.full((10, 2), w.rank + 1, np.float32))
        w.clock()
        w.barrier("pushed")
        return w.pull(1, keys)

    for rows in run_workers(job, 2, body):
        np.testing.assert_array_equal(rows, np.full((10, 2), 3, np.float32))


def test_optimizer_hyper_parameters_reach_the_server(worker, table_id):
    # MOMENTUM (server/optimizer.h): v = momentum * v + g; w -= lr * v.
    worker.create_table(table_id, 2, optimizer="momentum", learning_rate=1.0, momentum=0.5)
    keys = keys_of(1)
    for _ in range(2):
        worker.push(table_id, keys, np.ones(2, np.float32))
    np.testing.assert_allclose(worker.pull(table_id, keys), [[-2.5, -2.5]])  # -1, then -(0.5 + 1)
    with pytest.raises(ValueError, match="momentum must be a number"):
        worker.create_table(table_id + 1, 2, optimizer="momentum", momentum="high")
    assert tessera.TABLE_OPTION_DEFAULTS["beta2"] == 0.999
