"""The job: its config, its run directory and the process contract.

What every back-end needs to know about a job, and nothing about how its
processes start: the arguments every supervising back-end takes
(LocalOptions), where the binaries and the run directory's files are
(Binaries, RunLayout), --skip, the job key file, and the command line and
environment of every process (process_argv, process_env; docs/launcher.md,
"The process contract"). This is the only module that knows the binaries'
flags: every back-end (local, ssh, slurm, mpirun, kubernetes), `tessera-launch
role` (role.py) and `tessera-launch doctor` build their processes' command
lines here, once, for all of them.

A job is made in two steps: load_job (the config with --set applied, the
skip list and the binaries, validated; ConfigError or SetupError before
anything starts), then start_run (the run directory with the resolved
config.yaml, and the job key file). backend.run_job does the rest.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import hashlib
import os
import re
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, TextIO

from . import REPO_ROOT
from .config import CoalesceSection, DiskSection, JobConfig, LimitsSection, RdmaSection, ShmSection, TimeoutsSection, load_config


#: Added to the assemble time to form the servers' --connect-timeout, so
#: that the coordinator, which knows who is missing, reports first.
CONNECT_TIMEOUT_MARGIN_SECONDS = 5.0
#: Longest path of a Unix domain socket (sun_path less the terminating NUL).
MAX_IPC_PATH = 107

_SKIP_RE = re.compile(r"^(server|worker)-(\d+)$")


class SetupError(Exception):
    """The job cannot be set up (missing binary, bad --skip, unusable run
    directory); nothing was started."""


@dataclass
class LocalOptions:
    """The arguments every supervising back-end takes (`tessera-launch
    local`, `mpirun`, `slurm`, `ssh`)."""

    config: str
    run_dir: Optional[str] = None
    build_dir: Optional[str] = None
    overrides: list = field(default_factory=list)
    skip: list = field(default_factory=list)
    timeout: Optional[float] = None
    quiet: bool = False
    debug: bool = False
    dry_run: bool = False
    stream: Optional[TextIO] = None  # the terminal; default sys.stdout
    existing_run_dir: bool = False  # run_dir was prepared already (slurm --submit), config.yaml in it


# --------------------------------------------------------------------------
# Where things are
# --------------------------------------------------------------------------


def resolve_build_dir(flag: Optional[str], environ=os.environ) -> Path:
    """--build-dir, else $TESSERA_BUILD_DIR, else <repo>/build."""
    if flag:
        return Path(flag).resolve()
    if environ.get("TESSERA_BUILD_DIR"):
        return Path(environ["TESSERA_BUILD_DIR"]).resolve()
    return REPO_ROOT / "build"


@dataclass(frozen=True)
class Binaries:
    """The three executables a job runs, and the tools the launcher uses."""

    coordinator: Path
    server: Path
    program: Path
    keys: Path = Path("tessera-keys")
    python: Path = Path("python")  # the build tree's tessera Python package (PYTHONPATH of worker programs)
    doctor_probe: Path = Path("tessera-doctor-probe")  # what `tessera-launch doctor` runs on every host

    @classmethod
    def locate(cls, build_dir: Path, program: str) -> "Binaries":
        """Binaries in the build tree; a program containing '/' is a path
        (relative to the current directory) and is used as is."""
        program_path = Path(program).resolve() if "/" in program else build_dir / "examples" / program
        return cls(
            coordinator=build_dir / "coordinator" / "tessera-coordinator",
            server=build_dir / "server" / "tessera-server",
            program=program_path,
            keys=build_dir / "transport" / "tessera-keys",
            python=build_dir / "python",
            doctor_probe=build_dir / "rdma" / "tessera-doctor-probe",
        )

    def problems(self) -> list:
        """One line per binary that is missing or not executable."""
        found = []
        for role, path in (("coordinator", self.coordinator), ("server", self.server),
                           ("worker program", self.program)):
            if not path.is_file():
                found.append(f"{role} not found: {path}")
            elif not os.access(path, os.X_OK):
                found.append(f"{role} is not executable: {path}")
        return found


class RunLayout:
    """The paths inside a run directory (docs/launcher.md, "Run directory").
    The root is absolute for a real run, since the paths are handed to
    processes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.config = self.root / "config.yaml"
        self.address_file = self.root / "coordinator.address"
        self.coordinator_summary = self.root / "coordinator-summary.json"
        self.progress = self.root / "progress.jsonl"
        self.summary = self.root / "summary.json"
        self.events = self.root / "events.jsonl"
        self.logs = self.root / "logs"
        self.launcher_log = self.logs / "launcher.log"
        self.sockets = self.root / "sock"
        self.control = self.root / "control"

    def socket(self, name: str) -> Path:
        return self.sockets / f"{name}.sock"

    def control_file(self, name: str) -> Path:
        """Where the launcher appends commands for carried process `name`
        (back-ends whose run directory every host shares; supervisor.py)."""
        return self.control / f"{name}.control"


