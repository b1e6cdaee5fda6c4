#!/usr/bin/python3
"""The fault and partition matrix across network-namespace hosts (an
experiment, not a test): bench/run_partition_matrix.sh runs this.

Six hosts made of network namespaces on a bridge (tests/multihost/
netns_hosts.py), every host's link shaped to --mbit (tc tbf), each with an
sshd; the audit job (tests/audit: 3 servers, replication 2, 3 workers,
BSP) runs across them through `tessera-launch ssh`: the coordinator on h0,
server-R on h(1+R), worker-0 on h4, workers 1 and 2 on h5. Each row of the
matrix is one job with one fault:

  none               no fault (the baseline rate)
  kill-server        SIGKILL of server-1 (the config's faults, over ssh)
  kill-coordinator   SIGKILL of the coordinator; a standby on h1 takes
                     over through etcd on h0
  isolate-server     server-1's host cut from every other host for twice
                     the nodes' coordinator lease, then healed
  isolate-coordinator  the coordinator's host cut from every other host
                     for twice the lease, then healed
  split-brain        the coordinator and server-2 cut from each other
                     (server-2 still reaches workers and servers), healed
  cut-worker-server  worker-0 and server-0 cut from each other for 8 s, healed
  cut-worker-server-45s  the same cut for 45 s (under the 60 s request timeout; the kernel's doubled
                     retransmission timer would wait about a minute more)
  cut-for-good       worker-0 and server-0 cut for good (ASP, the worker's
                     request timeout 6 s, on_worker_loss: continue)

For each: when the fault hit (t0) and, if it is a partition, when it
healed; detection (t0 to the coordinator's `lost` line, or the standby's
`won the leadership` line, or, for its own isolation, its `heard from no
node` line); failover (the `lost` line to the first push
acknowledged on the new map); recovery (the heal to the server's rejoin,
or to the coordinator hearing a node again after its own isolation, or
to the first training progress after the heal); the throughput dip
(the lowest 1-second rate of the job's steps between the fault and the
recovery, against the median rate before the fault) and the seconds of
stall (1-second bins below a tenth of that rate); the job's status and the
audit (acknowledged pushes lost, applied twice). Writes RESULTS/matrix.json,
RESULTS/matrix.md (a table) and RESULTS/matrix.png (each row's rate over
time, the fault and the heal marked).

Needs root (namespaces, sshd) and a build tree (TESSERA_BUILD_DIR or
build/). Usage: partition_matrix.py [--rows a,b,...] [--mbit 1000] --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import shutil
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "multihost"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "launcher"))

from jobprocs import LocalEtcd  # noqa: E402
from multihost import HostJob  # noqa: E402
from netns_hosts import NamespaceHosts  # noqa: E402
from tessera_launch import fault_logs, report  # noqa: E402
from tessera_launch.faults import wall_time_text  # noqa: E402

LAYOUT = [["coordinator"], ["server-0"], ["server-1"], ["server-2"], ["worker-0"], ["worker-1", "worker-2"]]
LEASE = 3  # timeouts.lease_seconds of the nodes
BASE = (f"timeouts.lease_seconds={LEASE}", "timeouts.assemble_seconds=30", "worker.args.clocks=6000",
        "worker.args.max-sleep-us=2000")
ROWS = ("none", "kill-server", "kill-coordinator", "isolate-server", "isolate-coordinator", "split-brain",
        "cut-worker-server", "cut-worker-server-45s", "cut-for-good")
#: When a fault is injected: after this many steps of the job (the rate before it is the baseline).
FAULT_AT_STEP = 1500
#: How long a healed partition lasts.
PARTITION_SECONDS = {"isolate-server": 2 * LEASE, "isolate-coordinator": 2 * LEASE, "split-brain": 2 * LEASE,
                     "cut-worker-server": 8, "cut-worker-server-45s": 45}


def rates(run_dir: Path) -> list:
    """(bin start in Unix seconds, steps per second of the whole job) in
    1-second bins from progress.jsonl, by tessera-launch report's binning,
    with the bins in which no step was made as 0 (a stall)."""
    path = run_dir / "progress.jsonl"
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    if not records:
        return []
    centres, per_second = report.throughput(records)
    if not centres:
        return []
    offset = records[0]["time"] - records[0]["elapsed"]  # Unix time of elapsed 0
    by_bin = {int(c): r for c, r in zip(centres, per_second)}
    return [(offset + b, float(by_bin.get(b, 0.0))) for b in range(min(by_bin), max(by_bin) + 1)]


def first_after(lines: list, t0: float, test, process=None):
    for line in lines:
        if line.time >= t0 - fault_logs.TIMESTAMP_SLACK_SECONDS and (process is None or line.process == process):
            if test(line.message):
                return line
    return None


def run_row(row: str, mbit: float, workdir: Path) -> dict:
    hosts = NamespaceHosts(len(LAYOUT), workdir / "netns", shape_mbit=mbit)
    hosts.start()
    etcd = None
    try:
        overrides = list(BASE)
        layout = [list(x) for x in LAYOUT]
        if row == "kill-server":
            overrides.append(f"faults=[{{target: server-1, action: kill, at_step: {FAULT_AT_STEP}}}]")
        if row == "kill-coordinator":
            etcd = LocalEtcd(workdir / "etcd", host=hosts.addresses[0],
                             wrap=["ip", "netns", "exec", hosts.namespace(0)])
            layout[1].append("coordinator-1")
            overrides += [f"coordinator.etcd={etcd.endpoint}", "coordinator.standbys=1",
                          f"faults=[{{target: coordinator, action: kill, at_step: {FAULT_AT_STEP}}}]"]
        if row == "cut-for-good":
            overrides += ["worker.args.consistency=asp", "cluster.on_worker_loss=continue",
                          "worker.args.request-timeout-seconds=6"]
        job = HostJob(hosts, workdir, layout, overrides=tuple(overrides), timeout=300)
        fault_at = heal_at = None
        cut = {"isolate-server": lambda: hosts.isolate(2), "isolate-coordinator": lambda: hosts.isolate(0),
               "split-brain": lambda: hosts.cut(0, 3),
               "cut-worker-server": lambda: hosts.cut(4, 1), "cut-worker-server-45s": lambda: hosts.cut(4, 1),
               "cut-for-good": lambda: hosts.cut(4, 1)}.get(row)
        if cut is not None:
            job.wait_for_progress(step=FAULT_AT_STEP, timeout=120)
            cut()
            fault_at = time.time()
            if row in PARTITION_SECONDS:
                time.sleep(PARTITION_SECONDS[row])
                hosts.heal_all()
                heal_at = time.time()
        job.finish(timeout=400)
        hosts.heal_all()
        summary = job.summary()
        if summary.get("faults"):
            fault_at = summary["faults"][0].get("unix_time")
        check, verdict = job.verdict()
        lines = fault_logs.read_logs(job.run_dir / "logs")
        return measure(row, job, summary, verdict, lines, fault_at, heal_at)
    finally:
        if etcd is not None:
            etcd.stop()
        hosts.stop()


def measure(row, job, summary, verdict, lines, fault_at, heal_at) -> dict:
    result = {"row": row, "status": summary.get("status"), "reason": summary.get("reason"),
              "fault_at": wall_time_text(fault_at) if fault_at else None, "healed_after": None,
              "detection_seconds": None, "failover_seconds": None, "recovery_seconds": None,
              "baseline_steps_per_second": None, "dip": None, "stall_seconds": None,
              "acknowledged": (verdict or {}).get("acknowledged"), "lost": (verdict or {}).get("lost"),
              "duplicates": (verdict or {}).get("duplicates"), "audit_ok": bool(verdict and verdict.get("ok")),
              "wall_seconds": summary.get("wall_seconds")}
    series = rates(job.run_dir)
    result["series"] = series
    if heal_at:
        result["healed_after"] = round(heal_at - fault_at, 3)
    if fault_at is None:
        if series:
            result["baseline_steps_per_second"] = round(statistics.median(r for _, r in series[1:-1] or series), 1)
        return result
    lost = first_after(lines, fault_at, lambda m: m.startswith("lost server") or m.startswith("won the leadership")
                       or m.startswith("heard from no node"))
    if lost is not None:
        result["detection_seconds"] = round(lost.time - fault_at, 3)
        ack = first_after(lines, lost.time, lambda m: m.startswith("first push acknowledged on shard map"))
        if ack is not None:
            result["failover_seconds"] = round(ack.time - lost.time, 3)
    recovered_at = None
    if heal_at:
        rejoin = first_after(lines, heal_at, lambda m: "rejoined from" in m or "of silence from every node" in m,
                             process="coordinator")
        if rejoin is not None:
            recovered_at = rejoin.time
        else:  # nobody was lost: the first progress after the heal
            after = [t for t, r in series if t >= heal_at and r > 0]
            recovered_at = after[0] if after else None
    elif row == "cut-for-good":
        gone = first_after(lines, fault_at, lambda m: "timed out waiting for server" in m)
        recovered_at = gone.time if gone else None
    if recovered_at is not None:
        result["recovery_seconds"] = round(recovered_at - (heal_at or fault_at), 3)
    before = [r for t, r in series if t + 1 <= fault_at]
    if len(before) >= 3:
        baseline = statistics.median(before[1:])
        result["baseline_steps_per_second"] = round(baseline, 1)
        end = max(recovered_at or 0, (heal_at or fault_at) + 2)
        window = [r for t, r in series if fault_at - 1 < t <= end]
        if window and baseline > 0:
            result["dip"] = round(min(window) / baseline, 3)
            result["stall_seconds"] = sum(1 for r in window if r < baseline / 10)
    return result


def table(results: list, mbit: float) -> str:
    def cell(value, unit=""):
        return "-" if value is None else f"{value}{unit}"

    lines = [f"Links shaped to {mbit:g} Mbit/s; 6 hosts; audit job (3 servers, replication 2, 3 workers, BSP "
             "unless noted).", "",
             "| row | status | detection | failover | healed after | recovery | steps/s before | dip | stall | "
             "acked | lost | twice |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        goal = "" if (r["status"] == "ok" and r["lost"] == 0 and r["duplicates"] == 0
                      and (r["failover_seconds"] is None or r["failover_seconds"] < 1)) else " **(below goal)**"
        lines.append(f"| {r['row']}{goal} | {r['status']} | {cell(r['detection_seconds'], ' s')} | "
                     f"{cell(r['failover_seconds'], ' s')} | {cell(r['healed_after'], ' s')} | "
                     f"{cell(r['recovery_seconds'], ' s')} | {cell(r['baseline_steps_per_second'])} | "
                     f"{cell(r['dip'])} | {cell(r['stall_seconds'], ' s')} | {cell(r['acknowledged'])} | "
                     f"{cell(r['lost'])} | {cell(r['duplicates'])} |")
    return "\n".join(lines) + "\n"


def plot(results: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 1.6 * len(results)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        series = r["series"]
        if not series:
            continue
        fault = (datetime.datetime.fromisoformat(r["fault_at"]).timestamp() if r["fault_at"] else None)
        origin = fault if fault is not None else series[0][0]
        ax.plot([t - origin for t, _ in series], [v for _, v in series], drawstyle="steps-post", lw=1)
        if fault is not None:
            ax.axvline(0, color="red", lw=1)
            if r["healed_after"]:
                ax.axvline(r["healed_after"], color="grey", lw=1, ls="--")
        ax.set_ylabel(r["row"], rotation=0, ha="right", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("seconds from the fault (red; grey dashed: the heal); steps per second of the job")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to run, of {', '.join(ROWS)}")
    parser.add_argument("--mbit", type=float, default=1000, help="each host's link rate (tc tbf), Mbit/s")
    parser.add_argument("--out", required=True, help="directory for matrix.json, matrix.md and matrix.png")
    args = parser.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; known: {', '.join(ROWS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for row in rows:
        print(f"[matrix] {row} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"matrix-{row}-") as tmp:
            result = run_row(row, args.mbit, Path(tmp))
            if result["status"] != "ok":  # keep its logs to see why
                shutil.copytree(tmp, out / f"{row}-run", ignore=shutil.ignore_patterns("netns", "*.sock"),
                                dirs_exist_ok=True, ignore_dangling_symlinks=True)
                print(f"[matrix] {row}: its run is kept in {out / f'{row}-run'}", flush=True)
        results.append(result)
        shown = {k: v for k, v in result.items() if k not in ("series", "reason")}
        print(f"[matrix] {row}: {json.dumps(shown)}", flush=True)
        (out / "matrix.json").write_text(json.dumps(results, indent=1))
    (out / "matrix.md").write_text(table(results, args.mbit))
    plot(results, out / "matrix.png")
    print(table(results, args.mbit))
    ok = all(r["status"] == "ok" and r["lost"] == 0 and r["duplicates"] == 0 for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
