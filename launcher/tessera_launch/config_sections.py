"""The resolved job config: JobConfig and one frozen dataclass per section,
every default filled in, as config_validate.validate returns them (the
defaults here and in SCHEMA agree; tests/launcher_e2e/test_defaults.py
checks them against the binaries'). Used by every module that reads a
job's settings (job.py above all), through config.py's re-exports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Union

import yaml

from .config_schema import DEFAULT_ROW_PIECE_BYTES, SCHEMA, ZMQ_TRANSPORTS


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


#: The dataclass of each section of SCHEMA.
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
