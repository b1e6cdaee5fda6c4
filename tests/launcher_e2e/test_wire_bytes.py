"""The byte counts Tessera reports, against what the TCP sockets carried.

A real job over TCP loopback (tessera-launch local: tessera-coordinator,
one tessera-server, one worker: wire_bytes_worker.py through the tessera
module) runs a fixed mix of pushes, pulls and clocks, then the worker holds
still with every connection open. The test then takes, at a moment when no
counter moves, each process's /metrics page and the kernel's per-socket TCP
counters (`ss -tinp`: bytes_received of each end of each connection; on
loopback both ends are ours, so what a socket sent is what its peer
received, retransmissions excluded) and checks:

- per process and direction, tessera_transport_bytes_total (Tessera message
  bytes: headers and data frames; transport/transport.h) against the bytes
  its sockets carried: those are the message bytes plus ZeroMQ's framing
  (ZMTP 3: a 2-byte part header for parts up to 255 bytes, 9 bytes above;
  with CURVE each part is a MESSAGE command, 33 bytes more) plus each
  connection's greeting (64 bytes) and handshake. With P parts
  (tessera_transport_zmq_parts_total) and C connections:
      base * P + 64 * C  <=  socket - reported  <=  (base + 7) * P + H * C
  where base is 2 (35 with CURVE) and H bounds one side's greeting and
  handshake (HANDSHAKE_MAX). Missing a header or a frame on every message,
  counting messages twice, or counting bytes that never went out lands
  outside this band: it is 7 bytes a part wide, a message header (which
  names its sender's address) is longer;
- the worker's wire bytes (WorkerStats wire_bytes_*: its traffic with the
  servers, in its metrics and in the report the launcher writes) against
  the bytes on the worker's connections with the server, the same way;
- that the numbers in summary.json are the ones measured.

Runs with CURVE (the default) and without it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import free_port_base

# One side of one connection: the ZMTP 3 greeting (64 bytes) and the
# handshake. Without CURVE a READY command with the socket type and an
# empty identity: 43 bytes, 107 in all. With CURVE the bound side sends
# WELCOME and READY (301 in all), the connecting side HELLO and INITIATE
# (559 in all). The bounds leave a little room around those (libzmq 4.3).
HANDSHAKE_MIN = 64
HANDSHAKE_MAX = {False: 128, True: 600}
PART_BASE = {False: 2, True: 35}  # framing of the smallest part: ZMTP header (+ CURVE's MESSAGE command)
PART_SPREAD = 7  # a part over 255 bytes (or over 222 with CURVE) has a 9-byte header instead of 2


def scrape(port: int) -> dict:
    """The samples of a /metrics page: {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


_SOCKET = re.compile(r"^(?P<state>\S+)\s+\d+\s+\d+\s+(?P<local>\S+):(?P<lport>\d+)\s+(?P<peer>\S+):(?P<pport>\d+)\s+"
                     r"(?P<rest>.*)$")


def sockets() -> dict:
    """The machine's TCP sockets from `ss -tinpH`: {(local port, peer port):
    {'state', 'pid', 'received'}} for those between loopback addresses."""
    text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True, timeout=10).stdout
    found = {}
    current = None
    for line in text.splitlines():
        m = _SOCKET.match(line)
        if m:
            current = None
            if m["local"] == "127.0.0.1" and m["peer"] == "127.0.0.1":
                pid = re.search(r"pid=(\d+)", m["rest"])
                current = {"state": m["state"], "pid": int(pid[1]) if pid else None, "received": 0}
                found[(int(m["lport"]), int(m["pport"]))] = current
        elif current is not None:
            received = re.search(r"\bbytes_received:(\d+)", line)
            if received:
                current["received"] = int(received[1])
    return found


def listening() -> dict:
    """{port: pid} of the loopback TCP listeners."""
    text = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True, timeout=10).stdout
    out = {}
    for line in text.splitlines():
        m = re.search(r"127\.0\.0\.1:(\d+)\s.*pid=(\d+)", line)
        if m:
            out[int(m[1])] = int(m[2])
    return out


