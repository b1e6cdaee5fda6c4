"""Tessera: the parameter-server client for Python.

A training process joins a job and pushes gradients / pulls weights::

    import tessera
    worker, args = tessera.Worker.from_args()       # flags from tessera-launch
    worker.create_table(1, 16, kind="sparse", optimizer="sgd", learning_rate=0.05,
                        init="normal", init_scale=0.01)
    rows = worker.pull(1, keys)                      # keys: uint64 (or int64 >= 0), 1-D
    worker.push(1, keys, grads)                      # grads: float32 (n, 16) or flat
    worker.clock()
    tessera.emit_progress({"step": 10, "loss": 0.4})
    worker.finish(steps=100, final_loss=0.3)

NumPy arrays and CPU torch tensors are used in place (no copies); the
asynchronous variants (push_async, pull_async) return a Future that keeps
them alive until the request completes. `tessera.torch` has an
EmbeddingBag whose rows live on the servers and a DenseDataParallel helper.

Errors are tessera.Error (a RuntimeError) with the status message and a
`code`; bad arguments raise tessera.InvalidArgumentError (also a
ValueError); timeouts tessera.DeadlineExceededError (also a TimeoutError).
"""
import json
import math
import sys

from ._tessera import (  # noqa: F401  (re-exported API)
    TABLE_OPTION_DEFAULTS,
    CriteoSynth,
    DeadlineExceededError,
    Error,
    Future,
    InvalidArgumentError,
    SparseBatch,
    Worker,
    auc,
)

__all__ = [
    "Worker", "Future", "SparseBatch", "Error", "InvalidArgumentError", "DeadlineExceededError",
    "TABLE_OPTION_DEFAULTS", "emit_progress", "emit_result", "CriteoSynth", "auc",
]


def _plain(value):
    """`value` as JSON-ready Python: NumPy and torch scalars and arrays become
    numbers and lists, non-finite floats null (the launcher reads strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy / torch
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _emit(tag, record):
    if not isinstance(record, dict):
        raise TypeError(f"{tag} record must be a dict, got {type(record).__name__}")
    line = json.dumps(_plain(record), separators=(",", ":"), allow_nan=False, default=str)
    sys.stdout.write(f"{tag} {line}\n")
    sys.stdout.flush()


def emit_progress(record):
    """Prints one `TESSERA_PROGRESS {json}` line on stdout and flushes (the
    launcher's line protocol, docs/launcher.md): `epoch`, `step` and `loss`
    feed its progress line; every field is kept in progress.jsonl."""
    _emit("TESSERA_PROGRESS", record)


def emit_result(record):
    """Prints the `TESSERA_RESULT {json}` line (once, at the end): `steps`,
    `final_loss`, `bytes_pushed`, `bytes_pulled` fill in the coordinator's
    report; other fields go into the worker's report."""
    _emit("TESSERA_RESULT", record)