def create_run_dir(requested: Optional[str], job_name: str, now: datetime.datetime) -> Path:
    """Makes the run directory: `requested` (which must not exist or be
    empty), else runs/<job>-<YYYYmmdd-HHMMSS> under the current directory,
    with -2, -3, ... appended if that exists already."""
    if requested:
        path = Path(requested)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise SetupError(f"run directory {path} exists and is not empty; choose another --run-dir")
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = Path("runs") / f"{job_name}-{now.strftime('%Y%m%d-%H%M%S')}"
    path, suffix = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            suffix += 1
            path = base.with_name(f"{base.name}-{suffix}")


def parse_skips(names, config: JobConfig) -> list:
    """Validates --skip names (server-I or worker-I, with I in range)."""
    skips = []
    for name in names:
        match = _SKIP_RE.match(name)
        if not match:
            raise SetupError(f"--skip {name}: expected server-INDEX or worker-INDEX (the coordinator cannot be skipped)")
        role, index = match.group(1), int(match.group(2))
        count = config.cluster.servers if role == "server" else config.cluster.workers
        if index >= count:
            raise SetupError(f"--skip {name}: the job has {count} {role}s ({role}-0 to {role}-{count - 1})")
        if name not in skips:
            skips.append(name)
    return skips


# --------------------------------------------------------------------------
# Command lines (the process contract, docs/launcher.md)
# --------------------------------------------------------------------------


