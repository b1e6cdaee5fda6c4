"""PyTorch on Tessera: parameters that live on the parameter servers.

- EmbeddingBag: like torch.nn.EmbeddingBag, but its rows are a Tessera table.
  forward() pulls the batch's distinct rows; backward() pushes their
  gradients, and the servers apply the table's optimizer (for SGD,
  row -= learning_rate * grad). A torch optimizer never sees these rows.
- DenseDataParallel: trains the dense parameters of a module data-parallel
  through the servers (see its docstring for the design).
- Prefetcher: pipelined training. It wraps a data loader and pulls the rows
  of the next batch while the current one computes, with a stated staleness
  (see its docstring).

Importing this module imports torch; `import tessera` alone does not.
"""
import collections
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import SparseBatch

__all__ = ["EmbeddingBag", "DenseDataParallel", "Prefetcher"]


def _check_ids(ids, num_embeddings):
    """`ids` as a contiguous 1-D int64 CPU tensor, checked to be valid keys."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor of ids, got {type(ids).__name__}")
    if ids.device.type != "cpu":
        raise ValueError(f"input must be on the CPU, got {ids.device}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input must be int64 (or int32) ids, got {ids.dtype}")
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and num_embeddings is not None:
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= num_embeddings:
            raise ValueError(f"ids must be in [0, num_embeddings={num_embeddings}), got {low if low < 0 else high}")
    # Without num_embeddings every int64 is an id: the table's uint64 keys
    # read as int64 (hashed ids fill all 64 bits, so half look negative).
    return flat


class _ServerRows(torch.autograd.Function):
    """The rows of `keys`, pulled from the servers; the gradient that reaches
    them in backward is pushed to the servers (once per backward pass: autograd
    sums every use of the rows before calling backward). `anchor` is a tensor
    that requires grad, so that autograd records this node although the rows
    have no leaf of their own."""

    @staticmethod
    def forward(ctx, anchor, owner, keys, pulled):  # noqa: D401  (torch's signature)
        ctx.owner = owner
        ctx.keys = keys
        return torch.from_numpy(owner._pull(keys) if pulled is None else pulled)

    @staticmethod
    def backward(ctx, grad_rows):
        ctx.owner._push(ctx.keys, grad_rows)
        return None, None, None, None


class EmbeddingBag(nn.Module):
    """torch.nn.EmbeddingBag whose rows live in Tessera table `table_id`.

    EmbeddingBag(worker, table_id, num_embeddings=None, embedding_dim=..., mode="sum",
                 include_last_offset=False, create_table=True, async_push=True, **table_options)

    forward(input, offsets=None, per_sample_weights=None) takes what
    torch.nn.EmbeddingBag takes: a 2-D (batch, bag) tensor of ids, or 1-D ids
    with `offsets` (the start of each bag). Ids are int64 (int32 is widened):
    the table's uint64 keys, reinterpreted in place, so hashed 64-bit ids
    (which look negative as int64) are fine; with num_embeddings given they
    must be in [0, num_embeddings).

    Each forward deduplicates the ids on the worker (SparseBatch), pulls every
    distinct row once, and reduces the bags with torch.nn.functional.embedding_bag
    over the pulled rows, so autograd works as in torch. Backward pushes the
    gradient of each distinct row exactly once; the server's optimizer updates
    the rows (server-side SGD with the table's learning_rate matches
    torch.optim.SGD on a plain EmbeddingBag). Under torch.no_grad() nothing is
    pushed.

    With async_push (default), backward returns as soon as the push is sent;
    the next push (the next backward), flush() or rows() waits for it and
    raises its error, so at most one push of this module is in flight. A
    later pull of this worker sees it anyway (requests to a server are handled
    in issue order), so no forward waits for it.

    prefetch(input) starts pulling the rows of a later forward's ids now; the
    forward whose ids are equal uses them instead of pulling (Prefetcher does
    this for a whole training loop; its docstring says what the rows then
    reflect).

    create_table: create the table (embedding_dim wide; kind "dense" gets
    dense_rows=num_embeddings) with `table_options` (tessera.Worker.create_table
    keywords: optimizer, learning_rate, init, init_scale, consistency, ...).
    Every worker must build the module with the same options.
    """

    def __init__(self, worker, table_id, num_embeddings=None, embedding_dim=None, mode="sum", *,
                 include_last_offset=False, create_table=True, async_push=True, **table_options):
        super().__init__()
        if embedding_dim is None or int(embedding_dim) < 1:
            raise ValueError(f"embedding_dim must be a positive int, got {embedding_dim!r}")
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode must be 'sum', 'mean' or 'max', got {mode!r}")
        self.worker = worker
        self.table_id = int(table_id)
        self.num_embeddings = None if num_embeddings is None else int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.mode = mode
        self.include_last_offset = include_last_offset
        self.async_push = async_push
        if create_table:
            options = dict(table_options)
            if options.get("kind") == "dense":
                if self.num_embeddings is None:
                    raise ValueError("a dense table needs num_embeddings")
                options.setdefault("dense_rows", self.num_embeddings)
            worker.create_table(self.table_id, self.embedding_dim, **options)
        # Requires grad so that autograd records _ServerRows; not a Parameter,
        # so no torch optimizer (or DenseDataParallel) ever sees it.
        self._anchor = torch.zeros(0, requires_grad=True)
        self._pending = []  # futures of pushes in flight (they hold their buffers)
        # Prefetched lookups, oldest first: [flat ids, SparseBatch, future of
        # the distinct rows, or None while waiting for the next push].
        self._prefetched = collections.deque()

    def extra_repr(self):
        return (f"table_id={self.table_id}, num_embeddings={self.num_embeddings}, "
                f"embedding_dim={self.embedding_dim}, mode={self.mode!r}")

    def _pull(self, keys):
        return self.worker.pull(self.table_id, keys)

    def _push(self, keys, grad_rows):
        grad = grad_rows.detach().to(torch.float32).contiguous()
        self.flush()  # at most one push in flight
        if self.async_push:
            self._pending.append(self.worker.push_async(self.table_id, keys, grad))
        else:
            self.worker.push(self.table_id, keys, grad)
        self._start_deferred()  # prefetches that wait for this push: it is issued, they see it

    def flush(self):
        """Waits for the pushes of earlier backward passes; raises the first error."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.wait()

    def prefetch(self, input, after_next_push=False):
        """Starts pulling the distinct rows of `input` (ids as forward takes
        them; offsets do not matter) for a later forward with equal ids. With
        after_next_push, the pull starts right after this module's next push
        is issued (so it reflects that push), or at that forward if no push
        comes first. Prefetches are kept until a forward uses them; one that
        a forward passes over (a later prefetch matched) is dropped."""
        flat = _check_ids(input, self.num_embeddings)
        batch = SparseBatch(flat.numpy().view(np.uint64))
        entry = [flat, batch, None]
        if not after_next_push:
            entry[2] = self.worker.pull_async(self.table_id, batch.unique)
        self._prefetched.append(entry)

    def _start_deferred(self):
        for entry in self._prefetched:
            if entry[2] is None:
                entry[2] = self.worker.pull_async(self.table_id, entry[1].unique)

    def _take_prefetched(self, flat):
        """(SparseBatch, rows future) of the prefetch of these ids, or None."""
        for i, entry in enumerate(self._prefetched):
            if entry[0].shape == flat.shape and torch.equal(entry[0], flat):
                for _ in range(i + 1):
                    taken = self._prefetched.popleft()
                if taken[2] is None:  # no push came: pull now
                    taken[2] = self.worker.pull_async(self.table_id, taken[1].unique)
                return taken[1], taken[2]
        return None

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002 (torch's name)
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError("offsets must be None when input is 2-D (batch, bag)")
        elif input.dim() == 1:
            if offsets is None:
                raise ValueError("1-D input needs offsets (the start of each bag)")
        else:
            raise ValueError(f"input must be 1-D (with offsets) or 2-D, got shape {tuple(input.shape)}")
        flat = _check_ids(input, self.num_embeddings)
        prefetched = self._take_prefetched(flat) if self._prefetched else None
        if prefetched is None:
            batch = SparseBatch(flat.numpy().view(np.uint64))  # int64 ids read as uint64 keys, no copy
            pulled = None
        else:
            batch, future = prefetched
            pulled = future.wait()
        inverse = torch.from_numpy(batch.inverse.astype(np.int64)).view(input.shape)
        if torch.is_grad_enabled():
            rows = _ServerRows.apply(self._anchor, self, batch.unique, pulled)
        else:
            rows = torch.from_numpy(self._pull(batch.unique) if pulled is None else pulled)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset)

    def rows(self, ids):
        """The current rows of `ids` (any shape of int64 ids) as a (n, embedding_dim) tensor."""
        self.flush()
        flat = _check_ids(torch.as_tensor(ids), self.num_embeddings)
        return torch.from_numpy(self.worker.pull(self.table_id, flat.numpy().view(np.uint64)))


