"""`tessera-launch plan`: how many servers and virtual shards a job needs.

Given the model's tables (kind, rows, width, and for sparse tables the
distinct rows one worker touches per step), the number of workers and each
host's network bandwidth, `plan` suggests `cluster.servers` and
`cluster.vshards` and prints the arithmetic behind them. It starts nothing
and reads no build tree: it is arithmetic on the wire format and the
server's storage (docs/design.md, server/table.h), under these assumptions:
one process per host, servers and workers on different hosts, full-duplex
links of the same bandwidth everywhere, every table pushed and pulled once
per step by every worker, load spread evenly over the servers. Message
headers, acknowledgements and compute are not counted.

Per worker and step, for a table moving n rows of width d (dense: every
row; sparse: rows_per_step), with K = 8 key bytes, b value bytes and C the
push compression ratio:

    push        n x (K + C x d x b)      worker -> servers
    pull keys   n x K                    worker -> servers
    pull reply  n x d x b                servers -> worker
    forward     n x (K + d x b)          primary -> each of the R - 1 backups
                                         (fp32: a compressed push is decoded first)

    worker out = sum(push + pull keys), worker in = sum(pull reply)
    servers in  = W x worker out + (R - 1) x W x sum(forward)
    servers out = W x worker in  + (R - 1) x W x sum(forward)

    S_bw  = ceil(max(servers in, servers out) / max(worker out, worker in))
    S_mem = ceil(R x sum(rows x ((d + optimizer floats) x b + 32)) / (M x f))
    S     = max(S_bw, S_mem, R)
    V     = the smallest power of two >= max(64, 16 x S)

A server's step then takes no longer on its link than a worker's does; 32 B
per row is the server's index entry (Table::RowBytes); M x f is the part of
a server host's memory the table rows may use. The step's network lower
bound is max(worker out, worker in) / bandwidth.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Optional

from .config import ConfigError, _read_yaml, load_config

KINDS = ("dense", "sparse")
#: Bytes of a key on the wire (uint64).
KEY_BYTES = 8
#: Bytes of a row's index entry on a server (server/table.h, kIndexBytesPerRow).
INDEX_BYTES_PER_ROW = 32
#: Virtual shards: at least this many, and at least this many per server.
MIN_VSHARDS = 64
VSHARDS_PER_SERVER = 16
#: Default share of a server host's memory that table rows may use; the rest
#: is for pull replies and pushes in flight, copy-on-write copies, the OS.
DEFAULT_MEMORY_FRACTION = Fraction(7, 10)
DEFAULT_MEMORY_GIB = Fraction(64)
GIB = 1 << 30

#: Optimizer state stored after each row's weights, in floats, as a function
#: of the width d (server/optimizer.cc, OptimizerStateFloats), with the formula
#: for the explanation.
OPTIMIZERS = {
    "sgd": (lambda d: 0, "0"),
    "accumulate": (lambda d: 0, "0"),
    "momentum": (lambda d: d, "dim"),
    "adagrad": (lambda d: d, "dim"),
    "adam": (lambda d: 2 * d + 1, "2 x dim + 1"),
    "ftrl": (lambda d: 2 * d, "2 x dim"),
}

TABLE_KEYS = ("name", "kind", "rows", "dim", "rows_per_step", "optimizer")
MODEL_KEYS = ("name", "optimizer", "tables")


class PlanError(Exception):
    """Bad planner input; the message names the field (and file and line)."""


@dataclass(frozen=True)
class TableSpec:
    name: str
    kind: str  # "dense" or "sparse"
    rows: int  # rows of the whole table
    dim: int  # floats per row (the table's width)
    rows_per_step: Optional[int] = None  # sparse: distinct rows one worker touches per step
    optimizer: str = "sgd"

    @property
    def rows_moved(self) -> int:
        """Rows one worker pushes (and pulls) per step."""
        return self.rows if self.kind == "dense" else self.rows_per_step


@dataclass(frozen=True)
class PlanInputs:
    tables: tuple
    workers: int
    bandwidth_gbps: float  # per host, each direction; 1 Gbit/s = 10^9 bit/s
    memory_gib: Fraction = DEFAULT_MEMORY_GIB  # per server host
    replication: int = 1
    compression_ratio: Fraction = Fraction(1)  # push value bytes multiplier
    value_bytes: int = 4
    memory_fraction: Fraction = DEFAULT_MEMORY_FRACTION


@dataclass(frozen=True)
class TablePlan:
    spec: TableSpec
    push_bytes: Fraction  # one worker, one step: keys + (compressed) values
    pull_key_bytes: int
    pull_reply_bytes: int
    forward_bytes: int  # one worker's push as a primary forwards it to one backup
    optimizer_floats: int
    row_bytes: int  # one stored row on a server
    state_bytes: int  # the whole table, one copy


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    tables: tuple
    worker_out: Fraction  # one worker per step: pushes and pull keys
    worker_in: int  # one worker per step: pull replies
    forward_bytes: int  # one worker's pushes, forwarded to one backup
    servers_in: Fraction  # all servers together per step
    servers_out: Fraction
    servers_bandwidth: int
    state_bytes: int  # every table, one copy
    usable_bytes_per_server: Fraction
    servers_memory: int
    servers: int
    decided_by: tuple  # of "bandwidth", "memory", "replication"
    vshards: int
    shards_per_server_min: int
    shards_per_server_max: int
    shard_imbalance: float  # most-loaded server's shards / the mean
    step_seconds: float  # network lower bound of a worker's step
    server_step_seconds: float  # one server's busier direction at `servers` servers

    def cluster(self) -> dict:
        """The suggested `cluster` section (the keys the plan decides)."""
        return {"servers": self.servers, "workers": self.inputs.workers, "vshards": self.vshards,
                "replication": self.inputs.replication}


def _ceil_div(a, b) -> int:
    return math.ceil(Fraction(a) / Fraction(b))


def _check_inputs(inputs: PlanInputs) -> None:
    def positive_int(name, value):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} must be a positive integer, got {value!r}")

    if not inputs.tables:
        raise PlanError("no tables: give --model FILE or --table NAME:KIND:ROWS:DIM[:ROWS_PER_STEP]")
    positive_int("workers", inputs.workers)
    positive_int("replication", inputs.replication)
    positive_int("value_bytes", inputs.value_bytes)
    if not (isinstance(inputs.bandwidth_gbps, (int, float, Fraction)) and 0 < inputs.bandwidth_gbps < math.inf):
        raise PlanError(f"bandwidth_gbps must be a positive number, got {inputs.bandwidth_gbps!r}")
    if not inputs.memory_gib > 0:
        raise PlanError(f"memory_gib must be positive, got {inputs.memory_gib!r}")
    if not 0 < inputs.compression_ratio <= 1:
        raise PlanError(f"compression_ratio must be in (0, 1], got {inputs.compression_ratio!r}")
    if not 0 < inputs.memory_fraction <= 1:
        raise PlanError(f"memory_fraction must be in (0, 1], got {inputs.memory_fraction!r}")
    names = set()
    for t in inputs.tables:
        if t.name in names:
            raise PlanError(f"table {t.name!r} is given twice")
        names.add(t.name)
        _check_table(t, f"table {t.name!r}")


def _table_problem(t: TableSpec) -> Optional[tuple]:
    """(the field, what is wrong with it), or None for a good table."""
    if not isinstance(t.kind, str) or t.kind not in KINDS:
        return "kind", f"kind must be dense or sparse, got {t.kind!r}"
    for field in ("rows", "dim"):
        value = getattr(t, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return field, f"{field} must be a positive integer, got {value!r}"
    r = t.rows_per_step
    if t.kind == "sparse":
        if r is None:
            return "rows_per_step", ("rows_per_step is required for a sparse table (the distinct rows one "
                                     "worker touches per step)")
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            return "rows_per_step", f"rows_per_step must be a positive integer, got {r!r}"
        if r > t.rows:
            return "rows_per_step", f"rows_per_step ({r}) must not exceed rows ({t.rows})"
    elif r is not None:
        return "rows_per_step", "rows_per_step is for sparse tables; a dense table moves all its rows every step"
    if not isinstance(t.optimizer, str) or t.optimizer not in OPTIMIZERS:
        return "optimizer", f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {t.optimizer!r}"
    return None


def _check_table(t: TableSpec, where: str) -> None:
    problem = _table_problem(t)
    if problem:
        raise PlanError(f"{where}: {problem[1]}")


def plan(inputs: PlanInputs) -> Plan:
    """The plan for `inputs` (pure; raises PlanError on bad input)."""
    _check_inputs(inputs)
    b, c, w, r = inputs.value_bytes, Fraction(inputs.compression_ratio), inputs.workers, inputs.replication
    tables = []
    for t in inputs.tables:
        n, d = t.rows_moved, t.dim
        floats = OPTIMIZERS[t.optimizer][0](d)
        row_bytes = (d + floats) * b + INDEX_BYTES_PER_ROW
        tables.append(TablePlan(
            spec=t, push_bytes=n * (KEY_BYTES + c * d * b), pull_key_bytes=n * KEY_BYTES,
            pull_reply_bytes=n * d * b, forward_bytes=n * (KEY_BYTES + d * b), optimizer_floats=floats,
            row_bytes=row_bytes, state_bytes=t.rows * row_bytes))
    worker_out = sum((t.push_bytes + t.pull_key_bytes for t in tables), Fraction(0))
    worker_in = sum(t.pull_reply_bytes for t in tables)
    forward = sum(t.forward_bytes for t in tables)
    servers_in = w * worker_out + (r - 1) * w * forward
    servers_out = w * worker_in + (r - 1) * w * forward
    worker_busier = max(worker_out, worker_in)
    servers_bw = _ceil_div(max(servers_in, servers_out), worker_busier)

    state = sum(t.state_bytes for t in tables)
    usable = Fraction(inputs.memory_gib) * GIB * Fraction(inputs.memory_fraction)
    servers_mem = _ceil_div(state * r, usable)

    servers = max(servers_bw, servers_mem, r)
    decided_by = tuple(name for name, value in
                       (("bandwidth", servers_bw), ("memory", servers_mem), ("replication", r)) if value == servers)
    vshards = MIN_VSHARDS
    while vshards < VSHARDS_PER_SERVER * servers:
        vshards *= 2
    bytes_per_second = inputs.bandwidth_gbps * 1e9 / 8
    return Plan(
        inputs=inputs, tables=tuple(tables), worker_out=worker_out, worker_in=worker_in, forward_bytes=forward,
        servers_in=servers_in, servers_out=servers_out, servers_bandwidth=servers_bw, state_bytes=state,
        usable_bytes_per_server=usable, servers_memory=servers_mem, servers=servers, decided_by=decided_by,
        vshards=vshards, shards_per_server_min=vshards // servers, shards_per_server_max=-(-vshards // servers),
        shard_imbalance=-(-vshards // servers) * servers / vshards,
        step_seconds=float(worker_busier) / bytes_per_second,
        server_step_seconds=float(max(servers_in, servers_out) / servers) / bytes_per_second)


# --------------------------------------------------------------------------
# Reading tables: the model file and --table
# --------------------------------------------------------------------------


def _int_field(value, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{where}: {field} must be a positive integer, got {value!r}")
    return value


def load_model(path, default_optimizer: Optional[str] = None) -> list:
    """The tables of a model file (YAML: `tables:`, a list of mappings with
    name, kind, rows, dim, rows_per_step for sparse, optional optimizer; an
    optional top-level `optimizer` for tables without one, and `name`).
    `default_optimizer` (--optimizer) wins over the file's top-level one."""
    try:
        data = _read_yaml(Path(path))
    except ConfigError as e:
        raise PlanError(str(e)) from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a model file is a mapping with a `tables` list, got {type(data).__name__}")
    lines = getattr(data, "key_lines", {})
    for key in data:
        if key not in MODEL_KEYS:
            raise PlanError(f"{path}:{lines.get(key, '?')}: unknown key {key!r} (known: {', '.join(MODEL_KEYS)})")
    file_optimizer = data.get("optimizer", "sgd")
    if not isinstance(file_optimizer, str) or file_optimizer not in OPTIMIZERS:
        raise PlanError(f"{path}:{lines.get('optimizer', '?')}: optimizer must be one of {', '.join(OPTIMIZERS)}, "
                        f"got {file_optimizer!r}")
    optimizer = default_optimizer or file_optimizer
    raw = data.get("tables")
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{path}:{lines.get('tables', 1)}: tables must be a non-empty list of tables "
                        f"({', '.join(TABLE_KEYS)}), got {raw!r}")
    item_lines = getattr(raw, "item_lines", [])
    tables = []
    for i, item in enumerate(raw):
        line = item_lines[i] if i < len(item_lines) else "?"
        if not isinstance(item, dict):
            raise PlanError(f"{path}:{line}: tables[{i}] must be a mapping ({', '.join(TABLE_KEYS)}), got {item!r}")
        klines = getattr(item, "key_lines", {})
        label = f"tables[{i}]" + (f" ({item['name']})" if isinstance(item.get("name"), str) else "")

        def where(key=None):
            return f"{path}:{klines.get(key, line)}: {label}"

        for key in item:
            if key not in TABLE_KEYS:
                raise PlanError(f"{where(key)}: unknown key {key!r} (known: {', '.join(TABLE_KEYS)})")
        for key in ("name", "kind", "rows", "dim"):
            if key not in item:
                raise PlanError(f"{where()}: {key} is required")
        if not isinstance(item["name"], str) or not item["name"]:
            raise PlanError(f"{where('name')}: name must be a non-empty string, got {item['name']!r}")
        if any(t.name == item["name"] for t in tables):
            raise PlanError(f"{where('name')}: another table is named {item['name']!r}")
        spec = TableSpec(name=item["name"], kind=item["kind"], rows=item["rows"], dim=item["dim"],
                         rows_per_step=item.get("rows_per_step"), optimizer=item.get("optimizer", optimizer))
        problem = _table_problem(spec)
        if problem:
            raise PlanError(f"{where(problem[0])}: {problem[1]}")
        tables.append(spec)
    return tables


