"""Pipelined training (tessera.torch.Prefetcher) on real local jobs: with
staleness 0 it is the plain loop bit for bit; with staleness 1 a step's rows
miss exactly this worker's last push, never more. Also the asynchronous
deduplicated pull and aggregated push of tessera.Worker. Tests that check
which pushes a pull reflects connect with NO_RESENDS: a pull sent again
reads later (fresher) rows, and a loaded machine makes resends."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="no torch for /usr/bin/python3 (apt install python3-torch)")
import tessera.torch as tt  # noqa: E402
from torch import nn  # noqa: E402
from conftest import NO_RESENDS, run_workers  # noqa: E402

STEPS, BATCH, IDS = 12, 16, 40


def make_batches(seed):
    """(dense, ids, labels) batches; ids from a small range, so consecutive
    batches share rows (staleness shows), with repeats inside a batch."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        dense = torch.randn(BATCH, 3, generator=g)
        ids = torch.randint(0, IDS, (BATCH, 2), generator=g)
        labels = (torch.rand(BATCH, generator=g) < 0.3).float()
        out.append((dense, ids, labels))
    return out


def train(w, batches, staleness):
    """A small DLRM-like model: two server-side tables (Adam embeddings, Adagrad
    wide weights), a dense tower through DenseDataParallel. staleness None:
    the plain loop. Returns the losses, the final rows and dense weights."""
    emb = tt.EmbeddingBag(w, 1, embedding_dim=4, mode="sum", optimizer="adam", learning_rate=0.05,
                          init="uniform", init_scale=0.3, init_seed=5)
    wide = tt.EmbeddingBag(w, 2, embedding_dim=1, mode="sum", optimizer="adagrad", learning_rate=0.1,
                           initial_accumulator=1e-3)
    g = torch.Generator().manual_seed(3)
    tower = nn.Sequential(nn.Linear(3 + 2 * 4, 5), nn.ReLU(), nn.Linear(5, 1))
    with torch.no_grad():
        for p in tower.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    model = tt.DenseDataParallel(w, tower, 10, optimizer="adam", learning_rate=0.01)
    loader = batches if staleness is None else tt.Prefetcher(
        batches, [(emb, lambda b: b[1]), (wide, lambda b: b[1])], staleness=staleness)
    losses = []
    for step, (dense, ids, labels) in enumerate(loader):
        embedded = emb(ids.reshape(-1, 1)).view(BATCH, -1)
        logit = model(torch.cat([dense, embedded], dim=1)).squeeze(1) + wide(ids).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logit, labels)
        model.zero_grad()
        loss.backward()
        model.step()
        losses.append(loss.item())
        if step == STEPS // 2:  # an evaluation in between: other ids, no prefetch of theirs
            with torch.no_grad():
                emb(torch.arange(IDS, IDS + 5).reshape(-1, 1))
    emb.flush()
    wide.flush()
    everything = torch.arange(IDS)
    return losses, emb.rows(everything), wide.rows(everything), [p.detach().clone() for p in tower.parameters()]


def test_staleness_0_is_the_plain_loop_bit_for_bit(make_job):
    batches = make_batches(seed=1)
    results = {}
    for mode in (None, 0, 1):  # a fresh job each, so the tables start alike
        job = make_job(servers=2, workers=1)
        results[mode] = run_workers(job, 1, lambda w, mode=mode: train(w, batches, mode))[0]
    plain, pipelined, stale = results[None], results[0], results[1]
    assert plain[0] == pipelined[0], "losses differ"
    assert torch.equal(plain[1], pipelined[1]), (plain[1] - pipelined[1]).abs().max()
    assert torch.equal(plain[2], pipelined[2]), (plain[2] - pipelined[2]).abs().max()
    for a, b in zip(plain[3], pipelined[3]):
        assert torch.equal(a, b)
    # The comparison can fail: one step of staleness changes the result.
    assert plain[0][0] == stale[0][0]  # step 0 sees the initial rows either way
    assert plain[0] != stale[0]
    assert not torch.equal(plain[1], stale[1])


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_step_misses_at_most_the_stated_pushes(make_job, staleness):
    """ACCUMULATE rows (row += pushed gradient) and loss = sum of the
    outputs: each push adds to every row the count of its id in the batch,
    so the value a step reads says exactly which pushes it reflects."""
    run_workers(make_job(servers=2, workers=1), 1, lambda w: check_one_worker(w, staleness), flags=NO_RESENDS)


