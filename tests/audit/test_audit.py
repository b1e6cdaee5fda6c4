"""Fault experiments with the audit checker (issue: replication, E1-E3, E7).

Each test runs the audit workload through tessera-launch (3 servers,
replication 2, 3 workers, BSP; servers in audit mode), injects one fault by
signalling a process of the job, and then proves with audit_check.py that
acknowledged <= applied <= issued, that no push was applied twice, that every
row's value matches the pushes it lists, and that all copies of a row agree."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jobprocs import (LocalEtcd, check_audit_verdict, command_line, job_environment,  # noqa: E402
                      run_audit_check, shard_map_problems, wait_for_address, wait_for_process)

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build"))
CONFIG = Path(__file__).resolve().parent / "audit_job.yaml"
WORKLOAD = BUILD / "tests" / "audit" / "tessera-audit-workload"


class Job:
    def __init__(self, tmp_path, *overrides, faults=""):
        self.run_dir = tmp_path / "run"
        self.records = tmp_path / "records"
        self.audit = tmp_path / "audit"
        self.records.mkdir()
        self.audit.mkdir()
        argv = [sys.executable, str(REPO / "launcher" / "tessera-launch"), "local", "--config", str(CONFIG),
                "--build-dir", str(BUILD), "--run-dir", str(self.run_dir), "--timeout", "150",
                "--set", f"worker.program={WORKLOAD}", "--set", f"worker.args.records={self.records}"]
        for o in overrides:
            argv += ["--set", o]
        env = dict(os.environ, TESSERA_AUDIT_DIR=str(self.audit))
        if faults:
            env["TESSERA_FAULTS"] = faults  # every process of the job (transport/fault_transport.h)
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.extra = []
        self.address = wait_for_address(self.run_dir, self.process)

    def pid(self, binary: str, name: str, timeout=20.0):
        """The pid of this job's process running `binary` called `name`."""
        return wait_for_process(binary, self.address, name, timeout)

    def running(self):
        return self.process.poll() is None

    def start(self, argv, log: Path, job_env: dict):
        """Starts `argv` with `job_env` (job_environment of the process it replaces); its
        settings (the job key, --audit-dir) are on the copied command line."""
        env = {**os.environ, **job_env}
        out = open(log, "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.extra.append((p, out))
        return p

    def start_like(self, binary: str, model: str, rank: int, log: Path):
        """Starts one more process of this job: `model`'s command line and
        job environment (`binary` called `model`, e.g. server-0), with --rank
        `rank` and the matching --name (a process that joins the running job)."""
        pid = self.pid(binary, model)
        argv, env = command_line(pid), job_environment(pid)
        argv[argv.index("--rank") + 1] = str(rank)
        argv[argv.index("--name") + 1] = f"{model.rsplit('-', 1)[0]}-{rank}"
        return lambda: self.start(argv, log, env)

    def finish(self):
        try:
            out, _ = self.process.communicate(timeout=180)
            for p, _ in self.extra:
                p.wait(timeout=30)
        finally:
            for p, f in self.extra:
                if p.poll() is None:
                    p.kill()
                f.close()
        return out

    def verdict(self):
        return run_audit_check(self.records, self.audit, self.run_dir / "audit.json")


def assert_job_ok(job, out):
    assert job.process.returncode == 0, out[-4000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary


def assert_audit_passes(job, min_acked=500):
    return check_audit_verdict(*job.verdict(), min_acked)


def coordinator_log(job):
    return (job.run_dir / "logs" / "coordinator.log").read_text()


def test_without_faults_the_audit_passes(tmp_path):
    job = Job(tmp_path, "worker.args.clocks=60")
    out = job.finish()
    assert_job_ok(job, out)
    verdict = assert_audit_passes(job, min_acked=3 * 60 * 4)
    assert verdict["applied"] == verdict["issued"] == verdict["acknowledged"]
    assert len(verdict["servers"]) == 3


# The table with a disk tier (docs/embeddings.md) whose memory holds 20 of
# its rows on each server: of the ~270 rows (400 keys, 2 copies over 3
# servers) each server holds, most are on disk and come and go as the
# random pushes touch them. The bucket store's own memory is 1 MiB
# (BucketFileColdRows::kMemoryBytes); a row of width 1 with ACCUMULATE and a
# budget counts 60 bytes.
DISK_TIER = ("worker.args.disk-tier=true", f"worker.args.memory-budget-bytes={(1 << 20) + 20 * 60}",
             "worker.args.keys=400")


def assert_rows_went_to_disk(job, servers):
    """Each of `servers` said at its end that its table had rows on disk,
    moved there and brought back."""
    for name in servers:
        log = (job.run_dir / "logs" / f"{name}.log").read_text()
        m = re.search(r"table 5: (\d+) rows, (\d+) of them on disk .* (\d+) rows moved to disk, (\d+) brought back",
                      log)
        assert m, f"{name} did not report its disk tier:\n{log[-2000:]}"
        rows, on_disk, moved, back = map(int, m.groups())
        assert on_disk > rows // 2 and moved > 0 and back > 0, m.group(0)


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_e1_e2_a_server_killed(tmp_path, tier):
    """Server 1 is the primary of some shards and the backup of others.
    With the disk tier most rows of every server are on disk when it dies:
    the replicas' copies (on their own disks) carry the job on."""
    job = Job(tmp_path, *(DISK_TIER if tier == "disk" else ()))
    pid = job.pid("tessera-server", "server-1")
    time.sleep(1.5)
    assert job.running(), "the job ended before the fault"
    os.kill(pid, signal.SIGKILL)
    out = job.finish()
    assert_job_ok(job, out)
    assert "lost server 1" in coordinator_log(job)
    verdict = assert_audit_passes(job)
    assert len(verdict["servers"]) == 2
    if tier == "disk":
        assert_rows_went_to_disk(job, ["server-0", "server-2"])


MOVES = ("rebalance.threshold=1.01", "rebalance.interval_seconds=0.3", "timeouts.heartbeat_seconds=0.2",
         "timeouts.lease_seconds=2")


def moves_finished(job):
    return coordinator_log(job).count("moved shard")


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_shards_moved_under_load_lose_nothing_and_apply_nothing_twice(tmp_path, tier):
    """The rebalancer on a hair trigger (the first map's 6/5/5 primaries are
    already 1.1x the mean): shards move between live servers while three
    workers push; the audit must still pass. With the disk tier the moved
    shards' rows are mostly on disk at both ends."""
    job = Job(tmp_path, *MOVES, *(DISK_TIER if tier == "disk" else ()))
    out = job.finish()
    assert_job_ok(job, out)
    assert moves_finished(job) >= 1, coordinator_log(job)[-3000:]
    verdict = assert_audit_passes(job)
    assert verdict["applied"] == verdict["issued"] == verdict["acknowledged"]
    if tier == "disk":
        assert_rows_went_to_disk(job, ["server-0", "server-1", "server-2"])


@pytest.mark.parametrize("victim", ["source", "destination"])
def test_a_server_killed_as_a_move_starts(tmp_path, victim):
    """As soon as a move starts, its source or its destination is killed
    (moves take tens of milliseconds here, so the kill lands during the move
    or just after it; tests/sim kills them mid-move deterministically)."""
    job = Job(tmp_path, *MOVES)
    log = job.run_dir / "logs" / "coordinator.log"
    deadline = time.monotonic() + 60
    started = None
    while started is None and time.monotonic() < deadline and job.running():
        for line in (log.read_text() if log.exists() else "").splitlines():
            m = re.search(r"moving shard \d+ from server (\d+) to server (\d+)", line)
            if m:
                started = m
                break
        time.sleep(0.02)
    assert started is not None, "no move started"
    rank = started.group(1) if victim == "source" else started.group(2)
    os.kill(job.pid("tessera-server", f"server-{rank}"), signal.SIGKILL)
    out = job.finish()
    assert_job_ok(job, out)
    assert f"lost server {rank}" in coordinator_log(job)
    assert_audit_passes(job)


def test_a_server_that_joins_the_running_job_gets_shards_by_moves(tmp_path):
    """cluster.max_servers 4: a fourth tessera-server, started by hand with
    server 0's flags and --rank 3, joins while the workers push; the
    rebalancer moves shards to it (an empty server leaves the others at
    4/3 of the mean load)."""
    job = Job(tmp_path, *MOVES, "cluster.max_servers=4", "rebalance.threshold=1.2")
    start = job.start_like("tessera-server", "server-0", 3, tmp_path / "server-3.log")
    time.sleep(1.0)
    assert job.running(), "the job ended before the server joined"
    start()
    out = job.finish()
    assert_job_ok(job, out)
    log = coordinator_log(job)
    assert "server 3 joined the running job" in log, log[-3000:]
    assert re.search(r"moved shard \d+ from server \d to server 3", log), log[-3000:]
    verdict = assert_audit_passes(job)
    assert verdict["applied"] == verdict["issued"] == verdict["acknowledged"]


def test_a_drained_server_hands_its_copies_over_and_leaves(tmp_path):
    """tessera-admin drain while three workers push: server 2's copies
    (primaries and backups) move to servers 0 and 1 one at a time, then it
    is removed from the job and exits 0; the job goes on and the audit
    passes."""
    job = Job(tmp_path, "timeouts.heartbeat_seconds=0.2", "timeouts.lease_seconds=2")
    pid = job.pid("tessera-server", "server-2")
    server_argv = command_line(pid)  # the job's key, if it has one, as the server got it
    keys = server_argv[server_argv.index("--job_keys"):][:2] if "--job_keys" in server_argv else []
    time.sleep(1.0)
    assert job.running(), "the job ended before the drain"
    admin = subprocess.run([str(BUILD / "coordinator" / "tessera-admin"), "drain", "--coordinator", job.address,
                            "--server", "2", "--wait", "--timeout", "90", *keys],
                           capture_output=True, text=True, timeout=120)
    assert admin.returncode == 0, admin.stdout + admin.stderr
    assert "draining server 2" in admin.stdout, admin.stdout
    assert admin.stdout.rstrip().endswith("server 2 was drained and removed from the job"), admin.stdout
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(), \
        "the drained server did not stop"
    # Asked again: it says so, and the job did not fail.
    # (Through tessera-launch drain, which reads the address and key from the run directory.)
    launch = [sys.executable, str(REPO / "launcher" / "tessera-launch"), "drain", "--run-dir", str(job.run_dir),
              "--build-dir", str(BUILD)]
    again = subprocess.run(launch + ["--server", "2"], capture_output=True, text=True, timeout=60)
    assert job.running(), "the job ended before the drain was asked about again"
    assert again.returncode == 0 and "was drained and removed" in again.stdout, again.stdout + again.stderr
    # Server 1 cannot go too: two copies of every shard need two servers.
    refused = subprocess.run(launch + ["--server", "1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "1 server would be left (live, not draining) for 2 copies" in refused.stderr, refused.stderr
    out = job.finish()
    assert_job_ok(job, out)
    log = coordinator_log(job)
    assert "draining server 2" in log and "server 2 was drained and removed" in log, log[-3000:]
    assert re.search(r"moved shard \d+ from server 2 to server [01]", log), log[-3000:]
    assert re.search(r"moved shard \d+'s backup copy from server 2 to server [01]", log), log[-3000:]
    assert "lost server 2" not in log
    verdict = assert_audit_passes(job)
    assert verdict["applied"] == verdict["issued"] == verdict["acknowledged"]


def test_a_worker_that_joins_the_running_job_starts_at_the_jobs_clock(tmp_path):
    """cluster.max_workers 4: a fourth worker, started by hand with worker
    0's flags and --rank 3, joins while the others push (BSP). It starts at
    the fastest worker's clock, holds nobody back, is waited for from then
    on, and its pushes pass the audit like everyone's."""
    job = Job(tmp_path, "cluster.max_workers=4")
    start = job.start_like("tessera-audit-workload", "worker-0", 3, tmp_path / "worker-3.log")
    time.sleep(1.0)
    assert job.running(), "the job ended before the worker joined"
    newcomer = start()
    out = job.finish()
    assert newcomer.returncode == 0, (tmp_path / "worker-3.log").read_text()[-3000:]
    assert_job_ok(job, out)
    assert "worker 3 joined the running job" in coordinator_log(job), coordinator_log(job)[-3000:]
    joined = re.search(r"worker 3 joined the running job from \S+ at clock (\d+)",
                       (tmp_path / "worker-3.log").read_text())
    assert joined and int(joined.group(1)) > 0, (tmp_path / "worker-3.log").read_text()[-3000:]
    assert list(job.records.glob("worker-3-*.log")), "the newcomer logged no pushes"
    verdict = assert_audit_passes(job)
    assert verdict["applied"] == verdict["issued"] == verdict["acknowledged"]


def test_e3_a_primary_paused_past_its_lease_is_deposed_and_rejoins_empty(tmp_path):
    """Paused past its lease, server 1 is lost and its shards fail over; on
    SIGCONT the map deposes it (what it still held is refused by epoch),
    and it rejoins as a new node of its rank, empty: its audit dump is the
    new node's, and agrees with its copies' (or holds nothing)."""
    job = Job(tmp_path)
    pid = job.pid("tessera-server", "server-1")
    time.sleep(1.5)
    assert job.running(), "the job ended before the fault"
    os.kill(pid, signal.SIGSTOP)
    time.sleep(1.5)  # three leases
    os.kill(pid, signal.SIGCONT)
    out = job.finish()
    assert_job_ok(job, out)
    assert "lost server 1" in coordinator_log(job)
    assert "server 1 rejoined from" in coordinator_log(job), coordinator_log(job)[-3000:]
    server_log = (job.run_dir / "logs" / "server-1.log").read_text()
    assert "was removed from the job" in server_log, server_log[-2000:]
    rejoined = re.search(r"rejoined the job as server 1 \(node (\d+) was (\d+)", server_log)
    assert rejoined and rejoined.group(1) != rejoined.group(2), server_log[-2000:]
    dumps = sorted(p.name for p in job.audit.iterdir())
    assert [d for d in dumps if d.startswith("server-1-")] == [f"server-1-node-{rejoined.group(1)}.audit"], dumps
    assert_audit_passes(job)


def test_e7_a_worker_killed_and_restarted_applies_nothing_twice(tmp_path):
    job = Job(tmp_path, "cluster.on_worker_loss=wait", "timeouts.lease_seconds=1", "timeouts.heartbeat_seconds=0.2")
    pid = job.pid("tessera-audit-workload", "worker-1")
    argv, env = command_line(pid), job_environment(pid)
    time.sleep(1.5)
    assert job.running(), "the job ended before the fault"
    os.kill(pid, signal.SIGKILL)
    time.sleep(1.5)  # lost after the 1 s lease; its place is kept
    job.start(argv, tmp_path / "worker-1-again.log", env)
    out = job.finish()
    assert_job_ok(job, out)
    log = coordinator_log(job)
    assert "worker 1 rejoined" in log, log[-3000:]
    logs = sorted(p.name for p in job.records.iterdir())
    assert any("-inc-1.log" in name for name in logs), logs
    assert_audit_passes(job)


@pytest.mark.parametrize("seed", [11, 12])
def test_e5_dropped_duplicated_and_reordered_messages(tmp_path, seed):
    """Every process drops 2%, duplicates 2% and reorders 5% of the messages
    it sends (coordinator traffic too): requests and forwards unanswered past
    their learned resend timers go again, maps and shutdowns are repeated,
    and no push is lost or applied twice."""
    spec = f"seed={seed},drop=0.02,dup=0.02,reorder=0.05,side=send"
    job = Job(tmp_path, "worker.args.clocks=60", faults=spec)
    out = job.finish()
    assert_job_ok(job, out)
    log = (job.run_dir / "logs" / "worker-0.log").read_text()
    assert "fault injection on" in log, log[:2000]
    verdict = assert_audit_passes(job, min_acked=3 * 60 * 4)
    assert verdict["acknowledged"] == verdict["issued"]


@pytest.mark.parametrize("tier", ["memory", "disk"])
def test_e9_both_copies_of_some_shards_lost_are_restored_from_the_last_checkpoint(tmp_path, tier):
    """Servers 1 and 2 die together: the shards whose two copies were on
    them are lost. With on_shard_loss: restore the coordinator gives them to
    server 0, which loads them from the newest checkpoint (written every
    0.3 s) and says how many applied pushes that checkpoint misses; the job
    goes on. Pushes acknowledged after the checkpoint are lost (by design),
    and the audit names exactly which: server 0's dump lists, per restored
    shard, the pushes its checkpoint held by writer and sequence number,
    and every acknowledged push missing from a row must be one that
    checkpoint did not hold (else the audit fails). None is applied twice,
    every row's value matches its pushes, and the copies agree. With the
    disk tier the checkpoints are written from tables mostly on disk and
    restored into one."""
    job = Job(tmp_path, "cluster.on_shard_loss=restore", "checkpoints.dir=ckpt", "checkpoints.every_seconds=0.3",
              *(DISK_TIER if tier == "disk" else ()))
    one = job.pid("tessera-server", "server-1")
    two = job.pid("tessera-server", "server-2")
    time.sleep(2.0)
    assert job.running(), "the job ended before the fault"
    os.kill(one, signal.SIGKILL)
    os.kill(two, signal.SIGKILL)
    out = job.finish()
    assert_job_ok(job, out)
    log = coordinator_log(job)
    assert "they are restored from the last checkpoint" in log, log[-3000:]
    server0 = (job.run_dir / "logs" / "server-0.log").read_text()
    assert "checkpoint " in server0 and "written" in server0, server0[-2000:]
    restored = [line for line in server0.splitlines() if "restored" in line and "from checkpoints" in line]
    assert restored and "the checkpoints miss at least" in restored[0], server0[-3000:]
    check, verdict = job.verdict()
    assert verdict is not None, check.stdout + check.stderr
    assert verdict["ok"] and verdict["lost"] == 0, check.stdout  # every loss is one the restore explains
    assert verdict["duplicates"] == verdict["phantoms"] == verdict["values"] == verdict["replicas"] == 0, (
        check.stdout)
    assert verdict["applied"] <= verdict["issued"]
    assert len(verdict["servers"]) == 1, verdict
    restored = {v for server, v in verdict["restored_shards"]}
    assert restored and all(server.startswith("server-0-") for server, _ in verdict["restored_shards"]), verdict
    lost = verdict["lost_to_restore_pushes"]
    assert verdict["lost_to_restore"] == len({tuple(p[:3]) for p in lost})
    assert ("acknowledged pushes lost to the restore" in check.stdout
            and f"{verdict['lost_to_restore']} acknowledged pushes lost" in check.stdout), check.stdout
    if tier == "disk":
        assert_rows_went_to_disk(job, ["server-0"])


def test_e8_the_coordinator_killed_and_restarted_takes_the_job_over_from_its_state_file(tmp_path):
    """The launcher SIGKILLs the coordinator at 2 s and starts it again 0.5 s
    later: it reads its state file (membership, shard map and epoch), listens
    at the address it had, and the job goes on to its end; nothing is lost or
    applied twice. (With etcd and a standby: the test below.)"""
    job = Job(tmp_path, "faults=[{target: coordinator, action: restart, at_seconds: 2, restart_delay_seconds: 0.5}]")
    out = job.finish()
    assert_job_ok(job, out)
    log = coordinator_log(job)
    assert "taking the job over from" in log and "took the job over from the state file" in log, log[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["faults"][0]["target"] == "coordinator" and summary["faults"][0]["restarted_pid"], summary["faults"]
    assert_audit_passes(job)


def node_log_lines(job):
    """Every server's and worker's log lines, file by file (each in its own order)."""
    lines = []
    for path in sorted((job.run_dir / "logs").glob("*.log")):
        if path.name.startswith(("server-", "worker-")):
            lines += path.read_text().splitlines()
    return lines


@pytest.fixture
def etcd(tmp_path):
    if LocalEtcd.missing():
        pytest.skip(LocalEtcd.missing())
    with LocalEtcd(tmp_path / "etcd") as server:
        yield server


def test_e8_the_coordinator_killed_during_a_server_failover_is_taken_over_by_a_standby_through_etcd(tmp_path, etcd):
    """Server 1 is killed at 2 s; the coordinator (the leader in etcd) at
    2.55 s, about when it declares the server lost. The standby takes the
    leadership when the leader's 2 s etcd lease runs out, takes the job over
    from the state in etcd, finishes the failover, and the nodes follow it
    to its address. Every node's shard map epochs only increase, no epoch
    ever has two different maps (so no shard ever has two primaries under
    one epoch), and the audit finds nothing lost or applied twice."""
    job = Job(tmp_path, f"coordinator.etcd={etcd.endpoint}", "coordinator.standbys=1",
              "faults=[{target: server-1, action: kill, at_seconds: 2}, "
              "{target: coordinator, action: kill, at_seconds: 2.55}]")
    out = job.finish()
    assert_job_ok(job, out)
    standby = (job.run_dir / "logs" / "coordinator-1.log").read_text()
    assert "standing by: job" in standby and "won the leadership of job" in standby, standby[-3000:]
    assert "took the job over from etcd" in standby, standby[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    killed = [f for f in summary["faults"] if f["target"] == "coordinator"][0]
    assert killed["recovered"] and "coordinator-1 took the leadership over" in killed["note"], killed
    lines = node_log_lines(job)
    assert any("moved from" in line and "a standby took over" in line for line in lines)
    assert shard_map_problems(lines) == []
    epochs = {int(m) for m in re.findall(r"shard map epoch (\d+) \(map", "\n".join(lines))}
    assert max(epochs) >= 2, "the server was never failed over"
    assert_audit_passes(job)


def test_a_standby_finds_the_job_ended_and_exits_with_its_status(tmp_path, etcd):
    """No fault: the leader finishes the job and gives its lease back; the
    standby then wins the leadership, finds the job's state ended ok in
    etcd, and exits 0 instead of running the job again."""
    job = Job(tmp_path, "worker.args.clocks=40", f"coordinator.etcd={etcd.endpoint}", "coordinator.standbys=1")
    out = job.finish()
    assert_job_ok(job, out)
    standby = (job.run_dir / "logs" / "coordinator-1.log").read_text()
    assert "has ended under an earlier coordinator (ok)" in standby, standby[-2000:]
    assert "coordinator-1 exited with status 0" in out, out[-3000:]
    # The job's keys: its state stays; the leader key went with the last coordinator's lease.
    key = f"{job.run_dir.name}-{hashlib.sha1(str(job.run_dir.resolve()).encode()).hexdigest()[:8]}"
    assert etcd.get(f"/tessera/{key}/state"), "no coordinator state in etcd"
    assert etcd.get(f"/tessera/{key}/leader") is None, "a coordinator still holds the leadership"
    assert_audit_passes(job, min_acked=3 * 40 * 4)