def _seconds(value: float) -> str:
    """A number of seconds as a flag value: "30", "0.5"."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _flag_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def interface_addresses() -> list:
    """The IPv4 addresses of this host's network interfaces (of this network
    namespace), loopback last; empty where they cannot be read."""
    found = []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                raw = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            found.append(socket.inet_ntoa(raw[20:24]))
    return sorted(found, key=lambda a: a.startswith("127."))


def resolve_host(host: str) -> str:
    """cluster.host as a process binds it: `auto` is this machine's address
    (the first non-loopback IPv4 address its host name resolves to; else,
    where the name resolves to nothing else (a container, a namespace, a
    node without DNS), the first non-loopback address of its interfaces;
    else 127.0.0.1); anything else is kept."""
    if host != "auto":
        return host
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM)
        addresses = [info[4][0] for info in infos]
    except OSError:
        addresses = []
    outside = [a for a in addresses if not a.startswith("127.")]
    if outside:
        return outside[0]
    interfaces = [a for a in interface_addresses() if not a.startswith("127.")]
    return (interfaces or addresses or ["127.0.0.1"])[0]


def bind_address(config: JobConfig, layout: RunLayout, name: str, host: Optional[str] = None) -> str:
    """tcp://HOST:0 (the OS picks the port), or ipc://RUNDIR/sock/NAME.sock
    (cluster.transport ipc). HOST is `host` if given, else cluster.host
    (`auto` resolved here). The rdma and auto transports bind the same tcp
    endpoint: ZeroMQ over tcp is their fallback, and RDMA listens on the
    same host:port."""
    if config.cluster.bind_scheme == "tcp":
        return f"tcp://{host or resolve_host(config.cluster.host)}:0"
    path = layout.socket(name)
    if len(str(path)) > MAX_IPC_PATH:
        raise SetupError(f"ipc socket path too long ({len(str(path))} > {MAX_IPC_PATH} bytes): {path}; "
                         "use a shorter --run-dir")
    return f"ipc://{path}"


def etcd_job_key(layout: RunLayout) -> str:
    """The job's name in etcd (its keys' prefix /tessera/KEY/): unique per
    run directory, the same for every process of the run."""
    digest = hashlib.sha1(str(layout.root).encode("utf-8")).hexdigest()[:8]
    return f"{layout.root.name}-{digest}"


def coordinator_names(config: JobConfig) -> list:
    """The coordinator and its standbys: coordinator, coordinator-1, ..."""
    return ["coordinator"] + [f"coordinator-{i}" for i in range(1, config.coordinator.standbys + 1)]


def server_weights_flag(config: JobConfig) -> list:
    """`--server-weights W0,W1,...` from cluster.server_weights (whole
    numbers as integers), or nothing when it is empty (all servers equal)."""
    weights = config.cluster.server_weights
    if not weights:
        return []
    return ["--server-weights", ",".join(str(int(w)) if float(w).is_integer() else repr(float(w)) for w in weights)]


def coordinator_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, debug: bool,
                     host: Optional[str] = None, name: str = "coordinator") -> list:
    t = config.timeouts
    argv = [
        str(binaries.coordinator),
        "--bind", bind_address(config, layout, name, host),
        "--address-file", str(layout.address_file),
        "--servers", str(config.cluster.servers),
        "--workers", str(config.cluster.workers),
        "--vshards", str(config.cluster.vshards),
        "--assemble-timeout", _seconds(t.assemble_seconds),
        "--heartbeat-interval", _seconds(t.heartbeat_seconds),
        "--lease", _seconds(t.lease_seconds),
        "--on-worker-loss", config.cluster.on_worker_loss,
        "--rejoin-timeout", _seconds(t.rejoin_seconds),
        "--replication", str(config.cluster.replication),
        *server_weights_flag(config),
        "--server-lease", _seconds(t.server_lease_seconds),
        "--silence-give-up", _seconds(t.coordinator_give_up_seconds),
        "--on-shard-loss", config.cluster.on_shard_loss,
        *(["--max-servers", str(config.cluster.max_servers)] if config.cluster.max_servers else []),
        *(["--max-workers", str(config.cluster.max_workers)] if config.cluster.max_workers else []),
        "--rebalance-threshold", repr(float(config.rebalance.threshold)),
        "--rebalance-interval", _seconds(config.rebalance.interval_seconds),
        "--rebalance-request-cost", repr(float(config.rebalance.request_cost_bytes)),
        "--move-timeout", _seconds(config.rebalance.move_timeout_seconds),
        "--summary-file", str(layout.coordinator_summary),
    ]
    port = config.metrics.coordinator_port(config.cluster.servers, config.cluster.workers)
    if port:
        argv += ["--metrics-port", str(port), "--metrics-host", config.metrics.host]
    if config.coordinator.etcd:
        argv += ["--etcd", config.coordinator.etcd, "--job", etcd_job_key(layout),
                 "--etcd-lease", _seconds(config.coordinator.etcd_lease_seconds)]
    else:
        argv += ["--state-file", str(layout.root / "coordinator.state")]
    argv += ["--name", name]
    return argv + (["--debug"] if debug else [])


def job_keys_path(config: JobConfig, layout: RunLayout) -> Optional[Path]:
    """The job key file every process is given (None: security.curve is
    false): security.keys_file, else RUN/job.keys."""
    if not config.security.curve:
        return None
    return Path(config.security.keys_file).resolve() if config.security.keys_file else layout.root / "job.keys"


def _switch(on: bool) -> str:
    return "1" if on else "0"


def transport_flags(config: JobConfig, layout: RunLayout, host_id: Optional[str] = None) -> list:
    """The transport settings as flags of every job process, whichever
    back-end starts it and on whichever host (transport/transport_flags.h;
    docs/launcher.md, "The process contract"): --transport and the rdma,
    shm and coalesce sections, each only where the job's value is not the
    binaries' default (tests/launcher_e2e/test_defaults.py proves the
    launcher's defaults are the binaries'); --job_keys (the job key file,
    docs/security.md) with security.curve; --faults with
    message_faults.spec; --host_id where given (the host's name in the
    placement, joined to the shared-memory host identity)."""
    rdma, shm, coalesce = config.rdma, config.shm, config.coalesce
    settings = [
        ("--transport", config.cluster.wire, "zmq"),
        ("--rdma_required", _switch(rdma.required), _switch(RdmaSection.required)),
        ("--rdma_pool_bytes", str(rdma.pool_bytes), str(RdmaSection.pool_bytes)),
        ("--rdma_max_pinned_bytes", str(rdma.max_pinned_bytes), str(RdmaSection.max_pinned_bytes)),
        ("--shm", _switch(shm.enabled), _switch(ShmSection.enabled)),
        ("--shm_min_frame_bytes", str(shm.min_frame_bytes), str(ShmSection.min_frame_bytes)),
        ("--shm_ring_bytes", str(shm.ring_bytes), str(ShmSection.ring_bytes)),
        ("--shm_cross_memory", _switch(shm.cross_memory), _switch(ShmSection.cross_memory)),
        ("--shm_min_lend_bytes", str(shm.min_lend_bytes), str(ShmSection.min_lend_bytes)),
        ("--coalesce", _switch(coalesce.enabled), _switch(CoalesceSection.enabled)),
        ("--coalesce_max_message_bytes", str(coalesce.max_message_bytes), str(CoalesceSection.max_message_bytes)),
        ("--coalesce_max_batch_bytes", str(coalesce.max_batch_bytes), str(CoalesceSection.max_batch_bytes)),
        ("--coalesce_max_delay_us", str(coalesce.max_delay_us), str(CoalesceSection.max_delay_us)),
    ]
    argv = [piece for flag, value, default in settings if value != default for piece in (flag, value)]
    path = job_keys_path(config, layout)
    if path is not None:
        argv += ["--job_keys", str(path)]
    if config.message_faults.spec:
        argv += ["--faults", config.message_faults.spec]
    if host_id:
        argv += ["--host_id", host_id]
    return argv


def describe_transport(config: JobConfig) -> str:
    """cluster.transport for the launcher's first line: "tcp", "ipc", or
    what rdma and auto do without a usable device."""
    transport = config.cluster.transport
    if transport in ("rdma", "auto"):
        if config.rdma.required:
            return f"{transport} (RDMA required: a process without it fails)"
        return f"{transport} (RDMA where usable, else ZeroMQ over tcp)"
    return transport


def with_launcher_environment(config: JobConfig, environ=os.environ) -> JobConfig:
    """The config with the launcher's own TESSERA_FAULTS and
    TESSERA_AUDIT_DIR (the older way to ask for message faults and the
    audit) filled into message_faults.spec and audit.dir where those are
    empty, so that they travel with the job's settings to every process on
    every host (and into the run directory's config.yaml, which ranks of
    mpirun and srun read) instead of depending on a remote shell's
    environment."""
    faults = environ.get("TESSERA_FAULTS", "").strip()
    audit = environ.get("TESSERA_AUDIT_DIR", "").strip()
    if faults and not config.message_faults.spec:
        config = dataclasses.replace(config, message_faults=dataclasses.replace(config.message_faults, spec=faults))
    if audit and not config.audit.dir:
        config = dataclasses.replace(config, audit=dataclasses.replace(config.audit, dir=str(Path(audit).resolve())))
    return config


def process_env(config: JobConfig, layout: RunLayout, binaries: "Binaries") -> dict:
    """Environment every job process gets from the local back-end and
    `tessera-launch role`: PYTHONPATH starting with the build tree's python/
    directory, so that Python worker programs (examples/dlrm.py) import the
    tessera module that was built with the binaries. Nothing else: every
    setting of a process is on its command line (process_argv), so that a
    remote shell that drops the environment changes nothing."""
    del config, layout  # the settings travel as flags (transport_flags)
    inherited = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(binaries.python) + (os.pathsep + inherited if inherited else "")}


def make_job_keys(job: "Job") -> None:
    """Makes RUN/job.keys with tessera-keys when the job needs a key pair
    of its own; checks security.keys_file otherwise. Raises SetupError."""
    config = job.config
    if not config.security.curve:
        return
    path = job_keys_path(config, job.layout)
    if config.security.keys_file:
        if not path.is_file():
            raise SetupError(f"security.keys_file {path}: no such file (make one with "
                             f"{job.binaries.keys} FILE)")
        return
    if path.exists():
        return  # prepared earlier (slurm --submit)
    if not os.access(job.binaries.keys, os.X_OK):
        raise SetupError(f"tessera-keys not found: {job.binaries.keys} (build the project, or set "
                         "security.curve: false)")
    result = subprocess.run([str(job.binaries.keys), str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise SetupError(f"cannot make the job key file: {(result.stderr or result.stdout).strip()}")


def node_coordinator_address(config: JobConfig, layout: RunLayout, address: str) -> str:
    """What servers and workers are given as --coordinator: with etcd, where
    they look the leader up (it may change); else the coordinator's address."""
    return config.coordinator.node_address(etcd_job_key(layout)) or address


