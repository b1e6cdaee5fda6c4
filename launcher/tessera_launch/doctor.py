"""`tessera-launch doctor`: a preflight check of the hosts a job would use.

For every host the job would run on (local: this host; ssh: the hostfile's
hosts that the placement uses; slurm: the allocation's nodes, one srun task
each; mpirun: one rank per host of mpirun.hostfile), the doctor runs the
probe from the build tree,

    BUILD/rdma/tessera-doctor-probe --pool-bytes RDMA.POOL_BYTES
        --listen BIND_HOST --listen-seconds 10

and reads one JSON line from its stdout (PROBE_REPORT_KEYS): the host's
RDMA devices and ports, whether RDMA is usable and a test registration of
the eager pool's size worked, GPUDirect, the memlock limit, CUDA devices,
and where it listens. While the probe lives it answers every TCP connection
with the line `tessera-doctor-probe`; the doctor connects to each host's
listen port from the launch host (the way the job's processes will reach
each other), then stops the probes.

It then says, per host and for the job, what the job would use with this
config (transport, fallback, shared memory), and what would stop it: RDMA
required but unusable, a host that cannot be reached, a probe that is
missing or fails. A memlock limit below what the RDMA pools may pin
(rdma.pool_bytes + rdma.max_pinned_bytes) on a host with an RDMA device is
a warning, and a problem when RDMA is required. Exit status: 0 the job could run as configured, 1 it
could not, 2 bad arguments or config.

Remote hosts run the probe through `tessera-launch doctor --on-node`
(hidden): it resolves the bind address there (cluster.host `auto` is each
node's own address) and reports a missing probe as a JSON line
({"host": ..., "probe_error": ...}) before it execs the probe.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .config import ZMQ_TRANSPORTS, JobConfig
from .job import LocalOptions, SetupError, load_job, resolve_host
from .policy import EXIT_FAILED, EXIT_OK
from .role import LAUNCHER

BACKENDS = ("local", "ssh", "slurm", "mpirun")
#: What the probe writes to every TCP connection while it listens.
PROBE_GREETING = "tessera-doctor-probe"
#: How long each probe listens (--listen-seconds).
LISTEN_SECONDS = 10
#: Seconds to open a connection to a probe's port and read its greeting.
CONNECT_SECONDS = 5.0
#: Default seconds to wait for every host's report.
REPORT_SECONDS = 30.0
#: Seconds between SIGTERM and SIGKILL when the probes are stopped.
STOP_GRACE_SECONDS = 3.0
#: Exit status of `doctor --on-node` when the probe is missing.
EXIT_NO_PROBE = 3

#: The keys of a probe report the doctor relies on: path -> the types allowed.
PROBE_REPORT_KEYS = {
    ("host",): (str,),
    ("rdma", "usable"): (bool,),
    ("rdma", "devices"): (list,),
    ("rdma", "test_registration", "ok"): (bool,),
    ("gpudirect", "available"): (bool,),
    ("memlock", "soft"): (int,),  # -1: infinite
    ("memlock", "hard"): (int,),
    ("memlock", "unlimited"): (bool,),
    ("cuda", "available"): (bool,),
    ("cuda", "devices"): (list,),
    ("listen", "host"): (str,),
    ("listen", "port"): (int,),
}

DESCRIPTION = """\
Check, before a job runs, that the hosts it would use can run it as
configured: runs the probe BUILD/rdma/tessera-doctor-probe on every host
(local: this host; ssh: the hostfile's hosts; slurm: every node of the
allocation, one srun task each; mpirun: one rank per host), connects from
here to the port each probe listens on, and reports per host: RDMA devices
and ports, the memlock limit (and whether it is too low for the RDMA pools:
rdma.pool_bytes + rdma.max_pinned_bytes), the probe's test registration,
reachability, CUDA devices, GPUDirect, and then what the job would use
(cluster.transport, the fallback to ZeroMQ, shared memory between
processes on one host). The back-end's own settings (the `ssh`, `slurm`,
`mpirun` sections, --hostfile) say how hosts are reached, as for a run.
"""

EPILOG = """\
examples:
  tessera-launch doctor --config configs/local.yaml
  tessera-launch doctor --config configs/local.yaml --set cluster.transport=rdma --set rdma.required=true
  tessera-launch doctor --config configs/ssh.yaml --backend ssh --hostfile configs/hosts.example --json

