#!/usr/bin/python3
"""A DLRM-style recommender trained through Tessera: a worker program.

Started by tessera-launch (configs/dlrm.yaml), once per worker; every process
gets the launcher's flags (--coordinator, --rank, --name, ...) plus the
config's worker.args as --key value.

The model (Naumov et al., "Deep Learning Recommendation Model for
Personalization and Recommendation Systems", 2019, in small):
- a bottom MLP maps the dense features to an embedding_dim vector;
- each categorical field's id is looked up in ONE sparse Tessera table (the
  generator's keys are distinct across fields), through
  tessera.torch.EmbeddingBag: the rows live on the servers, are pulled on
  forward and their gradients pushed on backward, and the servers apply the
  table's optimizer (Adagrad here, with feature admission and eviction
  available as table options);
- the pairwise dot products of the 27 vectors, with the bottom output, feed a
  top MLP that gives the click logit.
The dense MLPs train data-parallel through the servers
(tessera.torch.DenseDataParallel: one DENSE table, server-side Adagrad,
synchronous in lockstep).

Data: tessera.CriteoSynth (examples/criteo_synth.h), a Criteo-like click log
with a hidden ground-truth model; each worker trains on its partition of the
train stream and every worker scores the same held-out set. Progress:
TESSERA_PROGRESS lines with loss and test AUC; at the end one TESSERA_RESULT
line with test_auc and truth_auc (the hidden model's AUC on the same set).
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
from torch import nn

import tessera
import tessera.torch as ttorch

EMBEDDING_TABLE = 1
DENSE_TABLE = 10  # and 11, DenseDataParallel's table of initial values


def parse(argv):
    p = argparse.ArgumentParser(prog="dlrm.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train_examples", type=int, default=300_000, help="train set size (all workers together)")
    p.add_argument("--test_examples", type=int, default=20_000, help="held-out set size")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256, help="examples per step and worker")
    p.add_argument("--embedding_dim", type=int, default=8)
    p.add_argument("--bottom", default="32", help="hidden widths of the bottom MLP, comma-separated")
    p.add_argument("--top", default="64,32", help="hidden widths of the top MLP, comma-separated")
    p.add_argument("--embedding_optimizer", default="adagrad")
    p.add_argument("--embedding_lr", type=float, default=0.05)
    p.add_argument("--dense_optimizer", default="adagrad")
    p.add_argument("--dense_lr", type=float, default=0.02)
    p.add_argument("--admit_after", type=int, default=0, help="feature admission: an id's row on its N-th push")
    p.add_argument("--evict_after_clocks", type=int, default=0, help="evict rows unused this many clocks")
    p.add_argument("--memory_budget_mb", type=float, default=0, help="per-server budget of the embedding table")
    p.add_argument("--zipf", type=float, default=1.1, help="exponent of the ids' distribution")
    p.add_argument("--max_cardinality", type=int, default=1_000_000, help="ids of the largest field")
    p.add_argument("--seed", type=int, default=7, help="data seed")
    p.add_argument("--model_seed", type=int, default=1, help="torch seed of the initial dense weights")
    p.add_argument("--eval_every", type=int, default=0, help="steps between test evaluations (0: per epoch)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
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

    def forward(self, dense, embedded):
        x = self.bottom(dense)                                   # (B, d)
        z = torch.cat([x.unsqueeze(1), embedded], dim=1)        # (B, F + 1, d)
        dots = torch.bmm(z, z.transpose(1, 2))                  # (B, F + 1, F + 1)
        inter = dots[:, self.pairs[0], self.pairs[1]]           # (B, (F + 1) F / 2)
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def emit(tag, record):
    print(f"{tag} {json.dumps(record)}", flush=True)


def main(argv=None):
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
                         init_scale=1.0 / math.sqrt(dim), init_seed=args.seed, name="embeddings")
    if args.admit_after:
        table_options["admit_after"] = args.admit_after
    if args.evict_after_clocks:
        table_options["evict_after_clocks"] = args.evict_after_clocks
    if args.memory_budget_mb:
        table_options["memory_budget_bytes"] = int(args.memory_budget_mb * 2**20)
    embeddings = ttorch.EmbeddingBag(worker, EMBEDDING_TABLE, embedding_dim=dim, mode="sum", **table_options)
    tower = DenseTower(data.dense_fields, fields, dim, [int(x) for x in args.bottom.split(",") if x],
                       [int(x) for x in args.top.split(",") if x])
    model = ttorch.DenseDataParallel(worker, tower, DENSE_TABLE, optimizer=args.dense_optimizer,
                                     learning_rate=args.dense_lr)
    loss_fn = nn.BCEWithLogitsLoss()

    def embed(keys):
        ids = torch.from_numpy(np.ascontiguousarray(keys).view(np.int64))  # uint64 keys, read as int64
        return embeddings(ids.reshape(-1, 1)).view(keys.shape[0], fields, dim)

    def evaluate():
        with torch.no_grad():
            scores, total_loss = [], 0.0
            for begin in range(0, len(test["labels"]), 4096):
                end = begin + 4096
                logits = model(torch.from_numpy(test["dense"][begin:end]), embed(test["keys"][begin:end]))
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
    for epoch in range(args.epochs):
        order = rng.permutation(n)
        for s in range(steps_per_epoch):
            idx = np.sort(order[s * args.batch:(s + 1) * args.batch])
            dense = torch.from_numpy(train["dense"][idx])
            labels = torch.from_numpy(train["labels"][idx])
            logits = model(dense, embed(train["keys"][idx]))
            loss = loss_fn(logits, labels)
            model.zero_grad()
            loss.backward()          # pushes the embedding gradients
            embeddings.flush()       # they are in before the clock
            model.step()             # pushes the dense gradients, clocks, pulls the weights
            step += 1
            recent.append(float(loss))
            if step % 50 == 0:
                emit("TESSERA_PROGRESS", {"epoch": epoch + 1, "step": step, "acked": step,
                                          "loss": sum(recent) / len(recent), "t": time.monotonic() - start})
                recent = []
            if step % eval_every == 0:
                test_auc, test_loss = evaluate()
                emit("TESSERA_PROGRESS", {"epoch": epoch + 1, "step": step, "test_auc": test_auc,
                                          "test_loss": test_loss, "truth_auc": truth_auc})
    test_auc, test_loss = evaluate()
    seconds = time.monotonic() - start
    stats = worker.stats()
    result = {"steps": step, "final_loss": test_loss, "test_auc": test_auc, "truth_auc": truth_auc,
              "auc_gap": truth_auc - test_auc, "seconds": seconds,
              "examples_per_second": step * args.batch / seconds, "worker": stats}
    emit("TESSERA_RESULT", result)
    worker.finish(step, test_loss, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
