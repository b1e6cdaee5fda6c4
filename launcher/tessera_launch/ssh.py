"""The `ssh` back-end: every process over its own ssh connection.

A hostfile says where processes may run, one host a line:

    # HOST        [key=value ...]
    node1         roles=coordinator,server slots=3
    node2         roles=worker slots=4 user=alice port=2222 addr=10.0.0.2

  roles  which processes the host takes: coordinator, server, worker
         (comma-separated; default all three)
  slots  how many processes it takes, all roles together (default 1)
  user, port   for ssh (default: ssh's own)
  addr   the address its processes bind and advertise (default: HOST as
         this machine resolves it)

Processes are placed in order: the coordinator on the first host that takes
it, then its standbys (coordinator-1, ...), server-0, server-1, ... and
worker-0, ... each on the first host (in file order) that takes the role
and has a slot left.

Each process is `ssh HOST tessera-launch role --name NAME --watch-stdin --
ARGV`, a carrier with one member (supervisor.py): the remote side streams the
process's output back (into RUNDIR/logs here), and stops the process when
the connection ends (the launcher stopped it, or the launcher died). The
coordinator's address and, at the end, its summary come back the same way,
so the hosts need no shared file system; the launcher's commands to the
process (faults: signal, hold, restart) go the other way, on the
connection's stdin. Every setting the process needs travels as flags of
that command line (the role's --env values become the process's
environment there), since sshd passes on no environment variables. Before anything starts, every host
is checked over ssh (reachable, has Python, the launcher and the binaries);
any problem is an error naming the host.
"""

from __future__ import annotations

import argparse
import shlex
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .backend import Backend, await_announced_address, launch_carried
from .job import Binaries, Job, RunLayout, SetupError, carried_names, process_argv, process_env
from .processes import CONTROL_STDIN
from .role import LAUNCHER
from .supervisor import Supervisor

ROLES = ("coordinator", "server", "worker")
_KEYS = ("roles", "slots", "user", "port", "addr")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hostfile", metavar="FILE", help="the hosts, their roles and slots (default: ssh.hostfile)")


@dataclass(frozen=True)
class Host:
    """One line of a hostfile."""

    name: str
    roles: tuple = ROLES
    slots: int = 1
    user: Optional[str] = None
    port: Optional[int] = None
    addr: Optional[str] = None


def parse_hostfile(text: str, source: str) -> list:
    """The hosts of a hostfile; raises SetupError naming FILE:LINE for
    every problem."""
    hosts, errors = [], []
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        fields = {}
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or key not in _KEYS or not value:
                errors.append(f"{source}:{number}: expected KEY=VALUE with KEY one of {', '.join(_KEYS)}, "
                              f"got {word!r}")
            elif key in fields:
                errors.append(f"{source}:{number}: {key} given twice")
            else:
                fields[key] = value
        roles = tuple(fields.get("roles", ",".join(ROLES)).split(","))
        if any(role not in ROLES for role in roles):
            errors.append(f"{source}:{number}: roles must be a comma-separated list of {', '.join(ROLES)}, "
                          f"got {fields['roles']!r}")
        numbers = {}
        for key in ("slots", "port"):
            if key in fields:
                if not fields[key].isdigit() or int(fields[key]) == 0:
                    errors.append(f"{source}:{number}: {key} must be a positive integer, got {fields[key]!r}")
                else:
                    numbers[key] = int(fields[key])
        hosts.append(Host(words[0], roles, numbers.get("slots", 1), fields.get("user"), numbers.get("port"),
                          fields.get("addr")))
    if not hosts and not errors:
        errors.append(f"{source}: no hosts")
    if errors:
        raise SetupError("\n".join(errors))
    return hosts


def place(hosts: list, names: list) -> dict:
    """Process name -> Host, filling hosts in file order; raises SetupError
    when the hostfile has too few slots for a role."""
    left = {index: host.slots for index, host in enumerate(hosts)}
    placement = {}
    for name in names:
        role = name.partition("-")[0]
        index = next((i for i, host in enumerate(hosts) if role in host.roles and left[i] > 0), None)
        if index is None:
            takers = [h.name for h in hosts if role in h.roles]
            raise SetupError(f"the hostfile has no free slot for {name}: hosts that take role {role}: "
                             f"{', '.join(takers) or 'none'} (raise their slots, or add hosts)")
        left[index] -= 1
        placement[name] = hosts[index]
    return placement