exit status:
  0    the job could run as configured (warnings may be printed)
  1    it could not: RDMA required but unusable, a host unreachable, a probe missing or failed
  2    bad arguments or config
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="the job config (YAML); required")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="how the job would be started, hence which hosts to check (default: local)")
    parser.add_argument("--build-dir", metavar="DIR",
                        help="the CMake build tree holding the probe (default: $TESSERA_BUILD_DIR, else "
                             "<repo>/build)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a config value, as for a run; repeatable")
    parser.add_argument("--hostfile", metavar="FILE", help="--backend ssh: the hosts (default: ssh.hostfile)")
    parser.add_argument("--json", action="store_true", help="print the combined report as JSON")
    parser.add_argument("--timeout", type=float, default=REPORT_SECONDS, metavar="SEC",
                        help=f"seconds to wait for every host's report (default {REPORT_SECONDS:g}; ssh adds "
                             "ssh.connect_timeout_seconds)")
    # Internal: what the remote hosts run (see the module's docstring).
    parser.add_argument("--on-node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--listen-host", help=argparse.SUPPRESS)
    parser.add_argument("--pool-bytes", help=argparse.SUPPRESS)


# --------------------------------------------------------------------------
# Running the probe
# --------------------------------------------------------------------------


def probe_argv(probe: Path, pool_bytes: int, listen_host: str) -> list:
    """The probe's command line."""
    return [str(probe), "--pool-bytes", str(pool_bytes), "--listen", listen_host,
            "--listen-seconds", str(LISTEN_SECONDS)]


def missing_probe_message(probe: Path) -> str:
    build = probe.parent.parent
    return (f"the probe tessera-doctor-probe was not found at {probe}; build it with "
            f"`cmake --build {build} --target tessera-doctor-probe` (or point --build-dir at a build tree "
            "that has it)")


def on_node_command(python: str, launcher: str, probe: Path, pool_bytes: int, listen_host: str) -> list:
    """What a remote host runs: `tessera-launch doctor --on-node ...`."""
    return [python, launcher, "doctor", "--on-node", "--probe", str(probe), "--listen-host", listen_host,
            "--pool-bytes", str(pool_bytes)]


def run_on_node(args: argparse.Namespace) -> int:
    """`doctor --on-node`: runs the probe here, listening on the bind
    address (`auto`: this machine's address); a missing probe is reported
    as a JSON line."""
    if not args.probe or not args.listen_host or not (args.pool_bytes or "").isdigit():
        print("tessera-launch doctor: error: --on-node needs --probe, --listen-host and --pool-bytes",
              file=sys.stderr)
        return 2
    probe = Path(args.probe)
    if not os.access(probe, os.X_OK) or not probe.is_file():
        print(json.dumps({"host": socket.gethostname(), "probe_error": missing_probe_message(probe)}), flush=True)
        return EXIT_NO_PROBE
    argv = probe_argv(probe, int(args.pool_bytes), resolve_host(args.listen_host))
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return EXIT_FAILED  # not reached


@dataclass
class ProbeLaunch:
    """One process that runs the probe on `expected` hosts: the probe itself
    (local), ssh to one host, or one srun or mpirun for many."""

    where: str  # for messages: "this host", "ssh node1", "srun", "mpirun"
    argv: list
    expected: int = 1
    host: Optional[str] = None  # the host's name as the job knows it (local, ssh)
    listen_host: Optional[str] = None  # what the probe was told to listen on, if known here
    env: dict = field(default_factory=dict)
    kind: str = "probe"  # probe (the binary itself), ssh, srun, mpirun
    error: Optional[str] = None  # why it cannot even start (then argv is not run)


