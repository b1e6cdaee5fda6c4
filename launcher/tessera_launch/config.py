"""Loading, overriding and validating Tessera job configs.

A job config is a YAML file with four sections: `job`, `cluster`, `timeouts`
and `worker`, optional sections of their own for the transports (`rdma`,
`shm`, `coalesce`) and the rest (`metrics`, `checkpoints`, ...), one
optional section per back-end that needs settings of its own: `mpirun`,
`slurm`, `ssh`, `kubernetes`, and an optional list of process faults,
`faults` (faults.py; configs/README.md documents every key). `load_config`
reads one, applies `--set key.path=value` overrides, fills in defaults and
validates strictly. Every problem raises ConfigError; its message names
where the bad value came from (`FILE:LINE`, `FILE`, or `--set ...`) and the
key path, e.g.

    configs/x.yaml:9: cluster.servers must be a positive integer, got "two"

All problems found are reported together, one per line. Nothing here starts a
process or writes a file.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import yaml

from .faults import FAULT_KEYS, render_value as _render, validate_faults

#: cluster.transport: tcp and ipc are ZeroMQ's schemes, zmq means tcp, rdma
#: and auto bind the same tcp endpoints as tcp (ZeroMQ over tcp is the
#: fallback; the RDMA transport listens on the same host:port).
TRANSPORTS = ("tcp", "ipc", "zmq", "rdma", "auto")
#: The transports that do not use RDMA at all.
ZMQ_TRANSPORTS = ("tcp", "ipc", "zmq")

#: Smallest shm.ring_bytes.
MIN_RING_BYTES = 1 << 20
#: Largest byte count a key may hold (a signed 64-bit integer in the programs).
MAX_BYTES = (1 << 63) - 1
#: Largest coalesce.max_delay_us (a minute; far past any useful wait, and far
#: below where the programs' nanosecond arithmetic would overflow).
MAX_DELAY_US = 60_000_000

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ARG_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

#: Codec mapping keys that the programs' spec strings spell differently.
CODEC_OPTION_ALIASES = {"error_feedback": "ef", "part_elements": "part"}

#: Flags the launcher passes to every worker program itself; worker.args may
#: not use them.
RESERVED_WORKER_FLAGS = ("coordinator", "rank", "name", "bind", "transfer_part_bytes",
                         "transfer_row_piece_bytes", "transfer_max_bytes_in_flight_per_server")

#: The workers' default of transfer.row_piece_bytes (common/message.h
#: kDefaultRowPieceBytes; tests/launcher_e2e/test_defaults.py checks that
#: the two agree): the flag is passed only when the config sets another value.
DEFAULT_ROW_PIECE_BYTES = 2 << 20


class ConfigError(Exception):
    """A config could not be loaded or is invalid. str() is the full message,
    one problem per line, each naming its source and key path."""


# --------------------------------------------------------------------------
# The resolved config
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSection:
    name: str = "tessera-job"


@dataclass(frozen=True)
class ClusterSection:
    servers: int = 1
    workers: int = 1
    vshards: int = 64
    server_weights: list = dataclasses.field(default_factory=list)  # empty: all equal
    max_servers: int = 0  # 0: servers (the job does not grow)
    max_workers: int = 0  # 0: workers (no worker joins while the job runs)
    transport: str = "tcp"
    host: str = "127.0.0.1"
    on_worker_loss: str = "stop"
    replication: int = 2
    on_shard_loss: str = "stop"

    @property
    def bind_scheme(self) -> str:
        """The ZeroMQ scheme processes bind: ipc for `ipc`, else tcp (rdma
        and auto listen on the same tcp endpoints as tcp)."""
        return "ipc" if self.transport == "ipc" else "tcp"

    @property
    def wire(self) -> str:
        """--transport: zmq (tcp, ipc, zmq), rdma or auto."""
        return "zmq" if self.transport in ZMQ_TRANSPORTS else self.transport


@dataclass(frozen=True)
class RdmaSection:
    required: bool = False
    pool_bytes: int = 64 << 20
    max_pinned_bytes: int = 1 << 30

    @property
    def pinned_bytes(self) -> int:
        """What one process may pin at most: its eager pool and its
        registration cache (the memlock limit it needs)."""
        return self.pool_bytes + self.max_pinned_bytes


@dataclass(frozen=True)
class ShmSection:
    enabled: bool = True
    min_frame_bytes: int = 64 << 10
    ring_bytes: int = 64 << 20
    cross_memory: bool = True
    min_lend_bytes: int = 2 << 20


@dataclass(frozen=True)
class CoalesceSection:
    enabled: bool = True
    max_message_bytes: int = 16 << 10
    max_batch_bytes: int = 64 << 10
    max_delay_us: int = 1000


@dataclass(frozen=True)
class TimeoutsSection:
    assemble_seconds: float = 30
    heartbeat_seconds: float = 1
    lease_seconds: float = 5
    rejoin_seconds: float = 60
    server_lease_seconds: float = 0.5
    server_heartbeat_seconds: float = 0.1  # node/timing_defaults.h kDefaultServerHeartbeatInterval
    coordinator_give_up_seconds: float = 60


@dataclass(frozen=True)
class TransferSection:
    part_bytes: int = 0  # 0: one part per server
    row_piece_bytes: int = DEFAULT_ROW_PIECE_BYTES  # with part_bytes 0: wider pushed rows go in pieces; 0: whole
    max_bytes_in_flight_per_server: int = 0  # 0: unbounded

    def worker_flags(self) -> list:
        """The worker flags (worker/worker_flags.h) for the values that are
        set; none for the defaults, so that programs without these flags
        still run."""
        flags = []
        if self.part_bytes:
            flags += ["--transfer_part_bytes", str(self.part_bytes)]
        if self.row_piece_bytes != DEFAULT_ROW_PIECE_BYTES:
            flags += ["--transfer_row_piece_bytes", str(self.row_piece_bytes)]
        if self.max_bytes_in_flight_per_server:
            flags += ["--transfer_max_bytes_in_flight_per_server", str(self.max_bytes_in_flight_per_server)]
        return flags


@dataclass(frozen=True)
class WorkerSection:
    program: str
    args: dict = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class MpirunSection:
    command: str = "mpirun"
    hostfile: str = ""
    args: list = dataclasses.field(default_factory=lambda: ["--oversubscribe"])


@dataclass(frozen=True)
class SlurmSection:
    srun_args: list = dataclasses.field(default_factory=list)
    sbatch_args: list = dataclasses.field(default_factory=list)
    partition: str = ""
    time_limit: str = ""
    nodes: int = 0


@dataclass(frozen=True)
class SshSection:
    hostfile: str = ""
    args: list = dataclasses.field(default_factory=list)
    python: str = "/usr/bin/python3"
    launcher: str = ""
    build_dir: str = ""
    run_dir: str = ""
    connect_timeout_seconds: float = 5


@dataclass(frozen=True)
class KubernetesSection:
    namespace: str = "default"
    image: str = "tessera:latest"
    image_pull_policy: str = "IfNotPresent"
    build_dir: str = "/opt/tessera/build"
    port: int = 7000


@dataclass(frozen=True)
class MetricsSection:
    port: int = 0
    host: str = "127.0.0.1"

    def port_of(self, role: str, rank: int, servers: int) -> int:
        """The metrics port of server-R (port + R) or worker-R (port +
        servers + R); 0 when metrics are off."""
        if self.port == 0:
            return 0
        return self.port + rank + (servers if role == "worker" else 0)

    def coordinator_port(self, servers: int, workers: int) -> int:
        """The leading coordinator's metrics port (port + servers +
        workers); 0 when metrics are off."""
        return self.port + servers + workers if self.port else 0


@dataclass(frozen=True)
class CheckpointsSection:
    dir: str = ""
    every_seconds: float = 0
    keep: int = 3
    restore_from: str = ""


@dataclass(frozen=True)
class DiskSection:
    dir: str = "disk"
    store: str = "bucket"


@dataclass(frozen=True)
class LimitsSection:
    max_keys_per_request: int = 1 << 26
    max_table_mb: Union[int, str] = "auto"
    max_held_per_peer: int = 1024
    max_message_mb: int = 256  # common/message.h kDefaultMaxMessageBytes
    max_mb_in_flight_per_peer: int = 1024
    max_requests_in_flight_per_peer: int = 65536


@dataclass(frozen=True)
class SecuritySection:
    curve: bool = True
    keys_file: str = ""


@dataclass(frozen=True)
class RebalanceSection:
    threshold: float = 0
    interval_seconds: float = 10
    request_cost_bytes: float = 1024
    move_timeout_seconds: float = 60


@dataclass(frozen=True)
class CoordinatorSection:
    etcd: str = ""
    standbys: int = 0
    etcd_lease_seconds: float = 2

    def node_address(self, job_key: str) -> str:
        """Where servers and workers find the leading coordinator:
        etcd://HOST:PORT[,...]/JOB_KEY ("" without etcd)."""
        if not self.etcd:
            return ""
        hosts = [e.strip().removeprefix("http://").rstrip("/") for e in self.etcd.split(",") if e.strip()]
        return f"etcd://{','.join(hosts)}/{job_key}"


