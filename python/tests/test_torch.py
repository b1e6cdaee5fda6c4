"""tessera.torch against plain PyTorch: the same data, the same initial
weights and the same learning rate must give the same outputs and weights
(within fp32 rounding), with the rows of tessera.torch.EmbeddingBag on the
servers and the dense parameters trained through them."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="no torch for /usr/bin/python3 (apt install python3-torch)")
import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from torch import nn  # noqa: E402
from conftest import run_workers  # noqa: E402

NUM, DIM, LR, STEPS = 30, 6, 0.1, 5


def close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def batches(form, seed):
    """STEPS batches with duplicate ids (within bags and across them)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        if form == "2d":
            ids = torch.randint(0, 8, (5, 4), generator=g)  # 20 ids out of 8: many duplicates
            ids[0, 1] = ids[0, 0]
            yield ids, None
        else:
            ids = torch.randint(0, 8, (17,), generator=g)
            ids[3] = ids[2]
            yield ids, torch.tensor([0, 3, 3, 9, 12])  # bag 1 is empty


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("form", ["2d", "1d"])
def test_embedding_bag_matches_torch(worker, table_id, mode, form):
    ours = tt.EmbeddingBag(worker, table_id, NUM, DIM, mode=mode, optimizer="sgd", learning_rate=LR,
                           init="uniform", init_scale=0.5, init_seed=3)
    ref = nn.EmbeddingBag(NUM, DIM, mode=mode)
    with torch.no_grad():  # start from the server's initial rows
        ref.weight.copy_(ours.rows(torch.arange(NUM)))
    assert ref.weight.abs().sum() > 0
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    target = torch.randn(5, DIM, generator=torch.Generator().manual_seed(9))
    for ids, offsets in batches(form, seed=1):
        out = ours(ids, offsets)
        loss = ((out - target) ** 2).sum() + out[0].sum()  # out used twice: one push per backward
        pushes = worker.stats()["pushes"]
        loss.backward()
        ours.flush()
        assert worker.stats()["pushes"] == pushes + 1

        opt.zero_grad()
        out_ref = ref(ids, offsets)
        ((out_ref - target) ** 2).sum().add(out_ref[0].sum()).backward()
        opt.step()
        assert close(out, out_ref), (out - out_ref).abs().max()
    assert close(ours.rows(torch.arange(NUM)), ref.weight.detach())


def test_embedding_bag_per_sample_weights_and_no_grad(worker, table_id):
    ours = tt.EmbeddingBag(worker, table_id, None, 3, mode="sum", optimizer="sgd", learning_rate=LR,
                           init="normal", init_scale=1.0, init_seed=5, async_push=False)
    ids = torch.tensor([5, 1000000007, 5, 2])  # sparse table: any non-negative id
    offsets = torch.tensor([0, 2])
    weights = torch.tensor([0.5, 2.0, 1.0, -1.0])
    ref = nn.EmbeddingBag(3, 3, mode="sum")
    unique = torch.tensor([5, 1000000007, 2])
    with torch.no_grad():
        ref.weight.copy_(ours.rows(unique))
    ref_ids = torch.tensor([0, 1, 0, 2])
    out = ours(ids, offsets, per_sample_weights=weights)
    out_ref = ref(ref_ids, offsets, per_sample_weights=weights)
    assert close(out, out_ref)
    out.pow(2).sum().backward()
    out_ref.pow(2).sum().backward()
    assert close(ours.rows(unique), ref.weight.detach() - LR * ref.weight.grad)
    pushes = worker.stats()["pushes"]
    with torch.no_grad():
        assert not ours(ids, offsets).requires_grad
    assert worker.stats()["pushes"] == pushes


def test_embedding_bag_rejects_bad_ids(worker, table_id):
    emb = tt.EmbeddingBag(worker, table_id, 10, 2)
    with pytest.raises(ValueError, match=r"in \[0, num_embeddings=10\)"):
        emb(torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match="num_embeddings=10"):
        emb(torch.tensor([[1, 10]]))
    with pytest.raises(ValueError, match="int64"):
        emb(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="offsets"):
        emb(torch.tensor([1, 2]))