def check_one_worker(worker, staleness):
    table_id = 1
    emb = tt.EmbeddingBag(worker, table_id, embedding_dim=1, mode="sum", optimizer="accumulate")
    g = torch.Generator().manual_seed(7)
    batches = []
    for _ in range(STEPS):
        ids = torch.randint(0, 6, (BATCH, 1), generator=g)
        ids[0, 0] = 0  # id 0 in every batch
        batches.append(ids)
    counts = [torch.bincount(b.reshape(-1), minlength=6).float() for b in batches]
    applied = [torch.zeros(6)]  # applied[t]: every row after the pushes of steps < t
    for c in counts:
        applied.append(applied[-1] + c)
    seen_lag = []
    for t, ids in enumerate(tt.Prefetcher(batches, [(emb, lambda b: b)], staleness=staleness)):
        out = emb(ids)  # (BATCH, 1): each position's row
        if t == 4:  # a lookup of other ids in between changes nothing
            with torch.no_grad():
                emb(torch.tensor([[100], [101]]))
        expected = applied[max(t - staleness, 0)]  # staleness 1: the pushes of steps < t - 1
        seen = out.detach().reshape(-1)
        assert torch.equal(seen, expected[ids.reshape(-1)]), (t, seen, expected[ids.reshape(-1)])
        # In pushes: the newest push a row misses is step t - 1's, never an older one.
        lag = [int((applied[t][i] - seen[p]) / counts[t - 1][i]) if t and seen[p] != applied[t][i] else 0
               for p, i in enumerate(ids.reshape(-1).tolist())]
        assert max(lag) <= staleness
        seen_lag.append(max(lag))
        out.sum().backward()
    emb.flush()
    assert torch.equal(emb.rows(torch.arange(6)).reshape(-1), applied[-1])
    # Staleness 1 is real (the pulls did overlap the previous step), 0 never.
    assert seen_lag[1:] == [staleness] * (STEPS - 1)


def test_prefetcher_refuses_bad_arguments(worker, table_id):
    emb = tt.EmbeddingBag(worker, table_id, embedding_dim=2)
    same_table = tt.EmbeddingBag(worker, table_id, embedding_dim=2)
    with pytest.raises(ValueError, match="staleness must be 0 or 1"):
        tt.Prefetcher([], [(emb, lambda b: b)], staleness=2)
    with pytest.raises(ValueError, match="its own table"):
        tt.Prefetcher([], [(emb, lambda b: b), (same_table, lambda b: b)])
    with pytest.raises(TypeError, match="pairs"):
        tt.Prefetcher([], [emb])
    assert list(tt.Prefetcher([], [(emb, lambda b: b)])) == []


def test_async_deduplicated_pull_and_aggregated_push(worker, table_id):
    worker.create_table(table_id, 2, optimizer="accumulate")
    keys = np.array([3, 9, 3, 3, 2**63 + 1], dtype=np.uint64)
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    pushes = worker.stats()["pushes"]
    f = worker.push_aggregated_async(table_id, keys, values)
    values[:] = 1e6  # the sums were made in the call: changing them now changes nothing
    assert f.wait() is None
    assert worker.stats()["pushes"] == pushes + 1
    pulled = worker.pull_unique_async(table_id, keys).wait()
    sums = {3: [0 + 4 + 6, 1 + 5 + 7], 9: [2, 3], 2**63 + 1: [8, 9]}
    np.testing.assert_array_equal(pulled, np.array([sums[int(k)] for k in keys], dtype=np.float32))
    out = np.zeros((5, 2), dtype=np.float32)
    f = worker.pull_unique_async(table_id, keys, out=out)
    assert f.wait() is out
    np.testing.assert_array_equal(out, pulled)
    with pytest.raises(Exception, match="need room for 10 values, got 8|shape|rows"):
        worker.pull_unique_async(table_id, keys, out=np.zeros((4, 2), dtype=np.float32)).wait()


@pytest.mark.parametrize("staleness", [0, 1])
def test_two_workers_miss_at_most_the_others_last_step(make_job, staleness):
    """Two workers on one BSP ACCUMULATE table, two clocks per step (as
    DenseDataParallel's lockstep): the rows a step reads reflect exactly
    this worker's pushes as stated, and the other worker's pushes of every
    step but the last one (that one maybe)."""
    job = make_job(servers=2, workers=2)
    width = 6

    def body(w):
        emb = tt.EmbeddingBag(w, 1, embedding_dim=1, mode="sum", optimizer="accumulate", consistency="bsp")
        g = torch.Generator().manual_seed(20 + w.rank)
        batches = []
        for _ in range(STEPS):
            ids = torch.randint(0, width, (BATCH, 1), generator=g)
            ids[0, 0] = 0
            batches.append(ids)
        seen = []
        for ids in tt.Prefetcher(batches, [(emb, lambda b: b)], staleness=staleness):
            out = emb(ids)
            seen.append((ids.reshape(-1).clone(), out.detach().reshape(-1).clone()))
            out.sum().backward()
            w.clock()
            w.clock()
        emb.flush()
        w.barrier("pushed")
        return [b.reshape(-1) for b in batches], seen, emb.rows(torch.arange(width)).reshape(-1)

    results = run_workers(job, 2, body, flags=NO_RESENDS)

    def cumulative(batches):  # cumulative(b)[t]: every row after the pushes of steps < t
        sums = [torch.zeros(width)]
        for b in batches:
            sums.append(sums[-1] + torch.bincount(b, minlength=width).float())
        return sums

    mine = [cumulative(r[0]) for r in results]
    total = mine[0][-1] + mine[1][-1]
    for rank in (0, 1):
        other = 1 - rank
        assert torch.equal(results[rank][2], total)
        for t, (ids, values) in enumerate(results[rank][1]):
            own = mine[rank][max(t - staleness, 0)][ids]
            low = own + mine[other][max(t - 1, 0)][ids]
            # Nor more than the other's steps < t: pushing step t it has passed
            # clock 2t, which this worker reached after issuing this pull; before
            # step 0 no clock orders them, so step 0 may already see its step 0.
            high = own + mine[other][max(t, 1)][ids]
            assert torch.all(values >= low) and torch.all(values <= high), (rank, t, values, low, high)