class SshBackend(Backend):
    name = "ssh"

    def __init__(self, hostfile: Optional[str] = None):
        self.hostfile_flag = hostfile
        self.placement: dict = {}

    # -- where things are on the hosts ---------------------------------------

    def _remote_paths(self, job: Job) -> tuple:
        """(launcher, Binaries, RunLayout) as the hosts see them."""
        settings = job.config.ssh
        launcher = settings.launcher or str(LAUNCHER)
        build = Path(settings.build_dir) if settings.build_dir else job.binaries.coordinator.parent.parent
        layout = RunLayout(Path(settings.run_dir) if settings.run_dir else job.layout.root)
        return launcher, Binaries.locate(build, job.config.worker.program), layout

    def ssh_argv(self, job: Job, host: Host, remote_command: list) -> list:
        settings = job.config.ssh
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(settings.connect_timeout_seconds)}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if host.port:
            argv += ["-p", str(host.port)]
        if host.user:
            argv += ["-l", host.user]
        return argv + list(settings.args) + [host.name, "exec " + shlex.join(remote_command)]

    def _place(self, job: Job) -> None:
        path = self.hostfile_flag or job.config.ssh.hostfile
        if not path:
            raise SetupError("no hostfile: give --hostfile FILE or set ssh.hostfile")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise SetupError(f"hostfile {path}: {e.strerror}") from None
        self.placement = place(parse_hostfile(text, path), carried_names(job.config))
        if job.config.cluster.transport == "ipc" and len({h.name for h in self.placement.values()}) > 1:
            raise SetupError("cluster.transport ipc works on one host only; this hostfile places processes "
                             "on several")

    @staticmethod
    def bind_host(host: Host) -> str:
        """The address processes on `host` bind: addr=, else the host's name
        as resolved here."""
        if host.addr:
            return host.addr
        try:
            return socket.gethostbyname(host.name)
        except OSError as e:
            raise SetupError(f"host {host.name}: cannot resolve its address ({e}); give addr= in the "
                             "hostfile") from None

    def process_command(self, job: Job, name: str, address: str) -> list:
        """The ssh command line that runs process `name` on its host."""
        host = self.placement[name]
        launcher, binaries, layout = self._remote_paths(job)
        argv = process_argv(job.config, binaries, layout, name, address, job.debug, self.bind_host(host),
                            bind_workers=True, host_id=host.name)
        role = [job.config.ssh.python, launcher, "role", "--name", name, "--watch-stdin", "--mkdir",
                str(layout.root)]
        for key, value in process_env(job.config, layout, binaries).items():
            role += ["--env", f"{key}={value}"]
        if name == "coordinator":
            role += ["--announce-address", str(layout.address_file),
                     "--report-summary", str(layout.coordinator_summary)]
        elif not name.startswith("coordinator"):  # standbys find the leader in etcd
            role += ["--probe", address]
        return self.ssh_argv(job, host, role + ["--"] + argv)

    # -- Backend ---------------------------------------------------------------

    def check(self, job: Job) -> None:
        self._place(job)
        for host in set(self.placement.values()):
            self.bind_host(host)
        launcher, binaries, _ = self._remote_paths(job)
        checks = {}
        for host in dict.fromkeys(self.placement.values()):
            roles = {name.partition("-")[0] for name, h in self.placement.items() if h == host}
            paths = [str(getattr(binaries, "program" if role == "worker" else role)) for role in sorted(roles)]
            command = [job.config.ssh.python, launcher, "--version"]
            script = shlex.join(command) + " >/dev/null || exit 90; for f in " + " ".join(
                shlex.quote(p) for p in paths) + '; do [ -x "$f" ] || { echo "missing: $f"; exit 91; }; done'
            argv = self.ssh_argv(job, host, ["sh", "-c", script])
            checks[host] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)
        problems = []
        for host, proc in checks.items():
            try:
                out, _ = proc.communicate(timeout=job.config.ssh.connect_timeout_seconds + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                problems.append(f"host {host.name}: no answer over ssh")
                continue
            last = (out.strip().splitlines() or [""])[-1]
            if proc.returncode == 90:
                problems.append(f"host {host.name}: cannot run {job.config.ssh.python} {launcher} "
                                "(ssh.python, ssh.launcher)")
            elif proc.returncode == 91:
                problems.append(f"host {host.name}: {last} (ssh.build_dir)")
            elif proc.returncode != 0:
                problems.append(f"host {host.name} is unreachable over ssh: {last or f'status {proc.returncode}'}")
        if problems:
            raise SetupError("\n".join(problems))

    def plan(self, job: Job) -> list:
        self._place(job)
        return [(name, self.process_command(job, name, "<coordinator-address>")) for name in self.placement]

    def launch(self, sup: Supervisor, job: Job) -> None:
        names = list(self.placement)
        if not launch_carried(sup, job, "ssh-coordinator", self.process_command(job, "coordinator", ""),
                              ["coordinator"], keep_stdin=True, control=CONTROL_STDIN):
            return
        address = await_announced_address(sup, job, f"over ssh on {self.placement['coordinator'].name}")
        if address is None:
            return
        for name in names[1:]:
            if name in job.skips:
                sup.console.say(f"not starting {name} (--skip)")
                sup.note_skipped(name)
                continue
            if not launch_carried(sup, job, f"ssh-{name}", self.process_command(job, name, address), [name],
                                  keep_stdin=True, control=CONTROL_STDIN):
                return
