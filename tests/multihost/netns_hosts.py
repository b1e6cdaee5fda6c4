"""Hosts for multi-host tests and benchmarks: network namespaces on a bridge.

`NamespaceHosts(count, workdir)` makes, on this machine, `count` hosts that
look to Tessera like separate machines on one LAN:

  * one network namespace per host (`ip netns`), joined to a bridge of its
    own by a veth pair; the host's only interface besides `lo` is `eth0`,
    with an address of a /24 picked at random from 10.200.0.0/13 that no
    route of this machine uses yet;
  * the root namespace gets the subnet's .254 on the bridge, so that the
    launcher, which runs here, reaches every host;
  * one sshd per host, listening on the host's address, port 22, with a
    host key, an authorized key and a known_hosts file made for this run
    (`ssh_args` are the client arguments that use them);
  * optionally each host's egress shaped with `tc tbf` (`shape(mbit)`).

Partitions are routes inside a namespace (the kernel here has no netem, tc
filters or iptables): `cut(a, b)` adds a blackhole route on a for b's
address and on b for a's (`one_way=True`: only what a sends to b is lost),
`heal(a, b)` removes them, `isolate(a)` cuts a from every other host (the
launcher's own address stays reachable unless `from_launcher=True`), and
`heal_all()` removes every cut. Hosts are named by index (0 .. count-1) or
by address.

Everything made is recorded in /run/tessera-multihost/TAG.json; `stop()`
(or leaving the `with` block) kills what still runs in the namespaces,
stops the sshds, and deletes the namespaces and the bridge. A run that died
without stopping is cleaned up by the next one (`clean_stale`), since its
creator pid is gone. Needs root, iproute2 and openssh-server;
`missing()` says why hosts cannot be made here.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional, Union

STATE_DIR = Path("/run/tessera-multihost")
PREFIX = "tmh"  # every namespace, bridge and veth this module makes starts with it
SSHD = "/usr/sbin/sshd"

HostRef = Union[int, str]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def missing() -> Optional[str]:
    """Why namespace hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and sshd need root"
    for tool in ("ip", "tc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.sh installs iproute2 and openssh)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (scripts/setup.sh installs openssh-server)"
    probe = f"{PREFIX}probe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add fails here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def sshd_config(listen: str, port: int, host_key: Path, authorized_keys: Path, pid_file: Path,
                extra: str = "") -> str:
    """An sshd_config for a test's own sshd: key login as root with the
    test's key only, its own host key and pid file, no PAM; `extra` lines
    appended."""
    return f"""\
ListenAddress {listen}
Port {port}
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PidFile {pid_file}
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
LogLevel ERROR
{extra}"""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL every process whose network namespace is `namespace`."""
    for _ in range(20):
        pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _remove(record: dict) -> None:
    """Undoes what a record lists; ignores what is already gone."""
    for namespace in record.get("namespaces", []):
        _kill_namespace_processes(namespace)
        _ip("netns", "del", namespace, check=False)
    if record.get("bridge"):
        _ip("link", "del", record["bridge"], check=False)


def clean_stale() -> list:
    """Removes what earlier runs whose process is gone left behind; returns their tags."""
    cleaned = []
    if not STATE_DIR.is_dir():
        return cleaned
    for path in STATE_DIR.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(int(record.get("pid", 0))):
            continue
        _remove(record)
        path.unlink(missing_ok=True)
        cleaned.append(path.stem)
    return cleaned


def _used_networks() -> list:
    networks = []
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("blackhole", "unreachable", "prohibit", "local", "broadcast"):
            word = line.split()[1]
        try:
            networks.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    return networks


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(200):
        candidate = ipaddress.ip_network(f"10.{rng.randrange(200, 208)}.{rng.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(n) for n in used if n.prefixlen > 0):
            return candidate
    raise RuntimeError("no free /24 in 10.200.0.0/13 for the test hosts")


class NamespaceHosts:
    """`count` hosts in network namespaces, each with an sshd; see the module docstring."""

    def __init__(self, count: int, workdir: Path, shape_mbit: Optional[float] = None):
        if not 1 <= count <= 200:
            raise ValueError("between 1 and 200 hosts")
        self.count = count
        self.workdir = Path(workdir)
        self.shape_mbit = shape_mbit
        rng = random.Random()
        self.tag = f"{rng.randrange(16 ** 4):04x}"
        self.bridge = f"{PREFIX}{self.tag}br"
        self.namespaces = [f"{PREFIX}{self.tag}h{i}" for i in range(count)]
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self.addresses: list = []
        self.launcher_address = ""
        self.ssh_dir = self.workdir / "ssh"
        self._record_path = STATE_DIR / f"{self.tag}.json"
        self._cuts: set = set()  # (from index, to address)
        self._started = False

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> "NamespaceHosts":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _record(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self._record_path.write_text(json.dumps({"pid": os.getpid(), "namespaces": self.namespaces,
                                                 "bridge": self.bridge}))

    def start(self) -> None:
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        clean_stale()
        self.subnet = _pick_subnet(random.Random())
        hosts = list(self.subnet.hosts())
        self.addresses = [str(hosts[i]) for i in range(self.count)]
        self.launcher_address = str(hosts[-1])  # .254
        self._record()  # before anything is made, so a crash leaves a record to clean
        self._started = True
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.launcher_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, namespace in enumerate(self.namespaces):
                veth = f"{PREFIX}{self.tag}v{i}"
                _ip("netns", "add", namespace)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", namespace, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
                _ip("-n", namespace, "link", "set", "eth0", "up")
                _ip("-n", namespace, "link", "set", "lo", "up")
            if self.shape_mbit:
                self.shape(self.shape_mbit)
            self._start_sshds()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kills what runs in the namespaces (the sshds too), deletes them and the bridge."""
        if not self._started:
            return
        self._started = False
        _remove({"namespaces": self.namespaces, "bridge": self.bridge})
        self._record_path.unlink(missing_ok=True)

    # -- ssh ---------------------------------------------------------------

    def _start_sshds(self) -> None:
        d = self.ssh_dir
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        if not (d / "client_key").exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        for i, namespace in enumerate(self.namespaces):
            host_key = d / f"host{i}_key"
            if not host_key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
            config = d / f"sshd{i}.conf"
            config.write_text(sshd_config(self.addresses[i], 22, host_key, d / "authorized_keys",
                                          d / f"sshd{i}.pid", "MaxStartups 100:30:200\nMaxSessions 100\n"
                                          "ClientAliveInterval 5\nClientAliveCountMax 3\n"))
            started = subprocess.run(["ip", "netns", "exec", namespace, SSHD, "-f", str(config),
                                      "-E", str(d / f"sshd{i}.log")], capture_output=True, text=True)
            if started.returncode != 0:
                raise RuntimeError(f"sshd of host {i} did not start: {started.stderr.strip()}")
        deadline = time.monotonic() + 15
        for i, address in enumerate(self.addresses):
            while True:
                try:
                    socket.create_connection((address, 22), timeout=1).close()
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        log = (d / f"sshd{i}.log")
                        raise RuntimeError(f"sshd of host {i} ({address}) does not answer: {e}; "
                                           f"{log.read_text()[-500:] if log.exists() else ''}") from None
                    time.sleep(0.05)

    @property
    def ssh_args(self) -> list:
        """ssh client arguments that log in to every host (the launcher's ssh.args)."""
        return ["-i", str(self.ssh_dir / "client_key"), "-o", f"UserKnownHostsFile={self.ssh_dir / 'known_hosts'}",
                "-o", "StrictHostKeyChecking=accept-new", "-o", "LogLevel=ERROR"]

    def ssh(self, host: HostRef, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Runs a shell command on a host over ssh."""
        return subprocess.run(["ssh", "-T", "-o", "BatchMode=yes", *self.ssh_args, self.address(host), command],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def run(self, host: HostRef, argv: list, **kwargs) -> subprocess.CompletedProcess:
        """Runs argv inside a host's namespace directly (no ssh)."""
        return subprocess.run(["ip", "netns", "exec", self.namespace(host), *argv], **kwargs)

    def popen(self, host: HostRef, argv: list, **kwargs) -> subprocess.Popen:
        """Starts argv inside a host's namespace (no ssh); the caller stops it."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(host), *argv], **kwargs)

    def hostfile(self, path: Path, roles: list, slots: Optional[list] = None) -> Path:
        """Writes a hostfile for the ssh back-end: host i takes the roles in
        roles[i] (e.g. "coordinator,server"), with slots[i] slots (default:
        one per role named), and binds its own address."""
        lines = ["# network-namespace hosts made by tests/multihost/netns_hosts.py"]
        for i, host_roles in enumerate(roles):
            count = slots[i] if slots else len(host_roles.split(","))
            lines.append(f"{self.addresses[i]} roles={host_roles} slots={count} addr={self.addresses[i]}")
        Path(path).write_text("\n".join(lines) + "\n")
        return Path(path)

    # -- names ---------------------------------------------------------------

    def index(self, host: HostRef) -> int:
        if isinstance(host, int):
            if not 0 <= host < self.count:
                raise IndexError(f"host {host} of {self.count}")
            return host
        return self.addresses.index(host)

    def address(self, host: HostRef) -> str:
        return self.addresses[self.index(host)]

    def namespace(self, host: HostRef) -> str:
        return self.namespaces[self.index(host)]

    def host_of_pid(self, pid: int) -> Optional[int]:
        """The index of the host whose namespace process `pid` runs in, or None."""
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        for i, namespace in enumerate(self.namespaces):
            try:
                if os.stat(f"/run/netns/{namespace}").st_ino == inode:
                    return i
            except OSError:
                continue
        return None

    # -- links -----------------------------------------------------------------

    def shape(self, mbit: float, burst_kbit: int = 1024) -> None:
        """Limits what every host sends to `mbit` Mbit/s (tc tbf on its eth0)."""
        for namespace in self.namespaces:
            _ip("netns", "exec", namespace, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                "rate", f"{mbit}mbit", "burst", f"{burst_kbit}kbit", "latency", "50ms")

    def _blackhole(self, frm: int, to_address: str, add: bool) -> None:
        key = (frm, to_address)
        if add == (key in self._cuts):
            return
        _ip("-n", self.namespaces[frm], "route", "add" if add else "del", "blackhole", f"{to_address}/32")
        if add:
            self._cuts.add(key)
        else:
            self._cuts.discard(key)

    def cut(self, a: HostRef, b: HostRef, one_way: bool = False) -> None:
        """Loses what a sends to b (and, unless one_way, what b sends to a)."""
        ia, ib = self.index(a), self.index(b)
        self._blackhole(ia, self.addresses[ib], True)
        if not one_way:
            self._blackhole(ib, self.addresses[ia], True)

    def heal(self, a: HostRef, b: HostRef) -> None:
        """Removes the cuts between a and b, both ways."""
        ia, ib = self.index(a), self.index(b)
        self._blackhole(ia, self.addresses[ib], False)
        self._blackhole(ib, self.addresses[ia], False)

    def isolate(self, a: HostRef, from_launcher: bool = False) -> None:
        """Cuts a from every other host (and from the launcher's address too
        with from_launcher: then its ssh connections time out as well)."""
        for other in range(self.count):
            if other != self.index(a):
                self.cut(a, other)
        if from_launcher:
            self._blackhole(self.index(a), self.launcher_address, True)

    def heal_all(self) -> None:
        for frm, to_address in list(self._cuts):
            self._blackhole(frm, to_address, False)

    def cuts(self) -> list:
        """(from host, to address) of every cut in place."""
        return sorted(self._cuts)
