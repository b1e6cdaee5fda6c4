"""The rebalancing experiment (bench/run_rebalance.sh): a skewed embedding
workload on 3 servers, each behind its own bandwidth-limited link, run with
the rebalancer off and then on; throughput and per-server load over time.

Topology (all in network namespaces this script makes and removes): a hub
namespace holds a bridge, the coordinator and the workers; each server runs
in its own namespace, joined to the hub by a veth pair whose two ends are
shaped to RATE by a tc token-bucket filter. So each server has a link of
RATE each way, as a server host's NIC would, and the server whose shards
are hot saturates its link first: with the load skewed, that server bounds
the job's throughput, and moving shards off it raises it.

The job: tessera-coordinator (replication 1, VSHARDS virtual shards, the
rebalancer per run), 3 tessera-servers and WORKERS tessera-skew-bench
workers (Zipf ids, pull then push per step, ASP), started directly (the
launcher runs every process in one namespace). Every second the script
reads the coordinator's metrics (each server's smoothed network bytes per
second, the moves finished) and the workers' progress lines.

Writes OUT/timeline.csv, OUT/rebalance.png and OUT/report.md (a table of
throughput before and after, and the moves), and prints the table. Needs
root (ip netns, tc).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SERVERS = 3
HUB = "tsr-hub"
#: Every byte over the shaped links (transport/transport_flags.h).
NO_SHM = ["--shm", "0"]
SUBNET = "10.77.0"


def sh(*argv, check=True):
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def ns(name):
    return ["ip", "netns", "exec", name]


def setup(rate: str, tag: str):
    """The hub and one namespace per server, each link shaped to `rate`."""
    names = [f"{HUB}-{tag}"] + [f"tsr-s{i}-{tag}" for i in range(SERVERS)]
    for n in names:
        sh("ip", "netns", "add", n)
        sh(*ns(n), "ip", "link", "set", "lo", "up")
    hub = names[0]
    sh(*ns(hub), "ip", "link", "add", "br0", "type", "bridge")
    sh(*ns(hub), "ip", "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
    sh(*ns(hub), "ip", "link", "set", "br0", "up")
    for i in range(SERVERS):
        srv = names[1 + i]
        sh(*ns(hub), "ip", "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", srv)
        sh(*ns(hub), "ip", "link", "set", f"h{i}", "master", "br0")
        sh(*ns(hub), "ip", "link", "set", f"h{i}", "up")
        sh(*ns(srv), "ip", "addr", "add", f"{SUBNET}.{10 + i}/24", "dev", "eth0")
        sh(*ns(srv), "ip", "link", "set", "eth0", "up")
        # Both directions: hub -> server on h{i}, server -> hub on eth0.
        for where, dev in ((hub, f"h{i}"), (srv, "eth0")):
            sh(*ns(where), "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kb",
               "latency", "100ms")
    return names


def teardown(names):
    for n in names:
        sh("ip", "netns", "del", n, check=False)


def metrics(port: int, hub: str) -> dict:
    """The coordinator's per-server network rates and moves, from /metrics."""
    out = sh(*ns(hub), "curl", "-s", "--max-time", "2", f"http://127.0.0.1:{port}/metrics", check=False).stdout
    m = {"moves": 0.0}
    for line in out.splitlines():
        g = re.match(r'tessera_coordinator_server_net_bytes_per_second\{server="(\d+)",direction="(in|out)"\} (\S+)',
                     line)
        if g:
            m[f"s{g.group(1)}_{g.group(2)}"] = float(g.group(3))
        g = re.match(r'tessera_coordinator_shard_moves_total\{outcome="finished"\} (\S+)', line)
        if g:
            m["moves"] = float(g.group(1))
    return m