def server_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, rank: int,
                address: str, debug: bool, host: Optional[str] = None) -> list:
    name = f"server-{rank}"
    argv = [
        str(binaries.server),
        "--coordinator", node_coordinator_address(config, layout, address),
        "--rank", str(rank),
        "--bind", bind_address(config, layout, name, host),
        "--name", name,
        "--connect-timeout", _seconds(config.timeouts.assemble_seconds + CONNECT_TIMEOUT_MARGIN_SECONDS),
        "--coordinator-give-up", _seconds(config.timeouts.coordinator_give_up_seconds),
    ]
    if config.timeouts.server_heartbeat_seconds != TimeoutsSection.server_heartbeat_seconds:  # only when set
        argv += ["--heartbeat-interval", _seconds(config.timeouts.server_heartbeat_seconds)]
    port = config.metrics.port_of("server", rank, config.cluster.servers)
    if port:
        argv += ["--metrics-port", str(port), "--metrics-host", config.metrics.host]
    limits = config.limits
    argv += ["--max-keys-per-request", str(limits.max_keys_per_request), "--max-table-mb", str(limits.max_table_mb),
             "--max-held-per-peer", str(limits.max_held_per_peer), "--max-message-mb", str(limits.max_message_mb)]
    # Passed when set (the server's defaults are the same: tests/launcher_e2e/test_defaults.py).
    defaults = LimitsSection()
    if limits.max_mb_in_flight_per_peer != defaults.max_mb_in_flight_per_peer:
        argv += ["--max-mb-in-flight-per-peer", str(limits.max_mb_in_flight_per_peer)]
    if limits.max_requests_in_flight_per_peer != defaults.max_requests_in_flight_per_peer:
        argv += ["--max-requests-in-flight-per-peer", str(limits.max_requests_in_flight_per_peer)]
    if config.audit.dir:
        argv += ["--audit-dir", str(Path(config.audit.dir).resolve())]
    disk = config.disk
    argv += ["--disk-dir", str(layout.root / disk.dir)]  # (an absolute dir stays as it is)
    if disk.store != DiskSection.store:
        argv += ["--disk-store", disk.store]
    c = config.checkpoints
    if c.dir:
        argv += ["--checkpoint-dir", str(layout.root / c.dir), "--checkpoint-every", _seconds(c.every_seconds),
                 "--keep-checkpoints", str(c.keep)]
    if c.restore_from:
        argv += ["--restore-from", str(Path(c.restore_from).resolve())]
    return argv + (["--debug"] if debug else [])