def parse_table_flag(text: str, optimizer: str = "sgd") -> TableSpec:
    """`--table NAME:KIND:ROWS:DIM[:ROWS_PER_STEP]`."""
    where = f"--table {text}"
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise PlanError(f"{where}: expected NAME:KIND:ROWS:DIM (dense) or NAME:KIND:ROWS:DIM:ROWS_PER_STEP "
                        "(sparse)")
    name, kind = parts[0], parts[1]
    if not name:
        raise PlanError(f"{where}: the table's name is empty")
    if kind not in KINDS:
        raise PlanError(f"{where}: kind must be dense or sparse, got {kind!r}")
    numbers = []
    for field, value in zip(("rows", "dim", "rows_per_step"), parts[2:]):
        try:
            number = int(value)
        except ValueError:
            raise PlanError(f"{where}: {field} must be a positive integer, got {value!r}") from None
        numbers.append(_int_field(number, where, field))
    spec = TableSpec(name=name, kind=kind, rows=numbers[0], dim=numbers[1],
                     rows_per_step=numbers[2] if len(numbers) > 2 else None, optimizer=optimizer)
    _check_table(spec, where)
    return spec


# --------------------------------------------------------------------------
# The explanation
# --------------------------------------------------------------------------


def _n(x) -> str:
    """A count with thousands separators; a fraction as a short decimal."""
    if isinstance(x, Fraction) and x.denominator == 1:
        x = x.numerator
    if isinstance(x, int):
        return f"{x:,}"
    return f"{float(x):,.4g}"