@dataclass(frozen=True)
class AuditSection:
    dir: str = ""


@dataclass(frozen=True)
class MessageFaultsSection:
    spec: str = ""


@dataclass(frozen=True)
class JobConfig:
    """A validated job config with every default filled in.

    `source` is the file it was read from and `overrides` the `--set`
    arguments applied on top, in order.
    """

    job: JobSection
    cluster: ClusterSection
    timeouts: TimeoutsSection
    worker: WorkerSection
    source: str
    overrides: tuple = ()
    mpirun: MpirunSection = dataclasses.field(default_factory=MpirunSection)
    slurm: SlurmSection = dataclasses.field(default_factory=SlurmSection)
    ssh: SshSection = dataclasses.field(default_factory=SshSection)
    kubernetes: KubernetesSection = dataclasses.field(default_factory=KubernetesSection)
    metrics: MetricsSection = dataclasses.field(default_factory=MetricsSection)
    checkpoints: CheckpointsSection = dataclasses.field(default_factory=CheckpointsSection)
    disk: DiskSection = dataclasses.field(default_factory=DiskSection)
    coordinator: CoordinatorSection = dataclasses.field(default_factory=CoordinatorSection)
    rebalance: RebalanceSection = dataclasses.field(default_factory=RebalanceSection)
    security: SecuritySection = dataclasses.field(default_factory=SecuritySection)
    limits: LimitsSection = dataclasses.field(default_factory=LimitsSection)
    rdma: RdmaSection = dataclasses.field(default_factory=RdmaSection)
    shm: ShmSection = dataclasses.field(default_factory=ShmSection)
    coalesce: CoalesceSection = dataclasses.field(default_factory=CoalesceSection)
    transfer: TransferSection = dataclasses.field(default_factory=TransferSection)
    audit: AuditSection = dataclasses.field(default_factory=AuditSection)
    message_faults: MessageFaultsSection = dataclasses.field(default_factory=MessageFaultsSection)
    faults: tuple = ()  # FaultSpec, in file order

    def to_dict(self) -> dict:
        """The config as plain data, in file order, loadable again (`faults`
        only when there are any)."""
        faults = {"faults": [f.to_dict() for f in self.faults]} if self.faults else {}
        return {
            "job": dataclasses.asdict(self.job),
            "cluster": dataclasses.asdict(self.cluster),
            "timeouts": dataclasses.asdict(self.timeouts),
            "worker": {
                "program": self.worker.program,
                "args": dict(self.worker.args),
            },
            **{name: dataclasses.asdict(getattr(self, name))
               for name in SCHEMA if name not in ("job", "cluster", "timeouts", "worker")},
            **faults,
        }

    def to_yaml(self) -> str:
        """The resolved config as YAML, headed by a comment naming its origin."""
        header = [f"# Resolved job config, from {self.source}"]
        header += [f"# with --set {o}" for o in self.overrides]
        body = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)
        return "\n".join(header) + "\n" + body