def check_reachable(host: str, port: int, timeout: float = CONNECT_SECONDS) -> dict:
    """Opens a TCP connection to host:port and reads the probe's greeting:
    {"ok", "address", "error"}."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    data = b""
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            while b"\n" not in data and len(data) < 256:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        return {"ok": False, "address": address, "error": e.strerror or str(e) or type(e).__name__}
    greeting = data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    if greeting != PROBE_GREETING:
        return {"ok": False, "address": address,
                "error": f"the port answered, but not with the probe's greeting (got {greeting!r})"}
    return {"ok": True, "address": address, "error": None}


def report_problems(report: dict) -> list:
    """What a probe report lacks or has of the wrong type (PROBE_REPORT_KEYS)."""
    problems = []
    for path, types in PROBE_REPORT_KEYS.items():
        node = report
        for part in path:
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        name = ".".join(path)
        if node is KeyError:
            problems.append(f"lacks {name}")
        elif not isinstance(node, types) or (int in types and bool not in types and isinstance(node, bool)):
            problems.append(f"{name} is {json.dumps(node)}")
    return problems


def json_objects(line: str) -> tuple:
    """(the JSON objects at the start of `line`, one after another, and the
    rest of the line that is not one)."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(line) and line[at].isspace():
            at += 1
        if at == len(line):
            return objects, ""
        try:
            value, end = decoder.raw_decode(line, at)
        except ValueError:
            return objects, line[at:]
        if not isinstance(value, dict):
            return objects, line[at:]
        objects.append(value)
        at = end


class _Running:
    """A started ProbeLaunch: reads its reports, checks each one's port as
    soon as it arrives (a probe listens for LISTEN_SECONDS only)."""

    def __init__(self, launch: ProbeLaunch):
        self.launch = launch
        self.reports: list = []  # {"report": dict, "reachable": dict or None, "problems": [...]}
        self.noise: list = []  # stdout lines that are not JSON objects
        self.stderr: list = []
        self.stopped = False
        self.done = threading.Event()
        self._checks: list = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(launch.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace",
                                     start_new_session=True, env={**os.environ, **launch.env})
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            if self.launch.expected == 1:  # exactly one line, one JSON object
                try:
                    report = json.loads(line)
                except ValueError:
                    report = None
                reports, noise = ([report], "") if isinstance(report, dict) else ([], line)
            else:  # a carrier may run the lines of several hosts together
                reports, noise = json_objects(line)
            for report in reports:
                self._add(report)
            if noise:
                with self._lock:
                    self.noise.append(noise)
                if self.launch.expected == 1:
                    break  # one report was due, and this is not it
            if len(self.reports) >= self.launch.expected:
                break
        self.done.set()

    def _add(self, report: dict) -> None:
        entry = {"report": report, "reachable": None,
                 "problems": [] if "probe_error" in report else report_problems(report)}
        with self._lock:
            self.reports.append(entry)
        if not entry["problems"] and "probe_error" not in report:
            check = threading.Thread(target=self._check, args=(entry,), daemon=True)
            check.start()
            self._checks.append(check)

    def _check(self, entry: dict) -> None:
        listen = entry["report"]["listen"]
        host = listen["host"]
        if listen.get("error"):
            entry["reachable"] = {"ok": False, "address": f"{host}:{listen['port']}",
                                  "error": f"the probe could not listen there: {listen['error']}"}
            return
        if host in ("", "0.0.0.0", "::", "*"):  # listening everywhere: try the address it was given
            host = self.launch.listen_host if self.launch.listen_host not in (None, "auto") else \
                entry["report"]["host"]
        entry["reachable"] = check_reachable(host, listen["port"])

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            with self._lock:
                self.stderr.append(line.rstrip("\n"))
                del self.stderr[:-40]

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def finish(self, deadline: float) -> None:
        """Waits for the port checks, then stops the process (its group)."""
        for check in self._checks:
            check.join(max(0.0, deadline - time.monotonic()) + CONNECT_SECONDS * 2)
        if self.proc.poll() is None:
            self.stopped = True
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        else:
            self._signal(signal.SIGKILL)  # whatever it left in its group
        for reader in self._readers:
            reader.join(2)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def run_probes(launches: list, timeout: float) -> list:
    """Starts every launch, waits (at most `timeout`) until each has given
    its reports or exited, checks the reported ports, stops them all.
    Returns the _Running objects (None for a launch with an error)."""
    running = []
    for launch in launches:
        try:
            running.append(None if launch.error else _Running(launch))
        except OSError as e:
            launch.error = f"cannot run {launch.argv[0]}: {e.strerror or e}"
            running.append(None)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(r is None or r.done.is_set() or r.exited() for r in running):
            break
        time.sleep(0.05)
    for r in running:
        if r is not None:
            r.done.wait(0.5)  # an exited process's last lines
    for r in running:
        if r is not None:
            r.finish(deadline)
    return running