def _size(x) -> str:
    """Bytes in powers of two, three significant digits."""
    x = float(x)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if x >= scale:
            v = x / scale
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:,.0f} {unit}"
    return f"{x:.4g} B"


def _ratio(x: Fraction) -> str:
    """A quotient before rounding up: exact when whole, else 4 significant
    digits, never shown as the whole number it lies just above or below."""
    if x.denominator == 1:
        return f"{x.numerator:,}"
    text = f"{float(x):,.4g}"
    return text if "." in text or "e" in text else f"{float(x):,.2f}"


def _ms(seconds: float) -> str:
    """A duration in ms, or in us below 1 ms."""
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def _cluster_yaml(plan_: Plan) -> str:
    return "cluster:\n" + "".join(f"  {k}: {v}\n" for k, v in plan_.cluster().items())


def explain(p: Plan, config_note: Optional[str] = None) -> str:
    """The plan as text: the arithmetic step by step, then the `cluster` snippet."""
    i = p.inputs
    b, c, w, r = i.value_bytes, Fraction(i.compression_ratio), i.workers, i.replication
    cv = f"{_n(c)} x " if c != 1 else ""
    gbps = f"{i.bandwidth_gbps:g} Gbit/s"
    out = []
    add = out.append
    add(f"Plan: {len(p.tables)} table{'s' * (len(p.tables) != 1)}, {w} worker{'s' * (w != 1)}, {gbps} per host, "
        f"{_n(i.memory_gib)} GiB per server host, replication {r}"
        + (f", push compression {_n(c)}" if c != 1 else ""))
    add("  assuming one process per host, servers and workers on different hosts, full-duplex links;")
    add(f"  keys {KEY_BYTES} B, values {b} B; message headers not counted; KiB, MiB, GiB are powers of 2")
    add("")
    add("1. One worker's traffic per step (every table pushed and pulled once):")
    for t in p.tables:
        s = t.spec
        n = _n(s.rows_moved)
        what = (f"dense: all {n} rows of {_n(s.dim)}" if s.kind == "dense"
                else f"sparse: {n} of its {_n(s.rows)} rows of {_n(s.dim)}")
        add(f"   '{s.name}' ({what})")
        add(f"       out: push {n} x ({KEY_BYTES} + {cv}{_n(s.dim)} x {b}) B = {_size(t.push_bytes)}, "
            f"pull keys {n} x {KEY_BYTES} B = {_size(t.pull_key_bytes)}")
        add(f"       in:  pull reply {n} x {_n(s.dim)} x {b} B = {_size(t.pull_reply_bytes)}")
    add(f"   worker out = pushes + pull keys = {_size(p.worker_out)}; "
        f"worker in = pull replies = {_size(p.worker_in)}")
    add("")
    if r > 1:
        add(f"2. All servers together per step ({w} workers; replication {r}: primaries forward every push to "
            f"{r - 1} backup{'s' * (r != 2)},")
        add(f"   as keys + fp32 values: {_size(p.forward_bytes)} per worker and backup):")
        fwd = f" + {r - 1} x {w} x {_size(p.forward_bytes)} forwarded"
    else:
        add(f"2. All servers together per step ({w} workers; replication 1: no forwarding to backups):")
        fwd = ""
    add(f"   in  = {w} x {_size(p.worker_out)} from the workers{fwd} = {_size(p.servers_in)}")
    add(f"   out = {w} x {_size(p.worker_in)} pull replies{fwd} = {_size(p.servers_out)}")
    add("")
    add("3. Bandwidth bound: a worker's link carries max(worker out, worker in) per step, S servers share")
    add("   max(servers in, servers out). With the same bandwidth on every host, the servers are no bottleneck")
    add("   when none of them moves more per step than a worker does:")
    add("   S_bw = ceil(max(servers in, servers out) / max(worker out, worker in))")
    add(f"        = ceil({_size(max(p.servers_in, p.servers_out))} / {_size(max(p.worker_out, p.worker_in))}) = "
        f"ceil({_ratio(max(p.servers_in, p.servers_out) / max(p.worker_out, p.worker_in))}) = {p.servers_bandwidth}")
    add("")
    add(f"4. Memory bound: a row takes (dim + optimizer floats) x {b} B + {INDEX_BYTES_PER_ROW} B index on "
        "a server:")
    for t in p.tables:
        s = t.spec
        add(f"   '{s.name}' {_n(s.rows)} x (({_n(s.dim)} + {_n(t.optimizer_floats)} {s.optimizer}) x {b} + "
            f"{INDEX_BYTES_PER_ROW}) B = {_size(t.state_bytes)}")
    add(f"   all tables {_size(p.state_bytes)} x replication {r} = {_size(p.state_bytes * r)}; usable per "
        f"server {_n(i.memory_gib)} GiB x {_n(Fraction(i.memory_fraction))} = {_size(p.usable_bytes_per_server)}")
    add(f"   S_mem = ceil({_size(p.state_bytes * r)} / {_size(p.usable_bytes_per_server)}) = "
        f"ceil({_ratio(p.state_bytes * r / p.usable_bytes_per_server)}) = {p.servers_memory}")
    add("")
    add(f"5. Servers: S = max(S_bw {p.servers_bandwidth}, S_mem {p.servers_memory}, replication {r}) = "
        f"{p.servers}, decided by {' and '.join(p.decided_by)}"
        + (" (the copies of a shard go to different servers)" if "replication" in p.decided_by else ""))
    add("")
    add(f"6. Virtual shards: the smallest power of two >= max({MIN_VSHARDS}, {VSHARDS_PER_SERVER} x S = "
        f"{VSHARDS_PER_SERVER * p.servers}): V = {p.vshards}")
    spread = (f"{p.shards_per_server_max}" if p.shards_per_server_min == p.shards_per_server_max
              else f"{p.shards_per_server_min} or {p.shards_per_server_max}")
    add(f"   round-robin placement (shard v on server v mod S): {spread} per server, most-loaded / mean = "
        f"{p.shard_imbalance:.3f}")
    add(f"   ({VSHARDS_PER_SERVER} or more per server keep that under 1 + 1/{VSHARDS_PER_SERVER}, and a shard a "
        f"small unit, 1/{VSHARDS_PER_SERVER} of a server's keys or less,")
    add("   for moving load later; Tessera does not migrate shards yet)")
    nodes = 1 + p.servers + w
    add("   no more than that: every node gets the whole map, and the coordinator's failover step grows with")
    add(f"   nodes x shards, here {nodes} x {p.vshards} = {_n(nodes * p.vshards)} "
        "(docs/scaling.md: 7 ms at 110,000, 3 s at 11,000,000)")
    add("")
    add(f"7. Step time, network lower bound: max(worker out, worker in) / {gbps} = "
        f"{_size(max(p.worker_out, p.worker_in))} / {gbps} = {_ms(p.step_seconds)}")
    add(f"   each of the {p.servers} servers per step: in {_size(p.servers_in / p.servers)}, "
        f"out {_size(p.servers_out / p.servers)}: {_ms(p.server_step_seconds)}")
    add("")
    if config_note:
        add(config_note)
    add("Suggested cluster section:")
    add("")
    return "\n".join(out) + "\n" + _cluster_yaml(p)