def run_once(args, threshold: float, out: Path, label: str):
    """One job; returns its timeline rows and the workers' results."""
    names = setup(args.rate, label)
    hub = names[0]
    procs = []
    try:
        addr_file = out / f"{label}-coordinator.address"
        logs = out / f"{label}-logs"
        logs.mkdir(exist_ok=True)
        coord = [str(args.build / "coordinator" / "tessera-coordinator"), "--bind", f"tcp://{SUBNET}.1:0",
                 "--address-file", str(addr_file), "--servers", str(SERVERS), "--workers", str(args.workers),
                 "--vshards", str(args.vshards), "--replication", "1", "--heartbeat-interval", "0.5",
                 "--rebalance-threshold", str(threshold), "--rebalance-interval", str(args.interval),
                 "--metrics-port", str(args.metrics_port), "--assemble-timeout", "60", *NO_SHM]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        procs.append(subprocess.Popen(ns(hub) + coord, stdout=open(logs / "coordinator.log", "w"),
                                      stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + 20
        while not (addr_file.exists() and addr_file.read_text().strip()):
            if time.monotonic() > deadline:
                raise RuntimeError("the coordinator did not start; see " + str(logs / "coordinator.log"))
            time.sleep(0.05)
        address = addr_file.read_text().strip()
        for i in range(SERVERS):
            server = [str(args.build / "server" / "tessera-server"), "--coordinator", address, "--rank", str(i),
                      "--bind", f"tcp://{SUBNET}.{10 + i}:0", "--heartbeat-interval", "0.5", *NO_SHM]
            procs.append(subprocess.Popen(ns(names[1 + i]) + server, stdout=open(logs / f"server-{i}.log", "w"),
                                          stderr=subprocess.STDOUT, env=env))
        workers = []
        for r in range(args.workers):
            w = [str(args.build / "bench" / "tessera-skew-bench"), "--coordinator", address, "--rank", str(r),
                 "--name", f"worker-{r}", "--bind", f"tcp://{SUBNET}.1:0", "--seconds", str(args.seconds),
                 "--zipf", str(args.zipf), "--ids", str(args.ids), "--dim", str(args.dim), "--batch",
                 str(args.batch), "--inflight", str(args.inflight), *NO_SHM]
            p = subprocess.Popen(ns(hub) + w, stdout=subprocess.PIPE, stderr=open(logs / f"worker-{r}.log", "w"),
                                 text=True, env=env)
            os.set_blocking(p.stdout.fileno(), False)
            workers.append(p)
            procs.append(p)
        rows, progress, results = [], [dict(t=0, rows=0) for _ in workers], [None] * len(workers)
        buffers = [""] * len(workers)
        start = time.monotonic()
        while any(p.poll() is None for p in workers):
            time.sleep(1.0)
            for i, p in enumerate(workers):
                try:
                    chunk = p.stdout.read() or ""
                except (BlockingIOError, TypeError):
                    chunk = ""
                buffers[i] += chunk
                *lines, buffers[i] = buffers[i].split("\n")
                for line in lines:
                    if line.startswith("TESSERA_PROGRESS "):
                        progress[i] = json.loads(line.split(" ", 1)[1])
                    elif line.startswith("TESSERA_RESULT "):
                        results[i] = json.loads(line.split(" ", 1)[1])
            m = metrics(args.metrics_port, hub)
            row = {"run": label, "t": round(time.monotonic() - start, 1), "rows": sum(pr["rows"] for pr in progress),
                   "moves": m.get("moves", 0)}
            for s in range(SERVERS):
                row[f"server{s}_bytes_per_s"] = m.get(f"s{s}_in", 0) + m.get(f"s{s}_out", 0)
            rows.append(row)
            if time.monotonic() - start > args.seconds + 120:
                raise RuntimeError("the workers did not finish; see " + str(logs))
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if any(r is None for r in results):
            raise RuntimeError(f"a worker reported no result; see {logs}")
        return rows, results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        teardown(names)


def rate_between(rows, t0, t1):
    """Rows moved per second between t0 and t1 (by the progress totals)."""
    inside = [r for r in rows if t0 <= r["t"] <= t1]
    if len(inside) < 2:
        return 0.0
    return (inside[-1]["rows"] - inside[0]["rows"]) / (inside[-1]["t"] - inside[0]["t"])


def plot(rows_by_run, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharex=True)
    for ax, (label, rows) in zip(axes, rows_by_run.items()):
        t = [r["t"] for r in rows]
        for s in range(SERVERS):
            ax.plot(t, [r[f"server{s}_bytes_per_s"] / 1e6 for r in rows], label=f"server {s}")
        ax.set_title(f"rebalancer {label}: per-server traffic (smoothed)")
        ax.set_xlabel("seconds")
        ax.set_ylabel("MB/s in + out")
        ax.legend()
    ax = axes[2]
    for label, rows in rows_by_run.items():
        t = [r["t"] for r in rows[1:]]
        rate = [(b["rows"] - a["rows"]) / max(b["t"] - a["t"], 1e-9) for a, b in zip(rows, rows[1:])]
        ax.plot(t, rate, label=f"rebalancer {label}")
    ax.set_title("throughput (rows pulled and pushed per second)")
    ax.set_xlabel("seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rate", default="4mbit", help="each server link's rate, each way (tc tbf)")
    p.add_argument("--seconds", type=float, default=90)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--vshards", type=int, default=24)
    p.add_argument("--threshold", type=float, default=1.1)
    p.add_argument("--interval", type=float, default=2)
    p.add_argument("--zipf", type=float, default=1.5)
    p.add_argument("--ids", type=int, default=20000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--inflight", type=int, default=32)
    p.add_argument("--metrics-port", type=int, default=9471)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("rebalance_experiment.py: needs root (ip netns, tc)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    tag = str(os.getpid())
    runs = {}
    results = {}
    for label, threshold in (("off", 0.0), ("on", args.threshold)):
        print(f"rebalance: run with the rebalancer {label} ({args.seconds:.0f} s) ...", file=sys.stderr)
        runs[label], results[label] = run_once(args, threshold, args.out, f"{label}-{tag}")
    with open(args.out / "timeline.csv", "w", newline="") as f:
        fields = list(runs["off"][0].keys())
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for rows in runs.values():
            w.writerows(rows)
    plot(runs, args.out / "rebalance.png")
    # Throughput in the first 20 s and in the last half of each run.
    half = args.seconds / 2
    lines = ["| rebalancer | rows/s, seconds 2-20 | rows/s, seconds %.0f-%.0f | moves finished | "
             "per-server MB/s at the end |" % (half, args.seconds), "|---|---:|---:|---:|---|"]
    late = {}
    for label, rows in runs.items():
        early = rate_between(rows, 2, 20)
        late[label] = rate_between(rows, half, args.seconds)
        end = rows[-2] if len(rows) > 1 else rows[-1]
        per = " / ".join(f"{end[f'server{s}_bytes_per_s'] / 1e6:.2f}" for s in range(SERVERS))
        lines.append(f"| {label} | {early:.0f} | {late[label]:.0f} | {int(end['moves'])} | {per} |")
    ratio = late["on"] / late["off"] if late["off"] > 0 else 0
    lines.append("")
    lines.append(f"Throughput with the rebalancer on / off, seconds {half:.0f}-{args.seconds:.0f}: **{ratio:.2f}x** "
                 f"(links {args.rate} each way per server, {args.vshards} virtual shards, Zipf {args.zipf} over "
                 f"{args.ids} ids, batches of {args.batch}, rows of {args.dim} floats, {args.workers} workers).")
    report = "\n".join(lines)
    (args.out / "report.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