class DenseDataParallel:
    """Data-parallel training of a module's dense parameters through the servers.

    DenseDataParallel(worker, module, table_id, learning_rate=0.01, optimizer="sgd",
                      init_table_id=None, row_width=1024, broadcast=True, average=True,
                      consistency="bsp", staleness=0, lockstep=None, **table_options)

    Use: every worker wraps its replica (collectively: the constructor creates
    the tables and waits at a barrier), then per step::

        loss = loss_fn(ddp(x), y)       # ddp(...) calls the module
        loss.backward()
        ddp.step()                      # push grads, worker.clock(), pull weights
        ddp.zero_grad()

    Design. The weights live on the servers and the servers' optimizer
    updates them, as for every other table: the module's trainable parameters
    (float32, CPU) are flattened, in module.parameters() order, into one
    DENSE table of `row_width`-float rows (the last row zero-padded), so a
    step is one push and one pull of ceil(P / row_width) keys, spread over all
    servers. step() pushes every worker's gradient divided by num_workers
    (`average`), calls worker.clock(), and pulls: under BSP the pull after
    the clock reflects every worker's push of the step, so with SGD the
    update is the mean gradient's (the server applies the workers' pushes one
    after another; for SGD that is the same update up to fp32 rounding).

    Lockstep. BSP bounds staleness from below only: a pull at clock c
    reflects every push stamped before c, and may also reflect pushes a
    faster worker already made at clock c (its next step's gradient). So with
    one clock per step, a slow worker can pull weights that already contain
    part of the next step, and the replicas drift apart. With `lockstep`
    (the default for BSP), step() clocks a second time after its pull:
    nobody pushes step t+1 before every worker has pulled step t, so every
    worker holds bit-identical weights and training is exactly synchronous
    data-parallel SGD, at the price of a second clock round trip per step
    (the worker's clock advances by 2 per step; mind that for SSP bounds of
    other tables). lockstep=False: one clock per step, and the weights a
    worker sees may include some of the faster workers' next gradients (BSP
    still holds); SSP/ASP tables train stale-synchronously or
    asynchronously with the same code.

    Initial weights: a server table starts from its own initializer, and no
    server optimizer can set a row to a given value exactly (pushing
    -init/learning_rate through SGD is inexact and wrong for other
    optimizers). So the table holds the weights' offset from their initial
    values, p = p0 + d: table `table_id` (the optimizer's table) starts at
    d = 0 (init "zeros"), and p0 is rank 0's initial parameters (torch's own
    initialisation), broadcast once through a second, ACCUMULATE table
    (`init_table_id`, default table_id + 1): rank 0 pushes p0 onto zero rows
    (0 + x == x, exact), every worker pulls it after a barrier. Gradients
    with respect to d equal those with respect to p, so any gradient-based
    server optimizer (SGD, momentum, Adagrad, Adam, ...) trains p unchanged
    (with several workers each worker's push is one optimizer step on the
    server: for optimizers that are not linear in the gradient that differs
    from one step on the mean gradient); only a decay term that reads the stored value itself (weight decay on the
    server) would decay d towards 0, i.e. p towards p0 -- put L2 in the loss
    instead. With broadcast=False each worker keeps its own p0 (correct only
    if every worker seeded torch identically) and the second table is not
    created. A restarted job must not broadcast into an init table that
    already holds p0 (restored from a checkpoint): pass broadcast=False and
    identical seeds there.

    step(clock=False) pushes and pulls without clocking at all (the program
    clocks itself, e.g. once for several tables; lockstep is then its
    business). Gradients of parameters that got none in this step count as
    zero.
    """

    def __init__(self, worker, module, table_id, *, learning_rate=0.01, optimizer="sgd", init_table_id=None,
                 row_width=1024, broadcast=True, average=True, consistency="bsp", staleness=0, lockstep=None,
                 **table_options):
        self.worker = worker
        self.lockstep = (consistency == "bsp") if lockstep is None else bool(lockstep)
        self.module = module
        self.table_id = int(table_id)
        self.init_table_id = self.table_id + 1 if init_table_id is None else int(init_table_id)
        self.params = [p for p in module.parameters() if p.requires_grad]
        for p in self.params:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"DenseDataParallel needs float32 CPU parameters, got {p.dtype} on {p.device}")
        self.numel = sum(p.numel() for p in self.params)
        if self.numel == 0:
            raise ValueError("the module has no trainable parameters")
        if row_width < 1:
            raise ValueError(f"row_width must be >= 1, got {row_width}")
        self.width = min(int(row_width), self.numel)
        self.rows = math.ceil(self.numel / self.width)
        padded = self.rows * self.width
        self.scale = 1.0 / worker.num_workers if average else 1.0
        self._keys = np.arange(self.rows, dtype=np.uint64)
        self._initial = torch.zeros(padded)  # p0
        self._delta = torch.zeros(padded)    # d, as last pulled
        self._grad = torch.zeros(padded)     # the pushed gradient (padding stays 0)

        common = dict(kind="dense", dense_rows=self.rows, init="zeros")
        worker.create_table(self.table_id, self.width, optimizer=optimizer, learning_rate=learning_rate,
                            consistency=consistency, staleness=staleness, **common,
                            **{"name": f"dense-{self.table_id}", **table_options})
        self._flatten(self._initial, [p.detach() for p in self.params])
        if broadcast:
            worker.create_table(self.init_table_id, self.width, optimizer="accumulate", consistency="asp",
                                name=f"dense-{self.table_id}-initial", **common)
            if worker.rank == 0 and worker.incarnation == 0:
                worker.push(self.init_table_id, self._keys, self._initial)
        # d before the barrier: nobody pushes to it before everyone is past it.
        self.worker.pull(self.table_id, self._keys, out=self._delta)
        worker.barrier(f"tessera.torch.DenseDataParallel/{self.table_id}/initial")
        if broadcast:
            worker.pull(self.init_table_id, self._keys, out=self._initial)
        self._set_parameters()

    def _flatten(self, flat, tensors):
        offset = 0
        for p, t in zip(self.params, tensors):
            n = p.numel()
            if t is None:
                flat[offset:offset + n].zero_()
            else:
                flat[offset:offset + n].copy_(t.reshape(-1))
            offset += n

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def parameters(self):
        return iter(self.params)

    @torch.no_grad()
    def sync(self):
        """Pulls the weights' offset from the servers and sets p = p0 + d."""
        self.worker.pull(self.table_id, self._keys, out=self._delta)
        self._set_parameters()

    @torch.no_grad()
    def _set_parameters(self):
        offset = 0
        for p in self.params:
            n = p.numel()
            p0, d = self._initial[offset:offset + n], self._delta[offset:offset + n]
            if p.data.is_contiguous():
                torch.add(p0, d, out=p.data.view(-1))  # straight into the parameter
            else:
                p.data.copy_((p0 + d).view_as(p))
            offset += n

    @torch.no_grad()
    def step(self, clock=True):
        """Pushes this worker's gradients (scaled by 1/num_workers), calls
        worker.clock() (unless clock=False), pulls the updated weights, and
        with lockstep clocks once more (see the class docstring)."""
        self._flatten(self._grad, [p.grad for p in self.params])
        if self.scale != 1.0:
            self._grad[:self.numel].mul_(self.scale)
        self.worker.push(self.table_id, self._keys, self._grad)
        if clock:
            self.worker.clock()
        self.sync()
        if clock and self.lockstep:
            self.worker.clock()  # nobody pushes the next step before everyone pulled this one

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