class Job:
    """The processes of the running job: name -> (pid, metrics port), and
    the ports their transports listen on."""

    def __init__(self, metrics_ports: dict):
        self.metrics_ports = metrics_ports
        listeners = listening()
        self.pids = {}
        for name, port in metrics_ports.items():
            assert port in listeners, f"nobody listens on {name}'s metrics port {port}: {listeners}"
            self.pids[name] = listeners[port]
        self.names = {pid: name for name, pid in self.pids.items()}
        self.zmq_ports = {port for port, pid in listeners.items()
                          if pid in self.names and port not in metrics_ports.values()}
        assert len(self.zmq_ports) == len(self.pids), (self.zmq_ports, listeners)

    def snapshot(self) -> tuple:
        metrics = {name: scrape(port) for name, port in self.metrics_ports.items()}
        conns = {k: s for k, s in sockets().items()
                 if s["pid"] in self.names and (k[0] in self.zmq_ports or k[1] in self.zmq_ports)}
        return metrics, conns

    def quiet_snapshot(self, tries: int = 60) -> tuple:
        """A snapshot taken twice with nothing changed in between (the job's
        heartbeats come every 2 s; each try takes some tens of ms)."""
        keys = ("tessera_transport_bytes_total", "tessera_transport_zmq_parts_total", "tessera_worker_wire_bytes")
        def moving(m):
            return {n: {k: v for k, v in page.items() if k.startswith(keys)} for n, page in m.items()}
        for _ in range(tries):
            m1, s1 = self.snapshot()
            time.sleep(0.05)
            m2, s2 = self.snapshot()
            if moving(m1) == moving(m2) and s1 == s2:
                return m2, s2
            time.sleep(0.1)
        raise AssertionError(f"the job's counters never stood still over {tries} tries")


def check_band(what: str, socket_bytes: int, reported: int, parts: int, conns: int, curve: bool, lines: list):
    excess = socket_bytes - reported
    low = PART_BASE[curve] * parts + HANDSHAKE_MIN * conns
    high = (PART_BASE[curve] + PART_SPREAD) * parts + HANDSHAKE_MAX[curve] * conns
    lines.append(f"{what}: reported {reported}, sockets {socket_bytes} ({socket_bytes / max(reported, 1):.4f}x), "
                 f"{parts} parts, {conns} connections, excess {excess} in [{low}, {high}]")
    assert low <= excess <= high, "\n".join(lines)