# --------------------------------------------------------------------------
# Where the probes run: one ProbeLaunch per way of reaching hosts
# --------------------------------------------------------------------------


def plan_launches(job, backend: str, hostfile: Optional[str]) -> list:
    """The ProbeLaunches of `backend`, reusing its own way of reaching
    hosts. Raises SetupError (bad hostfile, no mpirun or srun)."""
    config, binaries = job.config, job.binaries
    pool = config.rdma.pool_bytes
    tcp = config.cluster.bind_scheme == "tcp"
    if backend == "local":
        listen = resolve_host(config.cluster.host) if tcp else "127.0.0.1"
        probe = binaries.doctor_probe
        error = None if os.access(probe, os.X_OK) and probe.is_file() else missing_probe_message(probe)
        return [ProbeLaunch("this host", probe_argv(probe, pool, listen), host=socket.gethostname(),
                            listen_host=listen, error=error)]
    if backend == "ssh":
        from .ssh import SshBackend
        ssh = SshBackend(hostfile)
        ssh._place(job)
        launcher, remote, _ = ssh._remote_paths(job)
        launches = []
        for host in dict.fromkeys(ssh.placement.values()):
            try:
                listen = ssh.bind_host(host)
            except SetupError as e:
                launches.append(ProbeLaunch(f"ssh {host.name}", [], host=host.name, kind="ssh",
                                            error=str(e).removeprefix(f"host {host.name}: ")))
                continue
            command = on_node_command(config.ssh.python, launcher, remote.doctor_probe, pool, listen)
            launches.append(ProbeLaunch(f"ssh {host.name}", ssh.ssh_argv(job, host, command), host=host.name,
                                        listen_host=listen, kind="ssh"))
        return launches
    command = on_node_command(sys.executable, str(LAUNCHER), binaries.doctor_probe, pool,
                              config.cluster.host if tcp else "127.0.0.1")
    if backend == "slurm":
        from .slurm import check_srun, per_node_command
        check_srun()
        argv, nodes = per_node_command(job, command)
        return [ProbeLaunch("srun", argv, expected=nodes, kind="srun")]
    from .mpirun import check_mpirun, mpirun_env, per_host_command
    check_mpirun(job)
    argv, hosts = per_host_command(job, command)
    return [ProbeLaunch("mpirun", argv, expected=hosts, env=mpirun_env(), kind="mpirun")]


# --------------------------------------------------------------------------
# What the reports mean for this job
# --------------------------------------------------------------------------


def format_bytes(count) -> str:
    """1073741824 -> "1 GiB", 1500000 -> "1.4 MiB"."""
    if not isinstance(count, int) or isinstance(count, bool):
        return str(count)
    value, unit = float(count), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    if unit == "bytes":
        return f"{count} bytes"
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}".replace(".00 ", " ")


def rdma_wanted(config: JobConfig) -> bool:
    """Whether the job's processes would try RDMA at all."""
    return config.cluster.transport not in ZMQ_TRANSPORTS