class SmallNet(nn.Module):
    def __init__(self, seed):
        super().__init__()
        self.a = nn.Linear(5, 7)
        self.b = nn.Linear(7, 1)
        g = torch.Generator().manual_seed(seed)  # not torch.manual_seed: workers are threads here
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_dense_data_parallel_two_workers_match_one_process(make_job):
    """Two workers, each on half of every batch, started from DIFFERENT local
    initialisations (rank 0's is broadcast), against one process training on
    the whole batch with torch.optim.SGD from rank 0's initialisation."""
    job = make_job(servers=2, workers=2)
    g = torch.Generator().manual_seed(11)
    data = [(torch.randn(8, 5, generator=g), torch.randn(8, 1, generator=g)) for _ in range(STEPS)]

    def body(w):
        net = SmallNet(seed=100 + w.rank)
        ddp = tt.DenseDataParallel(w, net, table_id=1, learning_rate=LR, row_width=16)
        losses = []
        for x, y in data:
            half = slice(4 * w.rank, 4 * w.rank + 4)
            loss = ((ddp(x[half]) - y[half]) ** 2).mean()
            loss.backward()
            ddp.step()
            ddp.zero_grad()
            losses.append(loss.item())
        return [p.detach().clone() for p in net.parameters()], w.current_clock

    (params0, clock0), (params1, clock1) = run_workers(job, 2, body)
    assert clock0 == clock1 == 2 * STEPS  # lockstep: two clocks per step

    ref = SmallNet(seed=100)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for x, y in data:
        opt.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        opt.step()
    for p0, p1, r in zip(params0, params1, ref.parameters()):
        assert torch.equal(p0, p1)  # every worker holds the same weights
        assert close(p0, r.detach()), (p0 - r).abs().max()
    assert not close(params0[0], SmallNet(seed=100).a.weight.detach())  # it trained


def test_dense_data_parallel_without_broadcast_keeps_local_init(worker, table_id):
    net = SmallNet(seed=3)
    initial = [p.detach().clone() for p in net.parameters()]
    ddp = tt.DenseDataParallel(worker, net, table_id, learning_rate=LR, broadcast=False)
    assert ddp.rows == 1 and ddp.width == sum(p.numel() for p in initial)
    for p, q in zip(net.parameters(), initial):
        assert torch.equal(p.detach(), q)
    x, y = torch.randn(4, 5), torch.randn(4, 1)
    ref = SmallNet(seed=3)
    ((ddp(x) - y) ** 2).mean().backward()
    ddp.step()
    ((ref(x) - y) ** 2).mean().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= LR * p.grad
    for p, r in zip(net.parameters(), ref.parameters()):
        assert close(p.detach(), r.detach())


def test_tessera_import_does_not_import_torch():
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = "import sys, tessera; assert 'torch' not in sys.modules, 'torch imported'"
    env = {**os.environ, "PYTHONPATH": str(Path(tessera.__file__).parents[1])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert tessera.Worker is not None


def test_embedding_bag_takes_hashed_64_bit_ids(worker, table_id):
    """Ids with the top bit set (negative as int64) are keys like any other."""
    emb = tt.EmbeddingBag(worker, table_id, embedding_dim=2, optimizer="sgd", learning_rate=1.0)
    keys = np.array([2**63 + 5, 7, 2**64 - 1], dtype=np.uint64)
    ids = torch.from_numpy(keys.view(np.int64)).view(3, 1)
    assert int(ids.min()) < 0
    out = emb(ids)
    out.sum().backward()
    emb.flush()
    # SGD with lr 1 and gradient 1 on zero rows: every row is now -1.
    np.testing.assert_array_equal(worker.pull(table_id, keys), -np.ones((3, 2), dtype=np.float32))
