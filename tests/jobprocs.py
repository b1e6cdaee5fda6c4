"""Finding the processes of a job started by tessera-launch, for tests that
inject faults by signalling them (tests/consistency, tests/audit); a real
etcd on loopback; the shard maps the nodes of a job logged."""
import base64
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def find_process(binary: str, coordinator: str, name: str):
    """The pid of the process running `binary` (a path ending) with
    `coordinator` and `name` among its arguments, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(binary.encode()) and coordinator.encode() in argv and name.encode() in argv:
            return int(entry.name)
    return None


def wait_for_process(binary: str, coordinator: str, name: str, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = find_process(binary, coordinator, name)
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no {name} ({binary}) of the job at {coordinator} within {timeout} s")


def wait_for_address(run_dir: Path, job, timeout: float = 30.0) -> str:
    """The coordinator's address once the launcher has written it; fails if
    the launcher process `job` ends first."""
    path = Path(run_dir) / "coordinator.address"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert job.poll() is None, job.stdout.read() if job.stdout else "the launcher ended"
        time.sleep(0.05)
    raise AssertionError(f"no coordinator address in {path} after {timeout} s")


def command_line(pid: int) -> list:
    """The arguments process `pid` was started with."""
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def job_environment(pid: int) -> dict:
    """The TESSERA_* variables process `pid` was started with. The job's
    settings (the job key file, message faults, the audit directory) are
    flags on its command line (command_line), not variables; what is left
    here is whatever else the launcher's environment held."""
    pairs = [e.decode().partition("=") for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e]
    return {k: v for k, _, v in pairs if k.startswith("TESSERA_")}


class LocalEtcd:
    """A real etcd on loopback, in `directory`, on free ports; stopped by
    stop() (or `with`). `endpoint` is its client URL. Raises RuntimeError if
    it does not answer within 20 s; missing() says why a test cannot have one."""

    BINARY = "/usr/bin/etcd"

    @staticmethod
    def missing():
        """Why there is no etcd to start, or None."""
        return None if os.access(LocalEtcd.BINARY, os.X_OK) else (
            f"no {LocalEtcd.BINARY} (install etcd-server: scripts/setup.sh)")

    def __init__(self, directory: Path, host: str = "127.0.0.1", wrap=()):
        """host: the address it listens on; wrap: a command prefix to run it
        with (e.g. ip netns exec NS, for a network-namespace host: its
        ports are then the defaults, 2379 and 2380, free in a new namespace)."""
        ports = [2379, 2380]
        if not wrap:
            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind((host, 0))
                    ports.append(s.getsockname()[1])
        self.endpoint = f"http://{host}:{ports[0]}"
        peer = f"http://{host}:{ports[1]}"
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / "etcd.log"
        self._out = open(self.log, "w")
        self.process = subprocess.Popen(
            [*wrap, self.BINARY, "--name", "test", "--data-dir", str(directory / "data"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}"],
            stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self.get("/probe", quiet=True) is not False:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not come up within 20 s; see {self.log}")

    def get(self, key: str, quiet: bool = False):
        """The value (bytes) of `key`, None if absent, False if etcd did not answer (quiet)."""
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(self.endpoint + "/v3/kv/range", data=body),
                                        timeout=2) as r:
                kvs = json.loads(r.read()).get("kvs", [])
        except OSError:
            if quiet:
                return False
            raise
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._out.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


_MAP_LINE = re.compile(r"^\[(?P<node>[^\]]+)\] .*shard map epoch (?P<epoch>\d+) \(map (?P<digest>[0-9a-f]{8})\)")


def shard_map_problems(lines) -> list:
    """What is wrong with the shard maps the nodes of a job adopted, read
    from their log lines ("[NAME] ... shard map epoch E (map D)"): a node
    whose epochs did not strictly increase, or one epoch seen with two
    different maps (two coordinators published different maps under one
    epoch). Empty when every node's maps are consistent."""
    last: dict = {}
    digests: dict = {}
    problems = []
    for line in lines:
        m = _MAP_LINE.match(line)
        if not m:
            continue
        node, epoch, digest = m["node"], int(m["epoch"]), m["digest"]
        if node in last and epoch <= last[node]:
            problems.append(f"{node} adopted epoch {epoch} after epoch {last[node]}")
        last[node] = epoch
        seen = digests.setdefault(epoch, {})
        if digest not in seen:
            seen[digest] = node
            if len(seen) > 1:
                problems.append(f"epoch {epoch} has {len(seen)} maps: "
                                + ", ".join(f"{d} (first at {n})" for d, n in seen.items()))
    return problems


AUDIT_CHECK = Path(__file__).resolve().parent / "audit" / "audit_check.py"


def run_audit_check(records: Path, audit: Path, out_json: Path) -> tuple:
    """Runs tests/audit/audit_check.py on a job's push logs and the servers'
    audit dumps: (its CompletedProcess, its JSON verdict or None)."""
    check = subprocess.run(["/usr/bin/python3", str(AUDIT_CHECK), "--records", str(records), "--audit", str(audit),
                            "--json", str(out_json)], capture_output=True, text=True, timeout=120)
    return check, (json.loads(Path(out_json).read_text()) if Path(out_json).exists() else None)


def check_audit_verdict(check, verdict, min_acked: int) -> dict:
    """Asserts what every audited fault experiment must end with
    (tests/audit/audit_check.py's result): it ran, nothing acknowledged
    was lost, nothing applied twice, at least `min_acked` pushes
    acknowledged, and acknowledged <= applied <= issued. Returns the verdict."""
    assert check.returncode == 0, check.stdout + check.stderr
    assert verdict["ok"] and verdict["lost"] == 0 and verdict["duplicates"] == 0, verdict
    assert verdict["acknowledged"] >= min_acked, verdict
    assert verdict["acknowledged"] <= verdict["applied"] <= verdict["issued"], verdict
    return verdict