def worker_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, rank: int, address: str,
                host: Optional[str] = None, bind: bool = False) -> list:
    """`bind`: pass --bind with tcp too (back-ends whose workers may run on
    another machine than their servers; a worker's default is loopback)."""
    name = f"worker-{rank}"
    argv = [str(binaries.program), "--coordinator", node_coordinator_address(config, layout, address), "--rank",
            str(rank), "--name", name]
    if config.cluster.transport == "ipc" or bind:
        argv += ["--bind", bind_address(config, layout, name, host)]
    for key, value in config.worker.args.items():
        argv += [f"--{key}", _flag_value(value)]
    argv += config.transfer.worker_flags()
    give_up = config.timeouts.coordinator_give_up_seconds
    if give_up != TimeoutsSection.coordinator_give_up_seconds:  # only when set: programs without the flag still run
        argv += ["--coordinator_give_up_seconds", _seconds(give_up)]
    if config.limits.max_message_mb != LimitsSection.max_message_mb:  # the workers split requests to fit it
        argv += ["--transfer_max_message_mb", str(config.limits.max_message_mb)]
    port = config.metrics.port_of("worker", rank, config.cluster.servers)
    if port:
        argv += ["--metrics_port", str(port), "--metrics_host", config.metrics.host]
    return argv


def process_argv(config: JobConfig, binaries: Binaries, layout: RunLayout, name: str, address: str,
                 debug: bool, host: Optional[str] = None, bind_workers: bool = False,
                 host_id: Optional[str] = None) -> list:
    """The command line of the job process called `name` (coordinator,
    coordinator-S (a standby), server-R or worker-R), its transport flags
    (transport_flags, with `host_id`) included: every back-end starts its
    processes with this."""
    if name.startswith("coordinator"):
        argv = coordinator_argv(config, binaries, layout, debug, host, name)
    else:
        role, _, rank = name.partition("-")
        if role == "server":
            argv = server_argv(config, binaries, layout, int(rank), address, debug, host)
        else:
            argv = worker_argv(config, binaries, layout, int(rank), address, host, bind_workers)
    return argv + transport_flags(config, layout, host_id)


