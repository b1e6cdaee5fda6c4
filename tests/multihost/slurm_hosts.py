"""A real multi-node Slurm on network-namespace hosts: slurmctld on host 0,
one slurmd on each other host (node1, node2, ...), one munged in the root
namespace serving all of them (its socket is a file every namespace sees).

Each daemon runs in its host's network namespace with a UTS namespace of
its own, so that its hostname is its node name (`nsenter --net=... unshare
--uts`; `ip netns exec` would remount /sys, where slurmd then finds no
cgroup file system). Clients (srun, sbatch, sinfo) run in the root
namespace, which reaches every host through the bridge.

    with SlurmHosts(hosts, workdir) as slurm:
        env = slurm.env          # SLURM_CONF for the clients
        slurm.nodes              # ["node1", ...]

Stopping kills the daemons (the namespaces' removal would anyway), and
munged if this started it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from netns_hosts import NamespaceHosts

SLURM_PROGRAMS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun")


def missing() -> Optional[str]:
    """Why a Slurm cluster cannot run here, or None."""
    for program in SLURM_PROGRAMS:
        if not os.access(program, os.X_OK):
            return f"{program} is missing (scripts/setup.sh installs slurm-wlm and munge)"
    for tool in ("nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (util-linux)"
    return None


def _munge_answers() -> bool:
    munge = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
    return munge.returncode == 0


class SlurmHosts:
    """See the module docstring. `hosts` must have at least 2 hosts."""

    def __init__(self, hosts: NamespaceHosts, workdir: Path, cpus_per_node: int = 4):
        self.hosts = hosts
        self.dir = Path(workdir)
        self.cpus = cpus_per_node
        self.nodes = [f"node{i}" for i in range(1, hosts.count)]
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list = []
        self._started_munged = False

    def __enter__(self) -> "SlurmHosts":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _daemon(self, host: int, hostname: str, argv: list, log: Path) -> None:
        command = (f"hostname {hostname} && exec {' '.join(argv)}")
        out = open(log, "w")
        process = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.hosts.namespace(host)}", "unshare", "--uts",
                                    "sh", "-c", command], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self._daemons.append((process, out))

    def start(self) -> None:
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        for sub in ("ctld", "spool"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if not _munge_answers():
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
            self._started_munged = True
            for _ in range(50):
                if _munge_answers():
                    break
                time.sleep(0.1)
        controller = self.hosts.addresses[0]
        lines = [
            "ClusterName=tessera-multihost",
            f"SlurmctldHost=ctl({controller})",
            "SlurmctldPort=6817", "SlurmdPort=6818", "SrunPortRange=60001-60100",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CryptoType=crypto/munge",
            "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SwitchType=switch/none", "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "ReturnToService=2", "SlurmdParameters=config_overrides",
            "KillWait=5", "InactiveLimit=0",
            f"StateSaveLocation={self.dir / 'ctld'}", f"SlurmdSpoolDir={self.dir / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.dir / 'slurmctld.pid'}", f"SlurmdPidFile={self.dir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.dir / 'slurmctld.log'}", f"SlurmdLogFile={self.dir / 'slurmd-%n.log'}",
        ]
        for i, node in enumerate(self.nodes, start=1):
            lines.append(f"NodeName={node} NodeAddr={self.hosts.addresses[i]} NodeHostname={node} CPUs={self.cpus} "
                         "RealMemory=4000 State=UNKNOWN")
        lines.append(f"PartitionName=hosts Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        self._daemon(0, "ctl", ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)], self.dir / "slurmctld.out")
        for i, node in enumerate(self.nodes, start=1):
            self._daemon(i, node, ["/usr/sbin/slurmd", "-D", "-f", str(self.conf), "-N", node],
                         self.dir / f"slurmd-{node}.out")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            probe = subprocess.run(["srun", f"--nodes={len(self.nodes)}", f"--ntasks={len(self.nodes)}",
                                    "--immediate=5", "hostname"], capture_output=True, text=True, env=self.env,
                                   timeout=30)
            if probe.returncode == 0 and sorted(probe.stdout.split()) == sorted(self.nodes):
                return
            time.sleep(0.3)
        logs = "".join((self.dir / name).read_text()[-600:] for name in ("slurmctld.log",)
                       if (self.dir / name).exists())
        self.stop()
        raise RuntimeError(f"the Slurm daemons started but no step ran on every node within 40 s: {logs}")

    def stop(self) -> None:
        for process, out in self._daemons:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for process, out in self._daemons:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
            out.close()
        self._daemons = []
        if self._started_munged:
            pid_file = Path("/run/munge/munged.pid")
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
                except (ValueError, ProcessLookupError):
                    pass
            self._started_munged = False
