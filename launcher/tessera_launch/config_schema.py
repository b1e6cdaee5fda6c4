"""The schema of a job config: every key of every section, with its check,
its default and a line of documentation (SCHEMA, one Field per key), the
limits and names the checks use, and ConfigError, which every problem with
a config raises. Used by config_sections.py (the resolved config),
config_validate.py (checking raw data against the schema), config.py
(loading) and, through config.py's re-exports, by every other module that
reads a config; configs/README.md documents the same keys.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .faults import FAULT_KEYS


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


#: Top-level keys that are not sections of SCHEMA: the list of process faults.
LIST_KEYS = ("faults",)


def all_key_paths() -> list[str]:
    """Every documented key path, e.g. "cluster.servers", and
    "faults[].target" for the keys of a fault entry."""
    return ([f"{s}.{k}" for s, fields in SCHEMA.items() for k in fields]
            + [f"faults[].{k}" for k in FAULT_KEYS])