def process_names(config: JobConfig) -> list:
    """Every process of the job, in start order, standby coordinators
    aside (the summary's processes)."""
    return (["coordinator"] + [f"server-{r}" for r in range(config.cluster.servers)]
            + [f"worker-{r}" for r in range(config.cluster.workers)])


def carried_names(config: JobConfig) -> list:
    """Every process a carrier back-end starts, in start order: the
    coordinator, its standbys, the servers, the workers. Back-ends that
    start the job as one group of ranks (mpirun, srun) give rank I the
    I-th name."""
    names = process_names(config)
    return names[:1] + coordinator_names(config)[1:] + names[1:]


def worker_rank(name: str) -> Optional[int]:
    """R for worker-R, else None."""
    role, _, rank = name.partition("-")
    return int(rank) if role == "worker" else None


# --------------------------------------------------------------------------
# The job and its run directory
# --------------------------------------------------------------------------


def read_address(path: Path) -> Optional[str]:
    """The address in a coordinator's address file; None while there is none."""
    try:
        address = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return address if address.startswith(("tcp://", "ipc://")) else None


@dataclass
class Job:
    """A job being launched: what a Backend gets."""

    config: JobConfig
    binaries: Binaries
    layout: RunLayout
    skips: list
    debug: bool
    deadline: Optional[float] = None  # time.monotonic() at which --timeout expires


def time_left(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until `deadline` (a time.monotonic() value, Job.deadline);
    None without one."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _prepare_run_dir(requested: Optional[str], config: JobConfig, now: datetime.datetime) -> RunLayout:
    """Creates the run directory with logs/ (and sock/ for ipc) and the
    resolved config.yaml. Raises SetupError, leaving nothing behind, if the
    ipc socket paths would be too long."""
    layout = RunLayout(create_run_dir(requested, config.job.name, now).resolve())
    if config.cluster.transport == "ipc":
        try:
            for name in process_names(config):
                bind_address(config, layout, name)
        except SetupError:
            layout.root.rmdir()
            raise
        layout.sockets.mkdir()
    layout.logs.mkdir()
    layout.config.write_text(config.to_yaml(), encoding="utf-8")
    return layout


def load_job(options: LocalOptions) -> Job:
    """The config (with --set applied), --skip and the binaries, validated;
    the run directory is a placeholder until `start_run` makes it. Raises
    ConfigError or SetupError."""
    config = with_launcher_environment(load_config(options.config, options.overrides))
    return Job(config=config, binaries=Binaries.locate(resolve_build_dir(options.build_dir), config.worker.program),
               layout=RunLayout(Path("RUNDIR")), skips=parse_skips(options.skip, config), debug=options.debug)


def start_run(job: Job, requested: Optional[str], existing: bool = False) -> datetime.datetime:
    """Makes the run directory (job.layout from then on), or with `existing`
    takes `requested` as prepared earlier; returns the wall time the run
    started."""
    started_wall = datetime.datetime.now().astimezone()
    if existing:
        job.layout = RunLayout(Path(requested).resolve())
        job.layout.logs.mkdir(exist_ok=True)
    else:
        job.layout = _prepare_run_dir(requested, job.config, started_wall)
    make_job_keys(job)
    return started_wall
