"""Process faults end to end: configs/fault_kill_server.yaml through
launcher/tessera-launch with the real binaries. The consistency workload
runs on 3 servers with replication 2; the config's schedule SIGKILLs
server-1 2 s after every process started and pauses worker-1 for 0.3 s
(well under its 5 s lease). The job must end ok, and summary.json must say
how long the coordinator took to declare server-1 lost and the first worker
to have a push acknowledged on the new shard map."""

from __future__ import annotations

import json
import os
import sys

import pytest



def read_summary(result):
    path = result.run_dir / "summary.json"
    assert path.is_file(), f"no summary.json in {result.run_dir}; {result.describe()}"
    return json.loads(path.read_text())


def test_killed_server_fails_over_and_paused_worker_survives(launcher, build_dir, source_dir, tmp_path):
    needed = [build_dir / "coordinator" / "tessera-coordinator", build_dir / "server" / "tessera-server",
              build_dir / "tests" / "consistency" / "tessera-consistency-workload"]
    missing = [str(p) for p in needed if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail("not built: " + ", ".join(missing) + " (cmake --build the build tree first)")
    records = tmp_path / "records"
    records.mkdir()
    result = launcher.local("--config", str(source_dir / "configs" / "fault_kill_server.yaml"), "--quiet",
                            "--timeout", "150", "--set", f"worker.program={needed[2]}",
                            "--set", f"worker.args.records={records}")
    assert result.returncode == 0, result.describe()
    summary = read_summary(result)
    assert summary["status"] == "ok", summary["reason"]
    assert summary["processes"]["server-1"] == -9, summary["processes"]
    assert sorted(p.name for p in records.iterdir()) == ["worker-0.txt", "worker-1.txt", "worker-2.txt"]

    faults = {f["index"]: f for f in summary["faults"]}
    kill, pause = faults[0], faults[1]
    assert (kill["target"], kill["action"], kill["fired"]) == ("server-1", "kill", True), kill
    assert kill["detection_seconds"] is not None, kill
    # Timings are measured (bench/run_fault_matrix.sh), not asserted: only that they were found.
    assert kill["detection_seconds"] is not None and kill["detection_seconds"] > 0, kill
    assert kill["failover_seconds"] is not None, kill
    assert kill["failover_seconds"] >= kill["detection_seconds"] and kill["failover_epoch"] == 2, kill
    assert kill["recovered"] is True, kill

    assert (pause["target"], pause["action"], pause["fired"]) == ("worker-1", "pause", True), pause
    assert pause["resumed_seconds"] >= 0.3, pause  # never resumed before its duration
    assert pause["detection_seconds"] is None and pause["recovered"] is True, pause

    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["fault"]) for e in events] == [("fault", 1), ("resume", 1), ("fault", 0)], events
    coordinator_log = (result.run_dir / "logs" / "coordinator.log").read_text()
    assert "lost server 1 (" in coordinator_log
    assert "lost worker 1" not in coordinator_log  # the pause stayed within the lease
    print(f"\nserver-1 killed: detection {kill['detection_seconds']} s, failover {kill['failover_seconds']} s "
          f"(last worker {kill['failover_seconds_last_worker']} s)")


def test_killed_coordinator_is_taken_over_by_its_standby(launcher, build_dir, source_dir, tmp_path):
    """configs/fault_kill_coordinator.yaml with an etcd of the test's own on
    loopback: the leading coordinator dies during a server failover, the
    standby takes over, and the BSP job ends ok with every worker's records."""
    sys.path.insert(0, str(source_dir / "tests"))
    from jobprocs import LocalEtcd
    if LocalEtcd.missing():
        pytest.skip(LocalEtcd.missing())
    workload = build_dir / "tests" / "consistency" / "tessera-consistency-workload"
    records = tmp_path / "records"
    records.mkdir()
    with LocalEtcd(tmp_path / "etcd") as etcd:
        result = launcher.local("--config", str(source_dir / "configs" / "fault_kill_coordinator.yaml"), "--quiet",
                                "--timeout", "150", "--set", f"worker.program={workload}",
                                "--set", f"worker.args.records={records}",
                                "--set", f"coordinator.etcd={etcd.endpoint}")
    assert result.returncode == 0, result.describe()
    summary = read_summary(result)
    assert summary["status"] == "ok", summary["reason"]
    assert sorted(p.name for p in records.iterdir()) == ["worker-0.txt", "worker-1.txt", "worker-2.txt"]
    faults = {f["target"]: f for f in summary["faults"]}
    server, coordinator = faults["server-1"], faults["coordinator"]
    assert coordinator["recovered"] is True and coordinator["detection_seconds"] is not None, coordinator
    assert server["recovered"] is True and server["detection_seconds"] is not None, server
    standby = (result.run_dir / "logs" / "coordinator-1.log").read_text()
    assert "took the job over from etcd" in standby and "lost server 1 (" in standby + (
        result.run_dir / "logs" / "coordinator.log").read_text()
    print(f"\ncoordinator killed: standby led {coordinator['detection_seconds']} s later; server-1 failover "
          f"{server['failover_seconds']} s after its kill")