@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
def test_reported_bytes_match_the_sockets(source_dir, binaries, tmp_path, curve):
    if not (binaries / "python" / "tessera").is_dir():
        pytest.fail(f"the tessera Python module is not built in {binaries / 'python'}")
    base = free_port_base(3)
    quiet, release = tmp_path / "quiet.json", tmp_path / "release"
    run_dir = tmp_path / "run"
    config = tmp_path / "job.yaml"
    config.write_text("\n".join([
        "job: {name: wire-bytes}",
        "cluster: {servers: 1, workers: 1, vshards: 8, transport: tcp, host: 127.0.0.1}",
        # Quiet windows between heartbeats: every process (servers too) heartbeats every 2 s.
        "timeouts: {heartbeat_seconds: 2, lease_seconds: 10, server_heartbeat_seconds: 2, server_lease_seconds: 10}",
        f"metrics: {{port: {base}}}",
        f"security: {{curve: {'true' if curve else 'false'}}}",
        "worker:",
        f"  program: {source_dir / 'tests' / 'launcher_e2e' / 'wire_bytes_worker.py'}",
        f"  args: {{quiet-file: {quiet}, release-file: {release}}}", ""]))
    argv = [sys.executable, str(source_dir / "launcher" / "tessera-launch"), "local", "--config", str(config),
            "--run-dir", str(run_dir), "--build-dir", str(binaries), "--quiet", "--timeout", "90"]
    job = subprocess.Popen(argv, cwd=source_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           stdin=subprocess.DEVNULL)
    lines = []
    try:
        deadline = time.monotonic() + 60
        while not quiet.exists():
            assert job.poll() is None, f"the job ended early:\n{job.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, "the worker never finished its workload"
            time.sleep(0.05)
        held = json.loads(quiet.read_text())
        # Metrics ports (configs/README.md): servers first, then workers, then the coordinator.
        procs = Job({"server": base, "worker": base + 1, "coordinator": base + 2})
        assert procs.pids["worker"] == held["pid"]
        metrics, conns = procs.quiet_snapshot()
    finally:
        release.touch()
        try:
            out, _ = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.terminate()
            out, _ = job.communicate(timeout=30)
    assert job.returncode == 0, out[-3000:]

    # Every connection of the job has both ends here, established.
    for (lport, pport), s in conns.items():
        assert s["state"] == "ESTAB", (lport, pport, s)
        assert (pport, lport) in conns, f"the other end of {lport}->{pport} is not one of the job's sockets"

    def sent_by(key):  # what the socket `key` sent: what its peer received
        return conns[(key[1], key[0])]["received"]

    for name, pid in procs.pids.items():
        page = metrics[name]
        mine = [k for k, s in conns.items() if s["pid"] == pid]
        for direction, kernel in (("sent", sum(sent_by(k) for k in mine)),
                                  ("received", sum(conns[k]["received"] for k in mine))):
            label = f'{{direction="{direction}"}}'
            shm = page[f"tessera_transport_shm_bytes_total{label}"] + page[
                f"tessera_transport_shm_lent_bytes_total{label}"]
            check_band(f"{name} {direction}", kernel, int(page[f"tessera_transport_bytes_total{label}"] - shm),
                       int(page[f"tessera_transport_zmq_parts_total{label}"]), len(mine), curve, lines)
        assert page["tessera_transport_malformed_total"] == 0, name
        if name == "server":
            # Data frame bytes (keys and values) are part of the messages.
            assert page["tessera_server_received_bytes_total"] <= page[
                'tessera_transport_bytes_total{direction="received"}']
            assert page["tessera_server_sent_bytes_total"] <= page['tessera_transport_bytes_total{direction="sent"}']

    # The worker's wire bytes: its messages to and from the server.
    w = metrics["worker"]
    wire = {kind: int(w[f'tessera_worker_wire_bytes_total{{kind="{kind}"}}']) for kind in ("push", "pull", "other")}
    worker_pid, server_pid = procs.pids["worker"], procs.pids["server"]
    links = [k for k, s in conns.items() if s["pid"] == worker_pid and conns[(k[1], k[0])]["pid"] == server_pid]
    assert len(links) == 2, links  # worker -> server's ROUTER, server -> worker's ROUTER
    link_bytes = sum(sent_by(k) + conns[k]["received"] for k in links)
    parts = int(w['tessera_transport_zmq_parts_total{direction="sent"}'] +
                w['tessera_transport_zmq_parts_total{direction="received"}'])
    excess = link_bytes - sum(wire.values())
    # Both directions of both connections; the parts bound counts the
    # worker's coordinator traffic too (a few heartbeats).
    low = 2 * HANDSHAKE_MIN * len(links)
    high = (PART_BASE[curve] + PART_SPREAD) * parts + 2 * HANDSHAKE_MAX[curve] * len(links)
    lines.append(f"worker wire bytes {wire}: total {sum(wire.values())}, server links {link_bytes} "
                 f"({link_bytes / sum(wire.values()):.4f}x), excess {excess} in [{low}, {high}]")
    assert low <= excess <= high, "\n".join(lines)
    # ... and the rest of the worker's transport bytes are its coordinator traffic.
    transport_total = w['tessera_transport_bytes_total{direction="sent"}'] + w[
        'tessera_transport_bytes_total{direction="received"}']
    coordinator_links = sum(sent_by(k) + conns[k]["received"] for k in conns
                            if conns[k]["pid"] == worker_pid and k not in links)
    assert 0 < transport_total - sum(wire.values()) < coordinator_links, (transport_total, wire, coordinator_links)

    # What the user reads after the run is what was measured.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    (report,) = [r["report"] for r in summary["worker_reports"]]
    stats = report["worker_stats"]
    assert {k: stats[f"wire_bytes_{'pushed' if k == 'push' else 'pulled' if k == 'pull' else 'other'}"]
            for k in wire} == wire, (stats, wire)
    assert held["stats"]["resends"] == stats["resends"]
    print("\n".join(lines))
