#!/usr/bin/python3
"""The plain PyTorch baseline of examples/dlrm.py: the same model, data and
hyper-parameters in ONE process, with local embeddings and no Tessera.

It imports examples/dlrm.py for its option parser and its DenseTower, so the
options (and their defaults) are that program's, and the model is the same
code: a bottom MLP, the pairwise dot products of the 27 vectors, a top MLP,
plus the wide term (one weight per id). The embeddings are
torch.nn.EmbeddingBag(sparse=True) tables indexed by each id's position in
the sorted distinct ids of the train and test sets (made before the clock
starts). The optimizers are PyTorch's closest to Tessera's server-side ones:
- embeddings: torch.optim.SparseAdam (lazy Adam: only the rows a batch
  touches move). Tessera's Adam counts steps per row for the bias
  correction, SparseAdam counts them per table: the same rule for rows seen
  at every step, a larger first step on Tessera for rare ids;
- wide weights: torch.optim.Adagrad (sparse gradients) with the same
  initial accumulator and epsilon;
- the dense MLPs: torch.optim.Adam.
Data: tessera.CriteoSynth with the same seed, the whole train stream
(train_partition(0, 1, N): every example the Tessera workers split between
them), the same held-out set, the same AUC (tessera.auc).

Prints one line, DLRM_PLAIN_RESULT {json}: test_auc, truth_auc, steps,
train_seconds (the steps only, not the evaluations),
train_examples_per_second.

  bench/dlrm_plain.py --train_examples 2000000 --threads 2 [dlrm.py options]
"""
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
import dlrm  # noqa: E402  (examples/dlrm.py: its parser and model; it finds the tessera module itself)

tessera = dlrm.tessera


def main(argv=None):
    args = dlrm.parse(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.model_seed)
    data = tessera.CriteoSynth(seed=args.seed, zipf=args.zipf, max_cardinality=args.max_cardinality)
    fields, dim = data.categorical_fields, args.embedding_dim
    train = data.train_partition(0, 1, args.train_examples)
    test = data.test_set(args.test_examples)
    truth_auc = tessera.auc(test["truth_logits"], test["labels"])

    # Local row numbers for the generator's 64-bit keys.
    distinct = np.unique(np.concatenate([train["keys"].reshape(-1), test["keys"].reshape(-1)]))
    train_rows = torch.from_numpy(np.searchsorted(distinct, train["keys"]).astype(np.int64))
    test_rows = torch.from_numpy(np.searchsorted(distinct, test["keys"]).astype(np.int64))

    embeddings = nn.EmbeddingBag(len(distinct), dim, mode="sum", sparse=True)
    with torch.no_grad():
        embeddings.weight.uniform_(-args.embedding_init_scale, args.embedding_init_scale)
    wide = None
    if args.wide:
        wide = nn.EmbeddingBag(len(distinct), 1, mode="sum", sparse=True)
        with torch.no_grad():
            wide.weight.zero_()
    tower = dlrm.DenseTower(data.dense_fields, fields, dim, [int(x) for x in args.bottom.split(",") if x],
                            [int(x) for x in args.top.split(",") if x])
    rate = float(np.clip(train["labels"].mean(), 1e-3, 1 - 1e-3))
    with torch.no_grad():
        tower.top[-1].bias.fill_(math.log(rate / (1 - rate)))
    if args.embedding_optimizer != "adam" or args.dense_optimizer != "adam" or args.wide_optimizer != "adagrad":
        sys.exit("dlrm_plain.py: only the example's default optimizers (adam, adagrad, adam) are mirrored")
    optimizers = [torch.optim.SparseAdam(embeddings.parameters(), lr=args.embedding_lr),
                  torch.optim.Adam(tower.parameters(), lr=args.dense_lr)]
    if wide is not None:
        optimizers.append(torch.optim.Adagrad(wide.parameters(), lr=args.wide_lr,
                                              initial_accumulator_value=args.wide_initial_accumulator, eps=1e-8))
    loss_fn = nn.BCEWithLogitsLoss()

    def forward(dense, rows):
        embedded = embeddings(rows.reshape(-1, 1)).view(rows.shape[0], fields, dim)
        first_order = wide(rows).squeeze(1) if wide is not None else None
        return tower(torch.from_numpy(dense), embedded, first_order)

    def evaluate():
        with torch.no_grad():
            scores = []
            for begin in range(0, len(test["labels"]), 4096):
                scores.append(forward(test["dense"][begin:begin + 4096], test_rows[begin:begin + 4096]).numpy())
            return tessera.auc(np.concatenate(scores), test["labels"])

    n = len(train["labels"])
    steps_per_epoch = n // args.batch
    rng = np.random.default_rng(args.seed)
    step, train_seconds = 0, 0.0
    for _ in range(args.epochs):
        order = rng.permutation(n)
        start = time.monotonic()
        for s in range(steps_per_epoch):
            idx = np.sort(order[s * args.batch:(s + 1) * args.batch])
            labels = torch.from_numpy(train["labels"][idx])
            loss = loss_fn(forward(train["dense"][idx], train_rows[idx]), labels)
            for o in optimizers:
                o.zero_grad()
            loss.backward()
            for o in optimizers:
                o.step()
            step += 1
        train_seconds += time.monotonic() - start
    test_auc = evaluate()
    result = {"test_auc": test_auc, "truth_auc": truth_auc, "steps": step, "batch": args.batch,
              "threads": args.threads, "train_seconds": train_seconds,
              "train_examples_per_second": step * args.batch / train_seconds}
    print("DLRM_PLAIN_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