def _json_number(x):
    if isinstance(x, Fraction):
        return x.numerator if x.denominator == 1 else float(x)
    return x


def to_json(p: Plan) -> dict:
    i = p.inputs
    return {
        "inputs": {"workers": i.workers, "bandwidth_gbps": _json_number(i.bandwidth_gbps),
                   "memory_gib": _json_number(Fraction(i.memory_gib)), "replication": i.replication,
                   "compression_ratio": _json_number(Fraction(i.compression_ratio)),
                   "value_bytes": i.value_bytes, "memory_fraction": _json_number(Fraction(i.memory_fraction))},
        "tables": [{"name": t.spec.name, "kind": t.spec.kind, "rows": t.spec.rows, "dim": t.spec.dim,
                    "rows_per_step": t.spec.rows_per_step, "optimizer": t.spec.optimizer,
                    "rows_moved": t.spec.rows_moved, "push_bytes": _json_number(t.push_bytes),
                    "pull_key_bytes": t.pull_key_bytes, "pull_reply_bytes": t.pull_reply_bytes,
                    "forward_bytes": t.forward_bytes, "optimizer_floats": t.optimizer_floats,
                    "row_bytes": t.row_bytes, "state_bytes": t.state_bytes} for t in p.tables],
        "worker_out_bytes": _json_number(p.worker_out),
        "worker_in_bytes": p.worker_in,
        "servers_in_bytes": _json_number(p.servers_in),
        "servers_out_bytes": _json_number(p.servers_out),
        "servers_bandwidth": p.servers_bandwidth,
        "state_bytes": p.state_bytes,
        "usable_bytes_per_server": _json_number(p.usable_bytes_per_server),
        "servers_memory": p.servers_memory,
        "servers": p.servers,
        "decided_by": list(p.decided_by),
        "vshards": p.vshards,
        "shards_per_server": {"min": p.shards_per_server_min, "max": p.shards_per_server_max},
        "shard_imbalance": p.shard_imbalance,
        "step_seconds": p.step_seconds,
        "server_step_seconds": p.server_step_seconds,
        "cluster": p.cluster(),
    }