# --------------------------------------------------------------------------
# The schema: one Field per key, each with a check and a default
# --------------------------------------------------------------------------

_REQUIRED = object()


@dataclass(frozen=True)
class Field:
    """One config key: `check(value)` returns None when the value is fine,
    otherwise what is wrong (e.g. "must be a positive integer")."""

    check: Callable[[Any], Optional[str]]
    default: Any
    doc: str


def _positive_int(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return "must be a positive integer"
    return None


def _non_negative_int(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return "must be an integer, 0 or more"
    return None


def _byte_count(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_BYTES:
        return "must be a positive integer (bytes)"
    return None


def _byte_count_or_zero(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        return "must be an integer, 0 or more (bytes; 0: off)"
    return None


def _ring_bytes(value: Any) -> Optional[str]:
    if (isinstance(value, bool) or not isinstance(value, int) or not MIN_RING_BYTES <= value <= MAX_BYTES
            or value & (value - 1)):
        return f"must be a power of two of at least {MIN_RING_BYTES} (1 MiB), in bytes"
    return None


def _delay_us(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DELAY_US:
        return f"must be a positive integer (microseconds), at most {MAX_DELAY_US} (a minute)"
    return None


def _positive_number(value: Any) -> Optional[str]:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        return "must be a positive number (seconds)"
    return None


def _non_negative_number(value: Any) -> Optional[str]:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        return "must be a number of seconds, 0 or more"
    return None


def _threshold(value: Any) -> Optional[str]:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not (value == 0 or value > 1)
    ):
        return "must be 0 (off) or a multiple of the mean load above 1, e.g. 1.25"
    return None


def _byte_cost(value: Any) -> Optional[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return "must be a number of bytes, 0 or more"
    return None


def _number_list(value: Any) -> Optional[str]:
    # The entries and the length are checked by _Validator.server_weights,
    # which can name the entry that is wrong.
    if not isinstance(value, list):
        return "must be a list of positive numbers, one per server (empty: all servers weigh the same)"
    return None


def _is_float32_weight(value: Any) -> bool:
    """Whether `value` is a positive number that stays positive and finite
    as the 32-bit float the coordinator keeps it in."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return False
    try:
        as_float32 = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return False
    return 0 < as_float32 < math.inf


def _job_name(value: Any) -> Optional[str]:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        return "must be a name of letters, digits, '.', '_' and '-' (it names the run directory)"
    return None


def _one_of(choices: tuple) -> Callable[[Any], Optional[str]]:
    """A check that the value is one of `choices`."""
    def check(value: Any) -> Optional[str]:
        return None if value in choices else "must be one of " + " | ".join(choices)
    return check


def _int_in(low: int, high: int, meaning: str) -> Callable[[Any], Optional[str]]:
    """A check that the value is an integer in [low, high]; `meaning` ends the message."""
    def check(value: Any) -> Optional[str]:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"must be {meaning}"
        return None
    return check


WORKER_LOSS_POLICIES = ("stop", "continue", "wait")
_transport = _one_of(TRANSPORTS)
_worker_loss = _one_of(WORKER_LOSS_POLICIES)
_pull_policy = _one_of(("Always", "IfNotPresent", "Never"))
_count_or_zero = _int_in(0, 2**63, "a non-negative integer (0: not set)")


def _mib_or_auto(value: Any) -> Optional[str]:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**40:
        return "must be auto (three quarters of each server's memory), 0 (no limit) or a number of MiB up to 2^40"
    return None
_standbys = _int_in(0, 16, "a number of standby coordinators from 0 to 16")


def _etcd_endpoints(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return "must be a string of etcd client URLs (http://HOST:PORT, comma-separated), or empty"
    for part in (p.strip() for p in value.split(",")):
        if not value.strip():
            return None
        rest = part.removeprefix("http://").rstrip("/")
        host, _, port = rest.rpartition(":")
        if part.startswith("https://") or not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
            return f"'{part}' is not an etcd client URL http://HOST:PORT (https is not supported)"
    return None
_port = _int_in(1, 65533, "a port number from 1 to 65533 (it and the next two are used)")
_metrics_port = _int_in(0, 65535, "0 (metrics off) or the first of the ports, up to 65535")


def _boolean(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else "must be true or false"


def _nonempty_string(value: Any) -> Optional[str]:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        return "must be a non-empty string without surrounding spaces"
    return None


def _string(value: Any) -> Optional[str]:
    if not isinstance(value, str) or value != value.strip():
        return "must be a string without surrounding spaces (empty: not set)"
    return None


def _string_list(value: Any) -> Optional[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return "must be a list of non-empty strings"
    return None


def _dns_label(value: Any) -> Optional[str]:
    if not isinstance(value, str) or not _DNS_LABEL_RE.match(value):
        return "must be a DNS label: lower-case letters, digits and '-', at most 63 characters"
    return None


def _worker_args(value: Any) -> Optional[str]:
    if not isinstance(value, dict):
        return "must be a mapping of flag name to value"
    return None


SCHEMA: dict[str, dict[str, Field]] = {
    "job": {
        "name": Field(_job_name, "tessera-job", "job name; names the run directory"),
    },
    "cluster": {
        "servers": Field(_positive_int, 1, "number of tessera-server processes"),
        "workers": Field(_positive_int, 1, "number of worker processes"),
        "vshards": Field(_positive_int, 64, "virtual shards the key space is hashed onto"),
        "server_weights": Field(_number_list, [],
                                "capacity of each server rank, one positive number per server (empty: all equal): "
                                "the first shard map gives each server primaries and copies in proportion"),
        "max_servers": Field(_non_negative_int, 0,
                             "servers the job may grow to while it runs (0: servers): a tessera-server started for "
                             "the next rank joins, empty, and the rebalancer moves shards to it"),
        "max_workers": Field(_non_negative_int, 0,
                             "workers the job may grow to while it runs (0: workers): a worker started for the next "
                             "rank joins at the fastest worker's clock, and the job waits for it from then on"),
        "transport": Field(_transport, "tcp",
                           "tcp | ipc (ZeroMQ) | zmq (= tcp) | rdma | auto (RDMA where usable, else ZeroMQ over "
                           "tcp)"),
        "host": Field(_nonempty_string, "127.0.0.1", "address processes bind and advertise (all transports but ipc)"),
        "replication": Field(_positive_int, 2,
                             "copies of each virtual shard (capped at servers); with 2 or more a lost server "
                             "fails over to its backups"),
        "on_shard_loss": Field(_one_of(("stop", "restore")), "stop",
                               "when a shard loses every copy: stop (fail the job naming it) or restore (from the "
                               "last checkpoint, reporting what it misses; needs checkpoints.dir)"),
        "on_worker_loss": Field(_worker_loss, "stop",
                                "stop: a lost worker fails the job; continue: the others go on without it; "
                                "wait: its place is kept for a replacement process"),
    },
    "timeouts": {
        "assemble_seconds": Field(_positive_number, 30, "time for every process to register"),
        "heartbeat_seconds": Field(_positive_number, 1, "heartbeat interval"),
        "lease_seconds": Field(_positive_number, 5, "silence after which a node is lost"),
        "rejoin_seconds": Field(_positive_number, 60,
                                "on_worker_loss: wait: how long a lost worker's place is kept"),
        "server_heartbeat_seconds": Field(_positive_number, 0.1,
                                          "how often servers heartbeat (within server_lease_seconds)"),
        "server_lease_seconds": Field(_positive_number, 0.5,
                                      "with replication: silence after which a server is lost and fails over"),
        "coordinator_give_up_seconds": Field(_positive_number, 60,
                                             "coordinator silence after which a server gives up and exits; "
                                             "shorter ones (partitions, coordinator failover) are waited out"),
    },
    "worker": {
        "program": Field(_nonempty_string, _REQUIRED, "worker program: build-tree name or path"),
        "args": Field(_worker_args, {}, "passed to the program as --key value"),
    },
    "mpirun": {
        "command": Field(_nonempty_string, "mpirun", "the mpirun program"),
        "hostfile": Field(_string, "", "passed as --hostfile (empty: this machine)"),
        "args": Field(_string_list, ["--oversubscribe"], "more mpirun arguments"),
    },
    "slurm": {
        "srun_args": Field(_string_list, [], "more srun arguments"),
        "sbatch_args": Field(_string_list, [], "more #SBATCH lines (--submit)"),
        "partition": Field(_string, "", "--partition (empty: the cluster's default)"),
        "time_limit": Field(_string, "", "--time (empty: the partition's default)"),
        "nodes": Field(_count_or_zero, 0, "--nodes (0: as Slurm sees fit)"),
    },
    "ssh": {
        "hostfile": Field(_string, "", "the hosts, their roles and slots"),
        "args": Field(_string_list, [], "more ssh arguments (-i KEY, -F FILE, -o OPTION=VALUE)"),
        "python": Field(_nonempty_string, "/usr/bin/python3", "Python on the hosts"),
        "launcher": Field(_string, "", "tessera-launch on the hosts (empty: this one's path)"),
        "build_dir": Field(_string, "", "the build tree on the hosts (empty: this one's path)"),
        "run_dir": Field(_string, "", "the run directory on the hosts (empty: this one's path)"),
        "connect_timeout_seconds": Field(_positive_number, 5, "ssh connection timeout"),
    },
    "kubernetes": {
        "namespace": Field(_dns_label, "default", "namespace of every object"),
        "image": Field(_nonempty_string, "tessera:latest", "container image with the build tree"),
        "image_pull_policy": Field(_pull_policy, "IfNotPresent", "Always | IfNotPresent | Never"),
        "build_dir": Field(_nonempty_string, "/opt/tessera/build", "the build tree inside the image"),
        "port": Field(_port, 7000, "coordinator port; servers use port+1, workers port+2"),
    },
    "checkpoints": {
        "dir": Field(_string, "", "where servers write checkpoints (relative: in the run directory); empty: none"),
        "every_seconds": Field(_non_negative_number, 0, "seconds between checkpoints; 0: only on SIGUSR1"),
        "keep": Field(_positive_int, 3, "checkpoints kept per server rank"),
        "restore_from": Field(_string, "", "start the job from the checkpoints in this directory; empty: no"),
    },
    "disk": {
        "dir": Field(_nonempty_string, "disk",
                     "where each server keeps the rows of tables made with disk_tier (rows over the table's "
                     "memory_budget_bytes; docs/embeddings.md): relative: in the run directory; put it on a fast "
                     "local disk. Each server process uses DIR/tessera-HOST-PID/, removed when it exits"),
        "store": Field(_one_of(("bucket", "log", "rocks")), "bucket",
                       "bucket (a hash table in files, no memory per row), log (a log of records, its index in "
                       "memory: 11-22 bytes a row on disk, sequential writes) or rocks (RocksDB: about 3 bytes of "
                       "memory a row, sequential writes, background compactions)"),
    },
    "rebalance": {
        "threshold": Field(_threshold, 0,
                           "move virtual shards off a server whose load per unit of weight passes this multiple "
                           "of the mean (e.g. 1.25), one at a time; 0: never"),
        "interval_seconds": Field(_positive_number, 10, "time between rebalancing decisions (at most one move each)"),
        "request_cost_bytes": Field(_byte_cost, 1024,
                                    "what one request costs a server, in bytes of data (load = bytes in and out "
                                    "per second + this per request)"),
        "move_timeout_seconds": Field(_positive_number, 60,
                                      "a shard move not finished by then is given up (the shard stays)"),
    },
    "coordinator": {
        "etcd": Field(_etcd_endpoints, "",
                      "etcd client URLs (http://HOST:PORT, comma-separated) where the coordinator keeps its state "
                      "and its leader is elected; empty: a state file in the run directory"),
        "standbys": Field(_standbys, 0,
                          "standby coordinators (needs etcd; every back-end but kubernetes): they take over when "
                          "the leader's etcd lease runs out"),
        "etcd_lease_seconds": Field(_positive_number, 2,
                                    "the leader's etcd lease: a standby takes over this long after the leader "
                                    "dies (etcd's minimum is 2)"),
    },
    "security": {
        "curve": Field(_boolean, True,
                       "authenticate and encrypt every connection with the job's CURVE key pair; false leaves "
                       "the job's ports open to anyone who can reach them (a warning says so)"),
        "keys_file": Field(_string, "",
                           "the job key file (tessera-keys; mode 0600) at the same path on every host; empty: "
                           "the launcher makes RUN/job.keys"),
    },
    "limits": {
        "max_keys_per_request": Field(_positive_int, 1 << 26, "servers refuse a push or pull of more keys"),
        "max_table_mb": Field(_mib_or_auto, "auto",
                              "servers refuse what would grow a table past this many MiB of rows each; auto: three "
                              "quarters of the memory each server may use (its host's, or its cgroup's limit); "
                              "0: no limit"),
        "max_held_per_peer": Field(_positive_int, 1024,
                                   "requests of one worker a server holds at once for slower workers"),
        "max_message_mb": Field(_int_in(1, 1 << 20, "an integer from 1 to 1048576"), 256,
                                "largest message a server accepts; workers split their requests to fit it"),
        "max_mb_in_flight_per_peer": Field(_int_in(1, 1 << 30, "an integer from 1 to 1073741824"), 1024,
                                           "MiB of answers to one worker a server keeps waiting to be written out "
                                           "(the worker reads slower than it asks); past it the worker's requests "
                                           "are answered busy and it asks again later"),
        "max_requests_in_flight_per_peer": Field(_int_in(1, 1 << 30, "an integer from 1 to 1073741824"), 65536,
                                                 "answers (pull reply pieces one each) to one worker a server keeps "
                                                 "waiting to be written out; past it busy, as above"),
    },
    "rdma": {
        "required": Field(_boolean, False,
                          "true: a process that cannot use RDMA fails instead of falling back to ZeroMQ (needs "
                          "cluster.transport rdma or auto)"),
        "pool_bytes": Field(_byte_count, 64 << 20, "registered eager buffers per process"),
        "max_pinned_bytes": Field(_byte_count, 1 << 30,
                                  "bound of each process's registration cache; at least rdma.pool_bytes"),
    },
    "shm": {
        "enabled": Field(_boolean, True, "same-host large frames go through shared-memory rings"),
        "min_frame_bytes": Field(_byte_count, 64 << 10, "frames at least this big take the ring"),
        "ring_bytes": Field(_ring_bytes, 64 << 20,
                            "ring size per sender->receiver pair: a power of two, at least 1 MiB and "
                            "2 * shm.min_frame_bytes"),
        "cross_memory": Field(_boolean, True,
                              "a server lends large pull values to a same-host worker, which copies them "
                              "straight into its buffer (one copy instead of two; needs ptrace rights over "
                              "the server, else the ring is used)"),
        "min_lend_bytes": Field(_byte_count, 2 << 20,
                                "pull values of at least this many bytes are lent (shm.cross_memory); smaller "
                                "ones take the ring"),
    },
    "coalesce": {
        "enabled": Field(_boolean, True,
                         "small messages to one peer made close together go as one batch message (every process "
                         "takes batches apart either way)"),
        "max_message_bytes": Field(_byte_count, 16 << 10,
                                   "the largest message (header and frames) that is held to go with others"),
        "max_batch_bytes": Field(_byte_count, 64 << 10,
                                 "the most one batch holds; at least coalesce.max_message_bytes"),
        "max_delay_us": Field(_delay_us, 1000,
                              "the longest a worker's held request waits when nothing else sends it, in "
                              "microseconds"),
    },
    "transfer": {
        "part_bytes": Field(_byte_count_or_zero, 0,
                            "workers split each server's share of a push or pull into parts of at most this many "
                            "value bytes (at least one row, but a pushed row wider than this goes in pieces of "
                            "columns, except compressed pushes and ADAM tables); 0: one part per server"),
        "row_piece_bytes": Field(_byte_count_or_zero, DEFAULT_ROW_PIECE_BYTES,
                                 "with transfer.part_bytes 0: a pushed row wider than this many bytes goes in pieces "
                                 "of this many bytes, which the server updates as they arrive (not compressed "
                                 "pushes, not ADAM tables); 0: whole rows"),
        "max_bytes_in_flight_per_server": Field(_byte_count_or_zero, 0,
                                                "value bytes a worker has sent to one server and not seen answered; "
                                                "more parts wait, lower priority numbers first (one part always "
                                                "goes); 0: unbounded"),
    },
    "audit": {
        "dir": Field(_string, "",
                     "audit mode for fault experiments: servers keep the pushes applied to every row and write "
                     "them here at the end (tests/audit/audit_check.py reads them); a path every host sees; "
                     "empty: off"),
    },
    "message_faults": {
        "spec": Field(_string, "",
                      "message faults every process of the job applies (docs/fault_injection.md: e.g. "
                      "seed=3,drop=0.01,reorder=0.02,side=send); empty: none"),
    },
    "metrics": {
        "port": Field(_metrics_port, 0, "first Prometheus port: server-R port+R, worker-R port+servers+R, the coordinator "
                                           "port+servers+workers; 0: off"),
        "host": Field(_nonempty_string, "127.0.0.1", "address the metrics endpoints listen on"),
    },
}

#: Sections that only one back-end reads.
BACKEND_SECTIONS = ("mpirun", "slurm", "ssh", "kubernetes")

_SECTION_TYPES = {
    "job": JobSection,
    "cluster": ClusterSection,
    "timeouts": TimeoutsSection,
    "worker": WorkerSection,
    "mpirun": MpirunSection,
    "slurm": SlurmSection,
    "metrics": MetricsSection,
    "checkpoints": CheckpointsSection,
    "disk": DiskSection,
    "coordinator": CoordinatorSection,
    "rebalance": RebalanceSection,
    "security": SecuritySection,
    "limits": LimitsSection,
    "rdma": RdmaSection,
    "shm": ShmSection,
    "coalesce": CoalesceSection,
    "transfer": TransferSection,
    "audit": AuditSection,
    "message_faults": MessageFaultsSection,
    "ssh": SshSection,
    "kubernetes": KubernetesSection,
}


#: Top-level keys that are not sections of SCHEMA: the list of process faults.
LIST_KEYS = ("faults",)


def all_key_paths() -> list[str]:
    """Every documented key path, e.g. "cluster.servers", and
    "faults[].target" for the keys of a fault entry."""
    return ([f"{s}.{k}" for s, fields in SCHEMA.items() for k in fields]
            + [f"faults[].{k}" for k in FAULT_KEYS])


# --------------------------------------------------------------------------
# YAML loading that remembers line numbers and rejects duplicate keys
# --------------------------------------------------------------------------


class _MarkedDict(dict):
    """A mapping read from YAML that remembers the (1-based) line of each key."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_lines: dict = {}

    def __deepcopy__(self, memo):
        clone = _MarkedDict({k: copy.deepcopy(v, memo) for k, v in self.items()})
        clone.key_lines = dict(self.key_lines)
        return clone


class _MarkedList(list):
    """A list read from YAML that remembers the (1-based) line of each item."""

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list = []

    def __deepcopy__(self, memo):
        clone = _MarkedList(copy.deepcopy(v, memo) for v in self)
        clone.item_lines = list(self.item_lines)
        return clone


def _plain(value: Any) -> Any:
    """`value` with every _MarkedDict and _MarkedList made a plain dict and
    list (the resolved config holds plain data, which yaml.safe_dump writes)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mappings are _MarkedDicts and that refuses a key given
    twice in one mapping (plain PyYAML silently keeps the last one)."""


def _construct_marked_mapping(loader: _StrictLoader, node: yaml.MappingNode):
    result = _MarkedDict()
    yield result
    explicit = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
    seen: dict = {}
    for key_node in explicit:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r} (first given on line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1


def _construct_marked_sequence(loader: _StrictLoader, node: yaml.SequenceNode):
    result = _MarkedList()
    yield result
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.item_lines.append(item.start_mark.line + 1)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_marked_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:seq", _construct_marked_sequence)


def _read_yaml(path: Path) -> Any:
    """Parses the file; raises ConfigError naming the file (and line) on failure."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = e.problem or e.context or "invalid YAML"
        kind = "invalid YAML" if isinstance(e, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{where}: {kind}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: YAML error: {e}") from None


# --------------------------------------------------------------------------
# --set overrides
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Override:
    """One `--set key.path=value`: the path and the value, parsed as YAML."""

    path: tuple
    value: Any
    text: str


def parse_override(text: str) -> Override:
    """Parses "a.b.c=value". The value is read as a YAML scalar (so `3` is an
    integer and `ipc` a string); text YAML cannot parse is taken as a string.
    Raises ConfigError on a malformed argument."""
    key, sep, raw_value = text.partition("=")
    path = tuple(key.strip().split("."))
    if not sep or not key.strip() or any(not part for part in path):
        raise ConfigError(f"--set {text}: expected KEY.PATH=VALUE, e.g. cluster.servers=4")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError:
        value = raw_value
    return Override(path, value, text)


def _list_index(node: list, part: str) -> Optional[int]:
    """`part` as an index of the list `node` ("0" is the first), or None."""
    return int(part) if part.isdigit() and int(part) < len(node) else None


def _apply_override(data: dict, override: Override) -> None:
    """Sets the value at the override's path, making mappings on the way;
    a part that is a number indexes an existing list (faults.0.at_seconds)."""
    node = data
    for depth, part in enumerate(override.path[:-1]):
        prefix = ".".join(override.path[: depth + 1])
        if isinstance(node, list):
            index = _list_index(node, part)
            if index is None:
                raise ConfigError(f"--set {override.text}: {prefix}: the list has {len(node)} entries "
                                  f"(0 to {len(node) - 1})")
            child = node[index]
        else:
            child = node.get(part)
            if child is None:
                child = node[part] = _MarkedDict()
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"--set {override.text}: {prefix} is not a mapping")
        node = child
    last = override.path[-1]
    if isinstance(node, list):
        index = _list_index(node, last)
        if index is None:
            raise ConfigError(f"--set {override.text}: {'.'.join(override.path)}: the list has {len(node)} "
                              f"entries (0 to {len(node) - 1})")
        node[index] = override.value
    else:
        node[last] = override.value


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


class _Validator:
    """Validates raw config data, collecting every problem with its location."""

    def __init__(self, data: dict, source: str, overrides: list):
        self.data = data
        self.source = source
        self.overrides = overrides
        self.errors: list = []

    def where(self, path: tuple) -> str:
        """Where the value at `path` came from: the last --set that covers it,
        else FILE:LINE of the deepest key found in the file, else the --set
        that created the key, else FILE. An integer in `path` indexes a
        list (("faults", 0, "target")); an entry of a list is placed at its
        first key."""
        spath = tuple(str(p) for p in path)
        for override in reversed(self.overrides):
            if spath[: len(override.path)] == override.path:
                return f"--set {override.text}"
        line = None
        node: Any = self.data
        for part in path:
            if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                item_lines = getattr(node, "item_lines", [])
                line = item_lines[part] if part < len(item_lines) else line
                node = node[part]
                continue
            if not isinstance(node, dict) or part not in node:
                break
            line = getattr(node, "key_lines", {}).get(part, line)
            node = node[part]
        if line is None:
            for override in reversed(self.overrides):
                if override.path[: len(spath)] == spath:
                    return f"--set {override.text}"  # the override created it
        return f"{self.source}:{line}" if line else self.source

    def given(self, path: tuple) -> bool:
        """Whether the key at `path` (section, key) is in the file or set
        by an override (not a default)."""
        section = self.data.get(path[0])
        return ((isinstance(section, dict) and path[1] in section)
                or any(o.path[: len(path)] == path for o in self.overrides))

    def error(self, path: tuple, message: str) -> None:
        self.errors.append(f"{self.where(path)}: {message}")

    def unknown_keys(self, mapping: dict, known, path: tuple) -> None:
        for key in mapping:
            if key in known:
                continue
            full = ".".join(path + (str(key),))
            hint = difflib.get_close_matches(str(key), list(known), n=1)
            suggestion = f"; did you mean {'.'.join(path + (hint[0],))}?" if hint else ""
            self.error(path + (key,), f"unknown key {full}{suggestion} (known: {', '.join(known)})")

    def section(self, name: str) -> dict:
        """The section's values after checks, with defaults for missing keys."""
        raw = self.data.get(name)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.error((name,), f"{name} must be a mapping, got {_render(raw)}")
            raw = {}
        fields = SCHEMA[name]
        self.unknown_keys(raw, fields, (name,))
        values = {}
        for key, field in fields.items():
            path = (name, key)
            if key not in raw:
                if field.default is _REQUIRED:
                    self.error(path, f"{name}.{key} is required ({field.doc})")
                else:
                    values[key] = copy.deepcopy(field.default)
                continue
            value = raw[key]
            problem = field.check(value)
            if problem:
                self.error(path, f"{name}.{key} {problem}, got {_render(value)}")
            else:
                values[key] = _plain(value)
        return values

    def worker_args(self, args: dict) -> dict:
        out = dict(args)
        for key, value in args.items():
            path = ("worker", "args", key)
            if not isinstance(key, str) or not _ARG_KEY_RE.match(key):
                self.error(path, f"worker.args key {_render(key)} is not a valid flag name")
            elif key in RESERVED_WORKER_FLAGS:
                self.error(path, f"worker.args.{key} is reserved: the launcher passes --{key} itself")
            elif isinstance(value, dict) and "codec" in value:
                spec = self.codec_spec(path, value)
                if spec is not None:
                    out[key] = spec
            elif value is None or isinstance(value, (dict, list)):
                self.error(path, f"worker.args.{key} must be a string, number, boolean or a codec mapping "
                                 f"({{codec: topk, ratio: 0.01}}), got {_render(value)}")
        return out

    def codec_spec(self, path: tuple, value: dict) -> Optional[str]:
        """A codec mapping ({codec: topk, ratio: 0.01, error_feedback: true})
        as the spec string the programs take ("topk:ratio=0.01,ef=true")."""
        codec = value["codec"]
        if not isinstance(codec, str) or not codec:
            self.error(path + ("codec",), f"codec must be a codec name, got {_render(codec)}")
            return None
        options = []
        for k, v in value.items():
            if k == "codec":
                continue
            if v is None or isinstance(v, (dict, list)) or not isinstance(k, str):
                self.error(path + (str(k),), f"codec option {k} must be a string, number or boolean, got {_render(v)}")
                return None
            name = CODEC_OPTION_ALIASES.get(k, k)
            options.append(f"{name}={str(v).lower() if isinstance(v, bool) else v}")
        return codec + (":" + ",".join(options) if options else "")

    def transport_checks(self, cluster: dict, rdma: dict, shm: dict, coalesce: dict) -> None:
        """rdma.required against cluster.transport; the byte counts against
        each other."""
        transport = cluster.get("transport")
        if rdma.get("required") and transport in ZMQ_TRANSPORTS:
            self.error(("rdma", "required"),
                       f"rdma.required is true, but cluster.transport is {transport}, which never uses RDMA: "
                       "set cluster.transport to rdma or auto, or rdma.required to false")
        if "pool_bytes" in rdma and "max_pinned_bytes" in rdma and rdma["max_pinned_bytes"] < rdma["pool_bytes"]:
            self.error(("rdma", "max_pinned_bytes"),
                       f"rdma.max_pinned_bytes ({rdma['max_pinned_bytes']}) must be at least rdma.pool_bytes "
                       f"({rdma['pool_bytes']})")
        if "min_frame_bytes" in shm and "ring_bytes" in shm and shm["ring_bytes"] < 2 * shm["min_frame_bytes"]:
            self.error(("shm", "ring_bytes"),
                       f"shm.ring_bytes ({shm['ring_bytes']}) must be at least 2 * shm.min_frame_bytes "
                       f"({2 * shm['min_frame_bytes']})")
        if ("max_message_bytes" in coalesce and "max_batch_bytes" in coalesce
                and coalesce["max_batch_bytes"] < coalesce["max_message_bytes"]):
            # Blamed on max_batch_bytes, unless only max_message_bytes was given.
            blamed = "max_batch_bytes" if self.given(("coalesce", "max_batch_bytes")) else "max_message_bytes"
            self.error(("coalesce", blamed),
                       f"coalesce.max_batch_bytes ({coalesce['max_batch_bytes']}) must be at least "
                       f"coalesce.max_message_bytes ({coalesce['max_message_bytes']})")

    def server_weights(self, cluster: dict) -> None:
        """cluster.server_weights: each entry a positive number the
        coordinator can hold (a 32-bit float), one per server or none."""
        weights = cluster.get("server_weights")
        if not weights:
            return
        bad = False
        for i, w in enumerate(weights):
            if not _is_float32_weight(w):
                self.error(("cluster", "server_weights", i),
                           f"cluster.server_weights[{i}] must be a positive number (a server's weight, at most "
                           f"3.4e38), got {_render(w)}")
                bad = True
        if not bad and "servers" in cluster and len(weights) != cluster["servers"]:
            self.error(("cluster", "server_weights"),
                       f"cluster.server_weights has {len(weights)} weights for cluster.servers {cluster['servers']}: "
                       "give one per server rank, or none (all equal)")

    def cross_checks(self, cluster: dict, timeouts: dict) -> None:
        if "vshards" in cluster and "servers" in cluster and cluster["vshards"] < cluster["servers"]:
            self.error(
                ("cluster", "vshards"),
                f"cluster.vshards ({cluster['vshards']}) must be at least cluster.servers ({cluster['servers']})",
            )
        servers = cluster.get("servers", 1)
        if cluster.get("max_servers") and isinstance(servers, int) and cluster["max_servers"] < servers:
            self.error(
                ("cluster", "max_servers"),
                f"cluster.max_servers ({cluster['max_servers']}) must be 0 or at least cluster.servers ({servers})",
            )
        workers = cluster.get("workers", 1)
        if cluster.get("max_workers") and isinstance(workers, int) and cluster["max_workers"] < workers:
            self.error(
                ("cluster", "max_workers"),
                f"cluster.max_workers ({cluster['max_workers']}) must be 0 or at least cluster.workers ({workers})",
            )
        server_heartbeat = timeouts.get("server_heartbeat_seconds", TimeoutsSection.server_heartbeat_seconds)
        server_lease = timeouts.get("server_lease_seconds", TimeoutsSection.server_lease_seconds)
        if (
            "server_heartbeat_seconds" in timeouts or "server_lease_seconds" in timeouts
        ) and _positive_number(server_heartbeat) is None and _positive_number(server_lease) is None and (
            server_lease <= server_heartbeat
        ):
            self.error(
                ("timeouts", "server_lease_seconds"),
                f"timeouts.server_lease_seconds ({server_lease}) must be greater than "
                f"timeouts.server_heartbeat_seconds ({server_heartbeat})",
            )
        if (
            "lease_seconds" in timeouts
            and "heartbeat_seconds" in timeouts
            and timeouts["lease_seconds"] <= timeouts["heartbeat_seconds"]
        ):
            self.error(
                ("timeouts", "lease_seconds"),
                f"timeouts.lease_seconds ({timeouts['lease_seconds']}) must be greater than "
                f"timeouts.heartbeat_seconds ({timeouts['heartbeat_seconds']})",
            )


def validate(data: Any, source: str, overrides: list = ()) -> JobConfig:
    """Validates raw config data (as parsed from YAML, overrides applied).

    Returns the JobConfig with defaults filled in; raises ConfigError listing
    every problem found.
    """
    overrides = list(overrides)
    if data is None:
        data = _MarkedDict()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections "
            f"({', '.join(SCHEMA)}, {', '.join(LIST_KEYS)}), got {_render(data)}"
        )
    checker = _Validator(data, source, overrides)
    checker.unknown_keys(data, list(SCHEMA) + list(LIST_KEYS), ())
    sections = {name: checker.section(name) for name in SCHEMA}
    if "args" in sections["worker"]:
        sections["worker"]["args"] = checker.worker_args(sections["worker"]["args"])
    checker.cross_checks(sections["cluster"], sections["timeouts"])
    checker.server_weights(sections["cluster"])
    checker.transport_checks(sections["cluster"], sections["rdma"], sections["shm"], sections["coalesce"])
    if sections["coordinator"].get("standbys") and not sections["coordinator"].get("etcd"):
        checker.error(("coordinator", "standbys"),
                      "coordinator.standbys needs coordinator.etcd (standbys are elected through etcd)")
    faults = validate_faults(data.get("faults"), sections["cluster"], checker.error)
    if checker.errors:
        raise ConfigError("\n".join(checker.errors))
    return JobConfig(
        **{name: _SECTION_TYPES[name](**values) for name, values in sections.items()},
        source=source,
        overrides=tuple(o.text for o in overrides),
        faults=tuple(faults),
    )


def load_config(path, overrides=()) -> JobConfig:
    """Reads the YAML file at `path`, applies `overrides` (strings of the form
    "key.path=value", in order; later ones win) and validates the result.

    Raises ConfigError (message naming the file, line and key path) on any
    problem: unreadable file, YAML syntax error, duplicate or unknown key,
    wrong type, out-of-range value, malformed override.
    """
    source = str(path)
    data = _read_yaml(Path(path))
    parsed = [parse_override(text) for text in overrides]
    if data is None:
        data = _MarkedDict()
    if parsed and isinstance(data, dict):
        data = copy.deepcopy(data)
        for override in parsed:
            _apply_override(data, override)
    return validate(data, source, parsed)