class Prefetcher:
    """Pipelined training: iterates `loader` with the rows of batch t+1
    pulled while batch t computes.

    Prefetcher(loader, lookups, staleness=1)

    loader: any iterable of batches. lookups: (embedding_bag, ids_of) pairs,
    where ids_of(batch) returns the ids that the training step will pass to
    that EmbeddingBag's forward for this batch (the same tensor or equal
    values, any shape). Use::

        for batch in Prefetcher(loader, [(emb, lambda b: b[1])]):
            loss = loss_fn(model(batch[0], emb(batch[1])), batch[2])
            loss.backward()        # pushes the rows' gradients, without waiting
            ...

    What a step sees. Each EmbeddingBag's backward pushes without waiting
    (at most one push of a module in flight: the next push waits for the
    previous one), and a pull this worker issues after a push reflects it
    (requests to a server are handled in issue order), so which of this
    worker's pushes a step's rows reflect depends only on when their pull is
    issued:
    - staleness=1: the pull of batch t+1 is issued when batch t is handed
      out, before step t runs. Step t+1's rows then reflect this worker's
      pushes of steps <= t-1 and miss step t's (a row in both batches is
      exactly one step stale); the pull overlaps all of step t.
    - staleness=0: the pull of batch t+1 is issued right after step t's
      push is issued (from backward), so step t+1's rows reflect all of
      this worker's pushes, as in the plain loop; it overlaps what follows
      the backward (e.g. the dense step). With one worker this is the plain
      loop bit for bit.
    Other workers' pushes: a pull is stamped with the worker's clock when it
    is issued, so under BSP a prefetched pull issued during step t (before
    that step's clock()) is promised every worker's pushes of the steps
    before t (one clock per step, or DenseDataParallel's two), where the
    plain loop's pull, issued after step t's clock, is promised step t's as
    well: in both modes a prefetched row may miss the other workers' last
    step, never more. Tables that are not BSP make their own promise (SSP:
    s steps more; ASP: none). These say what a row misses at most; a pull
    sent again (its answer was late: a loaded machine, a lost message) is
    read when the resend arrives, so it may also reflect pushes issued after
    the first send (fresher than stated, never staler).

    A forward whose ids match no prefetch (e.g. an evaluation in between)
    pulls as usual and leaves the prefetches alone; a prefetch whose batch is
    never looked up is dropped when a later one is used.
    """

    def __init__(self, loader, lookups, staleness=1):
        if staleness not in (0, 1):
            raise ValueError(f"staleness must be 0 or 1 (steps), got {staleness!r}")
        lookups = list(lookups)
        for pair in lookups:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], EmbeddingBag)
                    and callable(pair[1])):
                raise TypeError("lookups must be (tessera.torch.EmbeddingBag, ids_of(batch)) pairs, got "
                                f"{pair!r}")
        tables = [bag.table_id for bag, _ in lookups]
        if len(set(map(id, (bag for bag, _ in lookups)))) != len(set(tables)):
            raise ValueError(f"every EmbeddingBag of a Prefetcher needs its own table, got tables {tables}")
        self.loader = loader
        self.lookups = lookups
        self.staleness = staleness

    def __len__(self):
        return len(self.loader)

    def _prefetch(self, batch, after_next_push):
        for bag, ids_of in self.lookups:
            bag.prefetch(ids_of(batch), after_next_push=after_next_push)

    def __iter__(self):
        batches = iter(self.loader)
        end = object()
        current = next(batches, end)
        if current is end:
            return
        self._prefetch(current, after_next_push=False)
        while True:
            following = next(batches, end)
            if following is not end:
                self._prefetch(following, after_next_push=self.staleness == 0)
            yield current
            if following is end:
                return
            current = following
