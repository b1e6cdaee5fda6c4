#!/usr/bin/python3
"""A DLRM-style recommender trained through Tessera: a worker program.

Started by tessera-launch (configs/dlrm.yaml), once per worker; every process
gets the launcher's flags (--coordinator, --rank, --name, ...) plus the
config's worker.args as --key value.

The model (Naumov et al., "Deep Learning Recommendation Model for
Personalization and Recommendation Systems", 2019, in small, plus a wide
term):
- a bottom MLP maps the dense features to an embedding_dim vector;
- each categorical field's id is looked up in ONE sparse Tessera table (the
  generator's keys are distinct across fields), through
  tessera.torch.EmbeddingBag: the rows live on the servers, are pulled on
  forward and their gradients pushed on backward, and the servers apply the
  table's optimizer (lazy per-row Adam here, with feature admission and
  eviction available as table options);
- the pairwise dot products of the 27 vectors, with the bottom output, feed a
  top MLP; its output is the deep part of the click logit;
- the wide (first-order) term, beyond the DLRM paper: every id also has one
  scalar weight, in a second sparse table of width 1 (initialised to zero,
  server-side Adagrad), and the logit adds the 26 weights of the example's
  ids (one EmbeddingBag bag per example, mode "sum"). Half of the hidden
  model's logit variance is a weight per id; through the dot products alone
  (bottom output . embedding) DLRM learns it slowly and noisily, while the
  wide term learns it as logistic regression does, and the embeddings are
  left to the field-pair interactions.
The top MLP's last bias starts at the log-odds of the click rate, so that
neither the wide weights nor the embeddings have to absorb the global bias
(frequent ids would otherwise learn it first and rare ids look biased).
The dense MLPs train data-parallel through the servers
(tessera.torch.DenseDataParallel: one DENSE table, server-side Adam,
synchronous in lockstep).

Pipelining (--prefetch, tessera.torch.Prefetcher): the rows of the next
batch are pulled while this one computes, and the embedding gradients are
pushed without waiting. --prefetch 1: that pull is issued before this step
runs, so a row in both batches misses this step's push (staleness 1);
0: it is issued right after this step's push (the plain loop's rows, with
less of the step to hide behind); off: the plain loop (each forward pulls,
each push is waited for before the clock). docs/embeddings.md, "Pipelined
training", states what a step sees and has the measured examples/s and
AUC against plain PyTorch (bench/run_dlrm.sh, bench/dlrm_plain.py).

Why these optimizers. The loss is the batch mean, so an id's gradient is
about (p - y) / batch, 1e-4 to 1e-3: Adagrad with the usual initial accumulator
(0.1) then moves a row by ~lr * 1e-3 / 0.3 per step, hardly at all (the
old setting reached test AUC 0.5-0.65). The wide table's Adagrad therefore
starts from a tiny accumulator (1e-5, a few pseudo-steps of gradient), so
its steps are about lr / sqrt(times seen); the embeddings use Adam, whose
steps do not depend on the gradient's scale either and which learned the
interactions best (Tessera's Adam counts steps per row, so a rare id's first
update is a full lr-sized step); the dense MLPs use Adam too (server-side
Adagrad at lr 0.02 left the dense features nearly unlearnt). Small
embedding initialisation (0.05) keeps the never-trained rows of rare ids
from adding noise to the dot products.

Data: tessera.CriteoSynth (examples/criteo_synth.h), a Criteo-like click log
with a hidden ground-truth model; each worker trains on its partition of the
train stream and every worker scores the same held-out set. The largest
field has max_cardinality ids: 3000 by default, not the generator's 1000000,
with which no learner gets near the truth AUC from the ~2M examples a
one-minute run can use (configs/dlrm.yaml has the numbers). Progress:
TESSERA_PROGRESS lines with loss and test AUC; at the end one TESSERA_RESULT
line with test_auc and truth_auc (the hidden model's AUC on the same set),
and train_examples_per_second (this worker's, the evaluations not counted).
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

try:
    import tessera
except ImportError:
    # Run by hand rather than by tessera-launch (which puts BUILD/python on
    # PYTHONPATH): try the build tree beside this file, or $TESSERA_BUILD_DIR.
    build = Path(os.environ.get("TESSERA_BUILD_DIR", Path(__file__).resolve().parents[1] / "build"))
    sys.path.insert(0, str(build / "python"))
    try:
        import tessera
    except ImportError:
        sys.exit(f"dlrm.py: the tessera Python module is not in {build / 'python'}; build the project "
                 "(cmake --build build), or set PYTHONPATH=BUILD/python or TESSERA_BUILD_DIR=BUILD")
import tessera.torch as ttorch  # noqa: E402

EMBEDDING_TABLE = 1
WIDE_TABLE = 2
DENSE_TABLE = 10  # and 11, DenseDataParallel's table of initial values


def parse(argv):
    p = argparse.ArgumentParser(prog="dlrm.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train_examples", type=int, default=2_000_000, help="train set size (all workers together)")
    p.add_argument("--test_examples", type=int, default=20_000, help="held-out set size")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=2048, help="examples per step and worker")
    p.add_argument("--embedding_dim", type=int, default=16)
    p.add_argument("--bottom", default="32", help="hidden widths of the bottom MLP, comma-separated")
    p.add_argument("--top", default="32", help="hidden widths of the top MLP, comma-separated")
    p.add_argument("--embedding_optimizer", default="adam")
    p.add_argument("--embedding_lr", type=float, default=0.005)
    p.add_argument("--embedding_init_scale", type=float, default=0.05,
                   help="embedding rows start uniform in [-scale, scale]")
    p.add_argument("--wide", type=int, default=1,
                   help="1: add a first-order weight per id (a second table); 0: plain DLRM")
    p.add_argument("--wide_optimizer", default="adagrad")
    p.add_argument("--wide_lr", type=float, default=0.1)
    p.add_argument("--wide_initial_accumulator", type=float, default=1e-5,
                   help="Adagrad's initial accumulator of the wide table")
    p.add_argument("--dense_optimizer", default="adam")
    p.add_argument("--dense_lr", type=float, default=0.004)
    p.add_argument("--admit_after", type=int, default=0, help="feature admission: an id's row on its N-th push")
    p.add_argument("--evict_after_clocks", type=int, default=0, help="evict rows unused this many clocks")
    p.add_argument("--memory_budget_mb", type=float, default=0, help="per-server budget of the embedding table")
    p.add_argument("--zipf", type=float, default=1.1, help="exponent of the ids' distribution")
    p.add_argument("--max_cardinality", type=int, default=3000,
                   help="ids of the largest field (the generator's own default is 1000000; see configs/dlrm.yaml)")
    p.add_argument("--seed", type=int, default=7, help="data seed")
    p.add_argument("--model_seed", type=int, default=1, help="torch seed of the initial dense weights")
    p.add_argument("--eval_every", type=int, default=0, help="steps between test evaluations (0: per epoch)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--prefetch", default="1", choices=["off", "0", "1"],
                   help="pipelined training (tessera.torch.Prefetcher): the rows of the next batch are pulled "
                        "while this one computes; 1: they may miss this worker's last push (staleness 1), "
                        "0: they reflect it (pulled right after the push); off: the plain loop")
    return p.parse_args(argv)


def mlp(sizes, last_activation):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseTower(nn.Module):
    """The dense part: bottom MLP, interaction, top MLP (everything but the embeddings)."""

    def __init__(self, dense_fields, fields, dim, bottom, top):
        super().__init__()
        self.bottom = mlp([dense_fields] + bottom + [dim], last_activation=True)
        vectors = fields + 1
        self.pairs = torch.triu_indices(vectors, vectors, offset=1)
        self.top = mlp([dim + vectors * (vectors - 1) // 2] + top + [1], last_activation=False)

    def forward(self, dense, embedded, wide=None):
        x = self.bottom(dense)                                   # (B, d)
        z = torch.cat([x.unsqueeze(1), embedded], dim=1)        # (B, F + 1, d)
        dots = torch.bmm(z, z.transpose(1, 2))                  # (B, F + 1, F + 1)
        inter = dots[:, self.pairs[0], self.pairs[1]]           # (B, (F + 1) F / 2)
        logit = self.top(torch.cat([x, inter], dim=1)).squeeze(1)
        return logit if wide is None else logit + wide


def emit(tag, record):
    print(f"{tag} {json.dumps(record)}", flush=True)


def main(argv=None):
    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        parse(["--help"])  # prints the program's options and exits (without the launcher's flags)
    worker, rest = tessera.Worker.from_args(argv)
    args = parse(rest)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.model_seed)

    data = tessera.CriteoSynth(seed=args.seed, zipf=args.zipf, max_cardinality=args.max_cardinality)
    fields, dim = data.categorical_fields, args.embedding_dim
    train = data.train_partition(worker.rank, worker.num_workers, args.train_examples)
    test = data.test_set(args.test_examples)
    truth_auc = tessera.auc(test["truth_logits"], test["labels"])

    table_options = dict(optimizer=args.embedding_optimizer, learning_rate=args.embedding_lr, init="uniform",
                         init_scale=args.embedding_init_scale, init_seed=args.seed, name="embeddings")
    if args.admit_after:
        table_options["admit_after"] = args.admit_after
    if args.evict_after_clocks:
        table_options["evict_after_clocks"] = args.evict_after_clocks
    if args.memory_budget_mb:
        table_options["memory_budget_bytes"] = int(args.memory_budget_mb * 2**20)
    embeddings = ttorch.EmbeddingBag(worker, EMBEDDING_TABLE, embedding_dim=dim, mode="sum", **table_options)
    wide = None
    if args.wide:
        wide_options = dict(optimizer=args.wide_optimizer, learning_rate=args.wide_lr, init="zeros", name="wide")
        if args.wide_optimizer == "adagrad":
            wide_options["initial_accumulator"] = args.wide_initial_accumulator
        wide = ttorch.EmbeddingBag(worker, WIDE_TABLE, embedding_dim=1, mode="sum", **wide_options)
    tower = DenseTower(data.dense_fields, fields, dim, [int(x) for x in args.bottom.split(",") if x],
                       [int(x) for x in args.top.split(",") if x])
    # Start the logit's bias at the log-odds of the click rate (rank 0's
    # initial weights are broadcast, so its partition's rate is everyone's).
    rate = float(np.clip(train["labels"].mean(), 1e-3, 1 - 1e-3))
    with torch.no_grad():
        tower.top[-1].bias.fill_(math.log(rate / (1 - rate)))
    model = ttorch.DenseDataParallel(worker, tower, DENSE_TABLE, optimizer=args.dense_optimizer,
                                     learning_rate=args.dense_lr)
    loss_fn = nn.BCEWithLogitsLoss()

    def forward(dense, keys, ids=None):
        if ids is None:
            ids = torch.from_numpy(np.ascontiguousarray(keys).view(np.int64))  # uint64 keys, read as int64
        embedded = embeddings(ids.reshape(-1, 1)).view(keys.shape[0], fields, dim)
        first_order = wide(ids).squeeze(1) if wide is not None else None  # (B,): the bag sums the fields
        return model(torch.from_numpy(dense), embedded, first_order)

    def evaluate():
        with torch.no_grad():
            scores, total_loss = [], 0.0
            for begin in range(0, len(test["labels"]), 4096):
                end = begin + 4096
                logits = forward(test["dense"][begin:end], test["keys"][begin:end])
                labels = torch.from_numpy(test["labels"][begin:end])
                total_loss += float(nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum"))
                scores.append(logits.numpy())
            scores = np.concatenate(scores)
            return tessera.auc(scores, test["labels"]), total_loss / len(scores)

    n = len(train["labels"])
    # Every worker takes the same number of steps (BSP lockstep): the
    # smallest partition's.
    steps_per_epoch = (args.train_examples // worker.num_workers) // args.batch
    eval_every = args.eval_every or steps_per_epoch
    rng = np.random.default_rng(args.seed + 1000 * worker.rank)
    step, start, recent = 0, time.monotonic(), []
    test_auc, test_loss = evaluate()
    emit("TESSERA_PROGRESS", {"epoch": 0, "step": 0, "test_auc": test_auc, "test_loss": test_loss,
                              "truth_auc": truth_auc})
    def epoch_batches(order):
        for s in range(steps_per_epoch):
            idx = np.sort(order[s * args.batch:(s + 1) * args.batch])
            keys = np.ascontiguousarray(train["keys"][idx])
            yield (train["dense"][idx], keys, torch.from_numpy(keys.view(np.int64)),
                   torch.from_numpy(train["labels"][idx]))

    lookups = [(embeddings, lambda b: b[2])] + ([(wide, lambda b: b[2])] if wide is not None else [])
    train_seconds = 0.0  # the steps only, without the evaluations
    for epoch in range(args.epochs):
        order = rng.permutation(n)
        batches = epoch_batches(order)
        if args.prefetch != "off":
            batches = ttorch.Prefetcher(batches, lookups, staleness=int(args.prefetch))
        step_start = time.monotonic()
        for dense, keys, ids, labels in batches:
            logits = forward(dense, keys, ids)
            loss = loss_fn(logits, labels)
            model.zero_grad()
            loss.backward()          # pushes the embedding gradients, without waiting
            if args.prefetch == "off":
                embeddings.flush()   # the plain loop: they are in before the clock
                if wide is not None:
                    wide.flush()
            # (pipelined: a push is waited for before the next one; requests
            # to a server are handled in order, so the clock still follows it)
            model.step()             # pushes the dense gradients, clocks, pulls the weights
            step += 1
            recent.append(float(loss))
            if step % 50 == 0:
                emit("TESSERA_PROGRESS", {"epoch": epoch + 1, "step": step, "acked": step,
                                          "loss": sum(recent) / len(recent), "t": time.monotonic() - start})
                recent = []
            if step % eval_every == 0:
                train_seconds += time.monotonic() - step_start
                test_auc, test_loss = evaluate()
                step_start = time.monotonic()
                emit("TESSERA_PROGRESS", {"epoch": epoch + 1, "step": step, "test_auc": test_auc,
                                          "test_loss": test_loss, "truth_auc": truth_auc})
        train_seconds += time.monotonic() - step_start
    embeddings.flush()
    if wide is not None:
        wide.flush()
    test_auc, test_loss = evaluate()
    seconds = time.monotonic() - start
    stats = worker.stats()
    result = {"steps": step, "final_loss": test_loss, "test_auc": test_auc, "truth_auc": truth_auc,
              "auc_gap": truth_auc - test_auc, "seconds": seconds,
              "examples_per_second": step * args.batch / seconds, "train_seconds": train_seconds,
              "train_examples_per_second": step * args.batch / max(train_seconds, 1e-9),
              "prefetch": args.prefetch, "worker": stats}
    emit("TESSERA_RESULT", result)
    worker.finish(step, test_loss, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
