"""Faults and partitions across network-namespace hosts, under the audit.

Six hosts: the coordinator (h0), three servers (h1, h2, h3; replication 2),
three workers (worker-0 on h4, worker-1 and worker-2 on h5), every process
over ssh. The audit workload (BSP, +1 pushes; tests/audit) logs every push
it issues and every acknowledgement, the servers write what they applied,
and audit_check.py proves that no acknowledged push was lost and none was
applied twice. Each test injects one fault or partition while the job
runs, and requires the job to end ok and the audit to pass:

  - SIGKILL of a server (the config's faults, through the ssh carrier);
  - SIGKILL of the coordinator with a standby on another host (etcd on h0);
  - the coordinator's host isolated from every other host, then healed;
  - a server's host isolated from every other host for twice the nodes'
    coordinator lease, then healed: the server rejoins;
  - the coordinator and one server cut from each other (split brain: the
    server still reaches workers and servers), then healed;
  - one worker and one server cut from each other, then healed; and cut
    for good: the worker fails within its request timeout with an error
    naming the server, the others go on (on_worker_loss: continue).

Partitions are blackhole routes inside the namespaces (netns_hosts.py).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from jobprocs import LocalEtcd, check_audit_verdict
from multihost import HostJob

LAYOUT = [["coordinator"], ["server-0"], ["server-1"], ["server-2"], ["worker-0"], ["worker-1", "worker-2"]]
#: The nodes' coordinator lease (timeouts.lease_seconds) in these tests.
LEASE = 3
BASE = (f"timeouts.lease_seconds={LEASE}", "timeouts.assemble_seconds=30")


def assert_ok_and_audited(job: HostJob, min_acked: int = 300) -> dict:
    assert job.process.returncode == 0, job.describe()
    summary = job.summary()
    assert summary["status"] == "ok", summary.get("reason")
    return check_audit_verdict(*job.verdict(), min_acked)


def test_server_killed_on_its_host(tmp_path, make_hosts, binaries):
    """The ssh regression: server-1 SIGKILLed on its host used to fail the
    job (its carrier's exit status). Its fate is the coordinator's: the
    shards fail over, the job ends ok, nothing acknowledged is lost."""
    hosts = make_hosts(6)
    job = HostJob(hosts, tmp_path, LAYOUT, overrides=BASE + (
        "worker.args.clocks=1500", "faults=[{target: server-1, action: kill, at_step: 300}]"))
    job.finish()
    assert_ok_and_audited(job)
    summary = job.summary()
    assert summary["processes"]["server-1"] == -9, summary["processes"]
    fault = summary["faults"][0]
    assert fault["fired"] and fault["recovered"], fault
    assert "lost server 1" in job.log("coordinator")


def test_coordinator_killed_a_standby_on_another_host_takes_over(tmp_path, make_hosts, binaries):
    hosts = make_hosts(6)
    if LocalEtcd.missing():
        pytest.skip(LocalEtcd.missing())
    etcd = LocalEtcd(tmp_path / "etcd", host=hosts.addresses[0], wrap=["ip", "netns", "exec", hosts.namespace(0)])
    try:
        layout = [["coordinator"], ["server-0", "coordinator-1"], ["server-1"], ["server-2"], ["worker-0"],
                  ["worker-1", "worker-2"]]
        job = HostJob(hosts, tmp_path, layout, overrides=BASE + (
            f"coordinator.etcd={etcd.endpoint}", "coordinator.standbys=1", "worker.args.clocks=2000",
            "faults=[{target: coordinator, action: kill, at_step: 300}]"))
        job.finish()
    finally:
        etcd.stop()
    assert_ok_and_audited(job)
    assert "won the leadership" in job.log("coordinator-1"), job.log("coordinator-1")[-3000:]


def run_with_partition(tmp_path, hosts, cut, heal, hold_seconds, overrides=(), clocks=4000):
    """Starts the audit job, applies `cut()` once it trains, waits
    `hold_seconds`, applies `heal()`; returns the finished job."""
    job = HostJob(hosts, tmp_path, LAYOUT, overrides=BASE + (f"worker.args.clocks={clocks}",) + tuple(overrides))
    try:
        job.wait_for_progress(step=200, timeout=90)
        cut()
        time.sleep(hold_seconds)
        assert job.running(), f"the job ended during the partition:\n{job.describe()}"
        heal()
    finally:
        hosts.heal_all()
    job.finish()
    return job


def test_a_servers_host_isolated_for_twice_the_lease_rejoins(tmp_path, make_hosts, binaries):
    hosts = make_hosts(6)
    server = LAYOUT.index(["server-1"])
    job = run_with_partition(tmp_path, hosts, lambda: hosts.isolate(server), hosts.heal_all, 2 * LEASE)
    assert_ok_and_audited(job)
    coordinator = job.log("coordinator")
    assert "lost server 1" in coordinator, coordinator[-3000:]
    assert re.search(r"server 1 rejoined from tcp://", coordinator), coordinator[-3000:]
    server_log = job.log("server-1")
    assert "no answer from the coordinator" in server_log, server_log[-3000:]
    assert "rejoined the job as server 1" in server_log, server_log[-3000:]
    assert job.summary()["processes"]["server-1"] == 0


def test_the_coordinators_host_isolated_then_healed(tmp_path, make_hosts, binaries):
    """Every node loses the coordinator and the coordinator every node: the
    coordinator takes that for its own isolation and declares nobody lost;
    training goes on without it (pushes, pulls and BSP clocks need only the
    servers) and everyone carries on after the heal."""
    hosts = make_hosts(6)
    job = run_with_partition(tmp_path, hosts, lambda: hosts.isolate(0), hosts.heal_all, 2 * LEASE)
    assert_ok_and_audited(job)
    coordinator = job.log("coordinator")
    assert "heard from no node for" in coordinator, coordinator[-3000:]
    assert " lost server" not in coordinator and "lost worker" not in coordinator, coordinator[-3000:]
    assert "answers again after" in job.log("server-0"), job.log("server-0")[-3000:]


def test_coordinator_and_one_server_cut_split_brain(tmp_path, make_hosts, binaries):
    """The server still reaches the workers and the other servers: it is
    declared lost, fenced by the epoch at its old backups, and rejoins."""
    hosts = make_hosts(6)
    server = LAYOUT.index(["server-2"])
    job = run_with_partition(tmp_path, hosts, lambda: hosts.cut(0, server), lambda: hosts.heal(0, server), 2 * LEASE)
    assert_ok_and_audited(job)
    assert re.search(r"server 2 rejoined from tcp://", job.log("coordinator")), job.log("coordinator")[-3000:]


def progress_after(job, wall_time):
    """The first progress line (any worker) with a step beyond every step
    reported before `wall_time` (time.time()): (its time, the step)."""
    lines = []
    for line in (job.run_dir / "progress.jsonl").read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    before = max((p["step"] for p in lines if p["time"] <= wall_time), default=0)
    after = [p for p in lines if p["time"] > wall_time and p["step"] > before]
    assert after, f"no progress after the heal (last step before it: {before})"
    first = min(after, key=lambda p: p["time"])
    return first["time"], first["step"]


def test_one_worker_and_one_server_cut_20_s_resumes_soon_after_the_heal(tmp_path, make_hosts, binaries):
    """Nobody is lost: the worker's requests to that server wait (and it
    says so), and go through once the cut heals: within 2 s of the heal
    (the TCP connection the cut broke is made again, and the worker sends
    what that server owes at once), not after the kernel's or the resend
    timer's doubled wait. The cut drops packets (a blackhole route): no
    reset tells either side."""
    hosts = make_hosts(6)
    worker, server = LAYOUT.index(["worker-0"]), LAYOUT.index(["server-0"])
    job = HostJob(hosts, tmp_path, LAYOUT, overrides=BASE + ("worker.args.clocks=4000",))
    try:
        job.wait_for_progress(step=200, timeout=90)
        hosts.cut(worker, server)
        time.sleep(float(os.environ.get("TESSERA_TEST_CUT_SECONDS", "20")))
        assert job.running(), f"the job ended during the partition:\n{job.describe()}"
        hosts.heal(worker, server)
        healed = time.time()
    finally:
        hosts.heal_all()
    job.finish()
    assert_ok_and_audited(job)
    waiting = [line for line in job.log("worker-0").splitlines() if "waiting for server 0" in line]
    assert waiting, job.log("worker-0")[-3000:]
    assert hosts.addresses[server] in waiting[0], waiting[0]
    resumed, step = progress_after(job, healed)
    print(f"resumed {resumed - healed:.2f} s after the heal (step {step})")
    assert resumed - healed <= 2.0, (f"training resumed {resumed - healed:.1f} s after the heal\n"
                                     f"{job.log('worker-0')[-3000:]}")


def test_one_worker_and_one_server_cut_for_good(tmp_path, make_hosts, binaries):
    """The worker fails with an error that names the server within its
    request timeout (and a little: the check runs every 0.1 s); the job
    goes on without it (on_worker_loss: continue) and loses nothing it
    acknowledged. ASP: under BSP every worker would wait for the cut one at
    each clock (its clocks cannot reach that server), which is BSP's
    promise, not a fault; the healed cut above runs BSP."""
    hosts = make_hosts(6)
    worker, server = LAYOUT.index(["worker-0"]), LAYOUT.index(["server-0"])
    request_timeout = 6
    job = HostJob(hosts, tmp_path, LAYOUT, overrides=BASE + (
        "worker.args.clocks=3000", "worker.args.consistency=asp", "cluster.on_worker_loss=continue",
        f"worker.args.request-timeout-seconds={request_timeout}"))
    try:
        job.wait_for_progress(step=200, timeout=90)
        hosts.cut(worker, server)
        cut_at = time.monotonic()
        deadline = cut_at + request_timeout + 30
        while time.monotonic() < deadline and "timed out waiting for server 0" not in job.log("worker-0"):
            time.sleep(0.1)
        failed_after = time.monotonic() - cut_at
    finally:
        job.finish()
        hosts.heal_all()
    worker_log = job.log("worker-0")
    error = [line for line in worker_log.splitlines() if "timed out waiting for server 0" in line]
    assert error, worker_log[-3000:]
    assert hosts.addresses[server] in error[0], error[0]
    assert failed_after <= request_timeout + 3, f"failed {failed_after:.1f} s after the cut"
    assert_ok_and_audited(job)
    assert job.summary()["processes"]["worker-0"] == 1
