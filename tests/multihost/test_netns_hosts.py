"""The multi-host harness itself (netns_hosts.py): hosts reach each other
and the launcher's address, a cut loses what it should (one way or both),
a heal brings it back, isolation leaves the launcher's ssh alone, and
nothing the harness made outlives it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from netns_hosts import PREFIX, NamespaceHosts

#: A TCP connection from inside a host's namespace to ADDR:22 (every host's sshd).
CONNECT = ("import socket, sys\n"
           "try:\n"
           "    socket.create_connection((sys.argv[1], 22), timeout=1).close()\n"
           "    print('open')\n"
           "except OSError as e:\n"
           "    print('closed', e)\n")


def reaches(hosts: NamespaceHosts, frm: int, to: str) -> bool:
    out = hosts.run(frm, ["/usr/bin/python3", "-c", CONNECT, to], capture_output=True, text=True, timeout=20)
    return out.stdout.startswith("open")


def made_by(tag: str) -> list:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (namespaces + links).splitlines() if f"{PREFIX}{tag}" in line]


def test_hosts_cuts_heals_and_cleanup(tmp_path, make_hosts):
    hosts = make_hosts(3)
    a, b, c = hosts.addresses
    # Every host runs its own sshd at its own address, in its own namespace.
    login = hosts.ssh(1, "cat /proc/self/net/fib_trie | grep -c " + b)
    assert login.returncode == 0 and int(login.stdout.strip()) >= 1, login.stdout + login.stderr
    assert reaches(hosts, 0, b) and reaches(hosts, 1, a) and reaches(hosts, 2, a)
    # One way: 0 -> 1 lost, 1 -> 2 fine; a TCP connection needs both ways.
    hosts.cut(0, 1, one_way=True)
    assert not reaches(hosts, 0, b) and not reaches(hosts, 1, a)
    assert hosts.cuts() == [(0, b)]
    assert reaches(hosts, 1, c)
    hosts.heal(0, 1)
    assert reaches(hosts, 0, b) and hosts.cuts() == []
    # Isolation: no other host, but the launcher's ssh still gets in.
    hosts.isolate(2)
    assert not reaches(hosts, 0, c) and not reaches(hosts, 2, b)
    assert reaches(hosts, 0, b)
    assert hosts.ssh(2, "true").returncode == 0
    hosts.heal_all()
    assert reaches(hosts, 2, a) and reaches(hosts, 0, c)
    # Shaping: each host's eth0 gets a token bucket.
    hosts.shape(1000)
    qdisc = hosts.run(0, ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
    assert "tbf" in qdisc and "rate 1Gbit" in qdisc, qdisc
    # Process placement by namespace.
    sleeper = hosts.popen(1, ["sleep", "30"])
    try:
        import time
        for _ in range(50):
            if hosts.host_of_pid(sleeper.pid) == 1:
                break
            time.sleep(0.05)
        # The first pid is `ip netns exec`'s, which execs sleep in the namespace.
        assert hosts.host_of_pid(sleeper.pid) == 1
    finally:
        sleeper.kill()
        sleeper.wait()
    tag = hosts.tag
    assert made_by(tag), "the namespaces and the bridge should exist while the hosts run"
    hosts.stop()
    assert made_by(tag) == [], made_by(tag)
    assert not Path(f"/run/tessera-multihost/{tag}.json").exists()