# --------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------

DESCRIPTION = """\
Suggest cluster.servers and cluster.vshards for a model, and show the
arithmetic. Inputs: the model's tables (--model FILE and/or --table), the
number of workers, each host's network bandwidth, a server host's memory,
the replication. Nothing is started.

Per step every worker pushes and pulls each table once: a dense table all
its rows, a sparse one its rows_per_step. Servers are needed for two
reasons: to carry that traffic (all servers move W times a worker's bytes,
plus the copies primaries forward to R - 1 backups; with equal bandwidth a
server must not move more per step than a worker), and to hold the rows
with their optimizer state, R times. S = max(bandwidth bound, memory bound,
R). V = the smallest power of two of at least 64 and 16 x S.

A model file (configs/models/plan_example.yaml) is YAML:
  optimizer: adam                # optional: for tables without their own
  tables:
    - {name: mlp, kind: dense, rows: 2048, dim: 512}
    - {name: emb, kind: sparse, rows: 10000000, dim: 64, rows_per_step: 30000,
       optimizer: adagrad}
rows_per_step: the distinct rows one worker touches per step. Optimizers
(floats of state per row): sgd, accumulate 0; momentum, adagrad dim; adam
2 x dim + 1; ftrl 2 x dim.
"""

EPILOG = """\
examples:
  tessera-launch plan --model configs/models/plan_example.yaml --workers 8 --bandwidth-gbps 25
  tessera-launch plan --table mlp:dense:2048:512 --table emb:sparse:10000000:64:30000 \\
                      --workers 16 --bandwidth-gbps 100 --replication 2 --json
  tessera-launch plan --model configs/models/plan_example.yaml --config configs/dlrm.yaml --bandwidth-gbps 10

exit status:
  0    the plan was printed
  2    bad arguments, model file or config

docs/launcher.md ("tessera-launch plan") has the formulas.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _fraction(low_open: bool = True, high=None):
    def parse(text: str) -> Fraction:
        try:
            value = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if value <= 0 or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"must be in (0, {high}], got {text!r}" if high is not None else f"must be positive, got {text!r}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tables = parser.add_argument_group("the model")
    tables.add_argument("--model", metavar="FILE",
                        help="YAML file with a `tables` list (see above); may be combined with --table")
    tables.add_argument("--table", action="append", default=[], metavar="NAME:KIND:ROWS:DIM[:ROWS_PER_STEP]",
                        help="a table: KIND dense or sparse, ROWS its rows, DIM floats per row; ROWS_PER_STEP "
                             "(sparse only, required) the distinct rows one worker touches per step; repeatable")
    tables.add_argument("--optimizer", choices=list(OPTIMIZERS),
                        help="optimizer of tables that name none (--table ones, and model tables without "
                             "one; over the model file's own default); its state counts toward memory "
                             "(default sgd: none)")
    cluster = parser.add_argument_group("the cluster")
    cluster.add_argument("--workers", type=_positive_int, metavar="W",
                         help="number of workers; required unless --config gives cluster.workers")
    cluster.add_argument("--bandwidth-gbps", type=_positive_float, metavar="B", required=True,
                         help="network bandwidth of every host, each direction, in Gbit/s (10^9 bit/s); "
                              "required")
    cluster.add_argument("--memory-gib", type=_fraction(), default=DEFAULT_MEMORY_GIB, metavar="M",
                         help=f"memory of a server host in GiB (default {DEFAULT_MEMORY_GIB})")
    cluster.add_argument("--memory-fraction", type=_fraction(high=1), default=DEFAULT_MEMORY_FRACTION,
                         metavar="F",
                         help=f"share of it the rows may use (default {float(DEFAULT_MEMORY_FRACTION):g}; "
                              "the rest: messages in flight, copies, the OS)")
    cluster.add_argument("--replication", type=_positive_int, metavar="R",
                         help="copies of each shard: memory x R, and each push forwarded to R - 1 backups "
                              "(default: --config's cluster.replication, else 1)")
    cluster.add_argument("--compression-ratio", type=_fraction(high=1), default=Fraction(1), metavar="C",
                         help="compressed / raw size of pushed values (e.g. 0.25; default 1: none); keys, "
                              "pull replies and forwards to backups are not compressed")
    cluster.add_argument("--value-bytes", type=_positive_int, default=4, metavar="N",
                         help="bytes per value, on the wire and stored (default 4: Tessera's fp32)")
    cluster.add_argument("--config", metavar="FILE",
                         help="a job config: its cluster.workers and cluster.replication are the defaults of "
                              "--workers and --replication, and its servers and vshards are shown next to "
                              "the plan")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of the explanation")


def inputs_from_args(args) -> tuple:
    """(PlanInputs, a line about --config or None) from the parsed arguments."""
    config = load_config(args.config) if args.config else None
    workers = args.workers or (config.cluster.workers if config else None)
    if workers is None:
        raise PlanError("--workers is required (or a --config with cluster.workers)")
    replication = args.replication or (config.cluster.replication if config else 1)
    tables = list(load_model(args.model, args.optimizer)) if args.model else []
    tables += [parse_table_flag(text, args.optimizer or "sgd") for text in args.table]
    if not tables:
        raise PlanError("no tables: give --model FILE or --table NAME:KIND:ROWS:DIM[:ROWS_PER_STEP]")
    note = None
    if config:
        note = (f"The config {args.config} has servers {config.cluster.servers}, workers {config.cluster.workers}, "
                f"vshards {config.cluster.vshards}, replication {config.cluster.replication}.")
    return PlanInputs(tables=tuple(tables), workers=workers, bandwidth_gbps=args.bandwidth_gbps,
                      memory_gib=args.memory_gib, replication=replication,
                      compression_ratio=args.compression_ratio, value_bytes=args.value_bytes,
                      memory_fraction=args.memory_fraction), note


def run(args) -> int:
    """`tessera-launch plan`: prints the plan; PlanError and ConfigError go
    to the caller (status 2)."""
    inputs, note = inputs_from_args(args)
    result = plan(inputs)
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        sys.stdout.write(explain(result, note))
    return 0