def is_infinite(limit) -> bool:
    """A memlock limit as the probe reports it: -1 (or null) for infinity."""
    return limit is None or (isinstance(limit, int) and (limit < 0 or limit >= 1 << 62))


def memlock_advice(memlock: dict, needed: int) -> str:
    """What to set so that `needed` bytes may be locked."""
    hard = memlock.get("hard")
    hard_unlimited = is_infinite(hard)
    if hard_unlimited or hard >= needed:
        value = "unlimited" if hard_unlimited else str(-(-hard // 1024))
        return (f"raise the soft limit where the job starts: `ulimit -l {value}` (ulimit counts KiB), or set "
                "it in /etc/security/limits.conf (`* soft memlock unlimited`)")
    return ("the hard limit is too low as well: add `* hard memlock unlimited` and `* soft memlock unlimited` "
            "to /etc/security/limits.conf (or a file in /etc/security/limits.d/) and log in again (daemons "
            "that start the processes, such as sshd or slurmd, pass on their own limits), then "
            "`ulimit -l unlimited`")


def analyse_host(config: JobConfig, label: str, report: dict, reachable: dict) -> dict:
    """One host's entry of the combined report: the probe's report, the
    port check, the memlock verdict, what the host would use, and its
    problems (the job could not run) and warnings."""
    rdma, memlock = report["rdma"], report["memlock"]
    registration = rdma["test_registration"]
    wanted, required = rdma_wanted(config), config.rdma.required
    usable = rdma["usable"] and registration["ok"]
    if not rdma["usable"]:
        reason = rdma.get("reason") or "no reason given"
    elif not registration["ok"]:
        reason = (f"the test registration of {format_bytes(registration.get('bytes'))} failed: "
                  f"{registration.get('error') or 'no reason given'}")
    else:
        reason = None
    problems, warnings = [], []

    needed = config.rdma.pinned_bytes
    soft = memlock.get("soft")
    below = not memlock["unlimited"] and not is_infinite(soft) and soft < needed
    # A registration of rdma.pool_bytes that went past the soft limit: the
    # limit is not enforced for this user (CAP_IPC_LOCK, e.g. root).
    exempt = below and registration["ok"] and soft < config.rdma.pool_bytes
    entry = {"soft": soft, "hard": memlock.get("hard"), "unlimited": memlock["unlimited"], "needed": needed,
             "needed_for": "rdma.pool_bytes + rdma.max_pinned_bytes", "applies": wanted,
             "too_low": wanted and below and not exempt, "not_enforced": wanted and exempt, "advice": None}
    if entry["too_low"]:
        entry["advice"] = memlock_advice(memlock, needed)
        text = (f"memlock soft limit {format_bytes(soft)} is below the {format_bytes(needed)} each process may "
                f"pin for RDMA (rdma.pool_bytes + rdma.max_pinned_bytes): {entry['advice']}; or lower "
                "rdma.max_pinned_bytes")
        if rdma["usable"] and required:
            problems.append(text + " (with rdma.required, a registration past the limit fails the process)")
        elif rdma["usable"]:
            warnings.append(text + (" (registrations past the limit would fail)" if usable else
                                    " (the job falls back to ZeroMQ while registrations fail)"))

    if not wanted:
        uses = f"ZeroMQ over {config.cluster.bind_scheme} (cluster.transport {config.cluster.transport})"
    elif usable:
        uses = "RDMA (verbs)"
    elif required:
        uses = f"nothing: the processes would fail, RDMA is required (rdma.required) but unusable: {reason}"
        problems.append(f"RDMA is required (rdma.required) but unusable: {reason}")
    else:
        uses = f"ZeroMQ over tcp (RDMA unavailable: {reason})"

    if not reachable["ok"]:
        problems.append(f"cannot be reached from this host at {reachable['address']}: {reachable['error']}")
    return {"host": label, "probe": report, "reachable": reachable, "memlock": entry, "uses": uses,
            "rdma_usable": usable, "rdma_reason": reason, "problems": problems, "warnings": warnings}


def _probe_failure(running: Optional["_Running"], launch: ProbeLaunch) -> list:
    """Problems of a launch beyond its good reports: it could not start,
    exited non-zero by itself, printed something that is not a report,
    or gave fewer reports than hosts."""
    if running is None:
        return [launch.error]
    problems = []
    stderr = "\n".join(running.stderr[-10:]).strip()
    shown = f": {stderr}" if stderr else ""
    code = running.proc.returncode
    failed_by_itself = not running.stopped and code not in (0, None)
    single = launch.kind in ("probe", "ssh")  # the caller names the host
    for entry in running.reports:
        host = "" if single else f"{entry['report'].get('host', launch.where)}: "
        if "probe_error" in entry["report"]:
            problems.append(f"{host}{entry['report']['probe_error']}")
        elif entry["problems"]:
            problems.append(f"{host}the probe's report is not as expected: {'; '.join(entry['problems'])}")
    good = [e for e in running.reports if "probe_error" not in e["report"]]
    if running.noise and launch.kind in ("probe", "ssh"):
        problems.append(f"the probe printed {running.noise[0][:200]!r} instead of a JSON report"
                        + (f" (stderr{shown})" if stderr else ""))
    elif len(running.reports) < launch.expected:
        if launch.kind == "ssh" and code == 255:
            problems.append(f"host {launch.host} is unreachable over ssh{shown or f': status {code}'}")
        elif failed_by_itself:
            what = "the probe" if launch.kind in ("probe", "ssh") else launch.kind
            problems.append(f"{what} exited with status {code} before reporting{shown}")
        elif code is not None and not running.stopped:
            problems.append(f"{launch.kind} ended after {len(running.reports)} of {launch.expected} reports"
                            + shown)
        else:
            problems.append(f"no report within the time allowed ({len(running.reports)} of {launch.expected} "
                            f"hosts reported){shown}")
        if running.noise and launch.kind not in ("probe", "ssh"):
            problems[-1] += f"; output: {' | '.join(running.noise[-3:])[:300]}"
    elif failed_by_itself and good and launch.kind in ("probe", "ssh"):
        problems.append(f"the probe exited with status {code}{shown}")
    return problems


def job_summary(config: JobConfig, hosts: list) -> list:
    """The "what the job would use" lines."""
    transport = config.cluster.transport
    lines = []
    if not rdma_wanted(config):
        lines.append(f"transport: {transport} -> ZeroMQ over {config.cluster.bind_scheme}")
    elif not hosts:
        lines.append(f"transport: {transport} -> unknown: no host reported")
    else:
        with_rdma = [h["host"] for h in hosts if h["rdma_usable"]]
        without = [h for h in hosts if not h["rdma_usable"]]
        reasons = sorted({h["rdma_reason"] for h in without})
        why = reasons[0] if len(reasons) == 1 else "; ".join(f"{h['host']}: {h['rdma_reason']}" for h in without)
        head = f"transport: {transport}" + (" + rdma.required" if config.rdma.required else "")
        if not without:
            lines.append(f"{head} -> RDMA (verbs) on every host")
        elif config.rdma.required:
            lines.append(f"{head} -> the job would fail: RDMA is required but unusable on "
                         f"{', '.join(h['host'] for h in without)} ({why})")
        elif not with_rdma:
            lines.append(f"{head} -> ZeroMQ over tcp (RDMA unavailable: {why})")
        else:
            lines.append(f"{head} -> RDMA on {', '.join(with_rdma)}; ZeroMQ over tcp on "
                         f"{', '.join(h['host'] for h in without)} (RDMA unavailable: {why})")
    shm = config.shm
    if shm.enabled:
        lines.append(f"same-host pairs: shared memory (shm.enabled) for frames of {format_bytes(shm.min_frame_bytes)} "
                     f"or more, a {format_bytes(shm.ring_bytes)} ring per sender and receiver; smaller frames "
                     "as above" + (f"; pull values of {format_bytes(shm.min_lend_bytes)} or more read in place where a "
                                   "worker may read its server's memory (shm.cross_memory)" if shm.cross_memory
                                   else ""))
    else:
        lines.append("same-host pairs: as above (shm.enabled: false)")
    gpus = [h for h in hosts if h["probe"]["cuda"]["available"]]
    if gpus:
        direct = [h["host"] for h in gpus if h["probe"]["gpudirect"]["available"] and h["rdma_usable"]]
        staged = [h["host"] for h in gpus if h["host"] not in direct]
        if direct:
            lines.append(f"GPU memory: GPUDirect RDMA on {', '.join(direct)}")
        if staged:
            lines.append(f"GPU memory: staged through host memory on {', '.join(staged)}")
    return lines


def build_report(config: JobConfig, backend: str, launches: list, running: list) -> dict:
    """The combined report (what --json prints)."""
    hosts, problems, warnings = [], [], []
    for launch, r in zip(launches, running):
        for message in _probe_failure(r, launch):
            problems.append(f"{launch.host or launch.where}: {message}" if launch.kind in ("probe", "ssh")
                            else message)
        for entry in (r.reports if r is not None else []):
            report = entry["report"]
            if "probe_error" in report or entry["problems"]:
                continue
            label = launch.host if launch.kind in ("probe", "ssh") else report["host"]
            reachable = entry["reachable"] or {"ok": False, "address": f"{report['listen']['host']}:"
                                               f"{report['listen']['port']}", "error": "not checked in time"}
            host = analyse_host(config, label, report, reachable)
            hosts.append(host)
            problems += [f"{label}: {p}" for p in host["problems"]]
            warnings += [f"{label}: {w}" for w in host["warnings"]]
    ok = not problems
    return {
        "config": config.source, "job": config.job.name, "backend": backend,
        "transport": config.cluster.transport,
        "rdma": {"required": config.rdma.required, "pool_bytes": config.rdma.pool_bytes,
                 "max_pinned_bytes": config.rdma.max_pinned_bytes},
        "shm": {"enabled": config.shm.enabled, "min_frame_bytes": config.shm.min_frame_bytes,
                "ring_bytes": config.shm.ring_bytes, "cross_memory": config.shm.cross_memory,
                "min_lend_bytes": config.shm.min_lend_bytes},
        "hosts": hosts, "would_use": job_summary(config, hosts), "problems": problems, "warnings": warnings,
        "ok": ok, "exit_status": EXIT_OK if ok else EXIT_FAILED,
    }


# --------------------------------------------------------------------------
# The printed report
# --------------------------------------------------------------------------


def _device_lines(devices: list) -> list:
    lines = []
    for device in devices:
        if not isinstance(device, dict):
            lines.append(str(device))
            continue
        ports = device.get("ports") or []
        described = [f"port {p.get('port')} {p.get('state', '?')} {p.get('link_layer', '?')} mtu "
                     f"{p.get('active_mtu', '?')}" for p in ports if isinstance(p, dict)]
        error = f" ({device['error']})" if device.get("error") else ""
        lines.append(f"{device.get('name', '?')}: " + (", ".join(described) or "no ports") + error)
    return lines


def _cuda_device(device) -> str:
    if not isinstance(device, dict):
        return str(device)
    memory = device.get("memory_bytes")
    return str(device.get("name", "?")) + (f" ({format_bytes(memory)})" if isinstance(memory, int) and memory else "")


def _limit(value) -> str:
    """A memlock limit: bytes, or unlimited."""
    return "unlimited" if is_infinite(value) else format_bytes(value)


def format_text(report: dict) -> list:
    rdma, shm = report["rdma"], report["shm"]
    lines = [f"tessera-launch doctor: job {report['job']} ({report['config']}), back-end {report['backend']}",
             f"  cluster.transport {report['transport']}; rdma.required {str(rdma['required']).lower()}, "
             f"rdma.pool_bytes {format_bytes(rdma['pool_bytes'])}, rdma.max_pinned_bytes "
             f"{format_bytes(rdma['max_pinned_bytes'])}; shm.enabled {str(shm['enabled']).lower()}"]
    for host in report["hosts"]:
        probe = host["probe"]
        r, m, cuda, direct = probe["rdma"], host["memlock"], probe["cuda"], probe["gpudirect"]
        registration = r["test_registration"]
        rows = [("RDMA", "usable" if r["usable"] else f"unusable: {r.get('reason') or 'no reason given'}")]
        devices = _device_lines(r["devices"])
        rows.append(("devices", devices[0] if devices else "none"))
        rows += [("", d) for d in devices[1:]]
        limit = "unlimited" if m["unlimited"] else f"soft {_limit(m['soft'])}, hard {_limit(m['hard'])}"
        if not m["applies"]:
            limit += f" (not needed: cluster.transport {report['transport']} uses no RDMA)"
        elif m["too_low"]:
            limit += (f": TOO LOW for the RDMA pools ({format_bytes(m['needed'])}: rdma.pool_bytes + "
                      f"rdma.max_pinned_bytes); {m['advice']}"
                      + ("" if r["usable"] else " (it matters once RDMA is usable here)"))
        elif m["not_enforced"]:
            limit += (f": below the RDMA pools' {format_bytes(m['needed'])}, but the test registration went "
                      "past it: not enforced for this user (CAP_IPC_LOCK)")
        else:
            limit += f": enough for the RDMA pools ({format_bytes(m['needed'])})"
        rows.append(("memlock", limit))
        rows.append(("registration", f"{'ok' if registration['ok'] else 'failed'} "
                                     f"({format_bytes(registration.get('bytes'))})"
                                     + ("" if registration["ok"] else f": {registration.get('error') or '?'}")))
        reach = host["reachable"]
        rows.append(("reachable", f"yes: {reach['address']} answered from this host" if reach["ok"]
                     else f"NO: {reach['address']}: {reach['error']}"))
        devices = cuda.get("devices") or []
        names = [_cuda_device(d) for d in devices]
        rows.append(("CUDA", f"{len(names)} device(s): {', '.join(names)}" if cuda["available"] and names
                     else f"none ({cuda.get('error') or 'no devices'})"))
        rows.append(("GPUDirect", "available" if direct["available"]
                     else f"no ({direct.get('reason') or 'no reason given'})"))
        rows.append(("uses", host["uses"]))
        lines += ["", f"host {host['host']} (probe reports {probe['host']})" if probe["host"] != host["host"]
                  else f"host {host['host']}"]
        lines += [f"  {name:<13} {text}" for name, text in rows]
    lines += ["", "what the job would use"] + [f"  {line}" for line in report["would_use"]]
    if report["warnings"]:
        lines += ["", "warnings"] + [f"  - {w}" for w in report["warnings"]]
    if report["problems"]:
        lines += ["", "problems"] + [f"  - {p}" for p in report["problems"]]
        lines += ["", "the job could NOT run as configured"]
    else:
        lines += ["", "the job could run as configured"]
    return lines


def run(args: argparse.Namespace) -> int:
    """`tessera-launch doctor`; returns its exit status. ConfigError and
    SetupError go to the caller (exit status 2)."""
    if args.on_node:
        return run_on_node(args)
    if not args.config:
        raise SetupError("doctor needs --config FILE")
    if not args.timeout > 0:
        raise SetupError(f"--timeout must be positive, got {args.timeout:g}")
    job = load_job(LocalOptions(config=args.config, build_dir=args.build_dir, overrides=args.overrides))
    launches = plan_launches(job, args.backend, args.hostfile)
    timeout = args.timeout + (job.config.ssh.connect_timeout_seconds if args.backend == "ssh" else 0)
    report = build_report(job.config, args.backend, launches, run_probes(launches, timeout))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(format_text(report)))
    return report["exit_status"]
