"""Jobs across network-namespace hosts, for the multi-host tests and the
partition benchmark (bench/run_partition_matrix.sh).

`HostJob` runs one job through `tessera-launch ssh` (the launcher in this,
the root, namespace; every process on its host over ssh), with a hostfile
that places the processes on the hosts of a `NamespaceHosts`, and offers
what the tests need while it runs: waiting for training progress, the host
of a process, the audit verdict (tests/audit/audit_check.py) and the
logs. Nothing here asserts; the tests do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/jobprocs.py
from jobprocs import run_audit_check  # noqa: E402
from netns_hosts import NamespaceHosts  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launcher" / "tessera-launch"
AUDIT_CONFIG = REPO / "tests" / "audit" / "audit_job.yaml"
PYTHON = "/usr/bin/python3"


def build_dir() -> Path:
    return Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build")).resolve()


def placement_order(name: str) -> tuple:
    """Where `name` comes in the ssh back-end's placement order: the
    coordinator, its standbys, the servers, the workers, by rank."""
    role, _, rank = name.partition("-")
    return ({"coordinator": 0, "server": 1, "worker": 2}[role], int(rank) if rank else 0)


def write_hostfile(path: Path, hosts: NamespaceHosts, layout: list) -> Path:
    """A hostfile that puts exactly layout[i]'s processes on host i: one
    line per process, in the back-end's placement order (each process goes
    to the first line with its role and a free slot), with that host's
    address."""
    lines = ["# network-namespace hosts (tests/multihost): one line per process"]
    named = sorted(((name, index) for index, members in enumerate(layout) for name in members),
                   key=lambda item: placement_order(item[0]))
    for name, index in named:
        address = hosts.addresses[index]
        lines.append(f"{address} roles={name.partition('-')[0]} slots=1 addr={address}  # {name}")
    path.write_text("\n".join(lines) + "\n")
    return path


class HostJob:
    """One job over ssh across namespace hosts (see the module docstring)."""

    def __init__(self, hosts: NamespaceHosts, workdir: Path, layout: list, config: Path = AUDIT_CONFIG,
                 overrides: tuple = (), timeout: float = 240, audit: bool = True, backend_args: tuple = ()):
        self.hosts = hosts
        self.layout = layout
        self.workdir = Path(workdir)
        self.run_dir = self.workdir / "run"
        self.records = self.workdir / "records"
        self.audit = self.workdir / "audit"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hostfile = write_hostfile(self.workdir / "hosts", hosts, layout)
        argv = [PYTHON, str(LAUNCH), "ssh", "--hostfile", str(self.hostfile), "--config", str(config),
                "--build-dir", str(build_dir()), "--run-dir", str(self.run_dir), "--quiet",
                "--timeout", str(timeout), "--set", "ssh.args=" + json.dumps(hosts.ssh_args),
                "--set", "ssh.connect_timeout_seconds=10", *backend_args]
        if audit:
            self.records.mkdir(parents=True, exist_ok=True)
            self.audit.mkdir(parents=True, exist_ok=True)
            argv += ["--set", f"worker.program={build_dir() / 'tests' / 'audit' / 'tessera-audit-workload'}",
                     "--set", f"worker.args.records={self.records}", "--set", f"audit.dir={self.audit}"]
        for override in overrides:
            argv += ["--set", override]
        self.argv = argv
        env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_AUDIT_DIR", "TESSERA_FAULTS")}
        self.started = time.monotonic()
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=env, stdin=subprocess.DEVNULL, cwd=REPO)
        self.output = ""

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_for_progress(self, step: int = 1, timeout: float = 60) -> float:
        """Waits until some worker reported `step` or more (progress.jsonl);
        returns the seconds since the launch. Raises if the job ends first."""
        progress = self.run_dir / "progress.jsonl"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if progress.exists():
                for line in progress.read_text().splitlines():
                    try:
                        if json.loads(line).get("step", 0) >= step:
                            return time.monotonic() - self.started
                    except ValueError:
                        continue
            if not self.running():
                raise AssertionError(f"the job ended before step {step}:\n{self.finish()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"no worker reached step {step} within {timeout} s")

    def finish(self, timeout: float = 300) -> str:
        if self.process.stdout is not None and not self.output:
            try:
                self.output, _ = self.process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.output, _ = self.process.communicate()
        return self.output

    def summary(self) -> dict:
        path = self.run_dir / "summary.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def log(self, name: str) -> str:
        path = self.run_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def verdict(self) -> tuple:
        """(audit_check's CompletedProcess, its JSON verdict or None)."""
        return run_audit_check(self.records, self.audit, self.workdir / "audit.json")

    def describe(self) -> str:
        """The launcher's output and the last lines of the coordinator, for failures."""
        tail = "\n".join(self.log("coordinator").splitlines()[-25:])
        return f"{self.finish()[-5000:]}\n--- coordinator.log (end) ---\n{tail}"
