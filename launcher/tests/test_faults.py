"""Tests of process faults (tessera_launch.faults): the `faults` config list,
the schedule run through a Supervisor with throwaway scripts, and whole
jobs against the fake cluster (fake_cluster.py) with faults in them."""

import io
import json
import signal
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCHER_DIR, is_dead, write_script
from tessera_launch.cli import main
from tessera_launch.config import ConfigError, load_config
from tessera_launch.faults import FaultScheduler, FaultSpec
from tessera_launch.local import LocalOptions, run_local
from tessera_launch.supervisor import Console, ProcessSpec, ProgressTracker, Supervisor

REPO = LAUNCHER_DIR.parent

BASE = """\
cluster:
  servers: 3
  workers: 2
worker:
  program: tessera-logreg
"""


def config_with(tmp_path: Path, faults: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(BASE + "faults:\n" + textwrap.indent(textwrap.dedent(faults), "  "))
    return path


def error_of(path, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


# -- the config ---------------------------------------------------------------


def test_valid_faults_become_specs(tmp_path):
    path = config_with(tmp_path, """\
        - {target: server-1, action: kill, at_seconds: 2}
        - {target: worker-1, action: pause, at_step: 100, step_of: worker-0, duration_seconds: 0.3}
        - {target: server-2, action: restart, at_seconds: 5}
        - {target: worker-0, action: restart, at_step: 10, restart_delay_seconds: 0}
        - {target: coordinator, action: pause, at_seconds: 1.5, duration_seconds: 1}
        """)
    with pytest.raises(ConfigError):
        load_config(path)  # worker restart needs on_worker_loss: wait
    config = load_config(path, ["cluster.on_worker_loss=wait"])
    assert config.faults == (
        FaultSpec(0, "server-1", "kill", at_seconds=2.0),
        FaultSpec(1, "worker-1", "pause", at_step=100, step_of="worker-0", duration_seconds=0.3),
        FaultSpec(2, "server-2", "restart", at_seconds=5.0, restart_delay_seconds=0.5),
        FaultSpec(3, "worker-0", "restart", at_step=10, restart_delay_seconds=0.0),
        FaultSpec(4, "coordinator", "pause", at_seconds=1.5, duration_seconds=1.0),
    )
    assert config.faults[1].describe() == "fault 1 (pause worker-1 for 0.3 s at step 100 of worker-0)"
    assert (config.faults[0].role, config.faults[0].rank) == ("server", 1)


def test_faults_round_trip_through_the_resolved_config(tmp_path):
    path = config_with(tmp_path, """\
        - {target: server-1, action: kill, at_seconds: 2}
        - {target: server-0, action: restart, at_step: 7}
        """)
    config = load_config(path)
    again = tmp_path / "again.yaml"
    again.write_text(config.to_yaml())
    assert load_config(again).faults == config.faults
    assert yaml.safe_load(config.to_yaml())["faults"][1] == {
        "target": "server-0", "action": "restart", "at_step": 7, "restart_delay_seconds": 0.5}


def test_no_faults_leaves_the_resolved_config_as_it_was(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(BASE + "faults:\n")
    config = load_config(path)
    assert config.faults == () and "faults" not in config.to_dict()


@pytest.mark.parametrize("entry, expected", [
    ("- {target: server-3, action: kill, at_seconds: 1}",
     ":7: faults[0].target server-3 does not exist: the job has 3 servers (server-0 to server-2)"),
    ("- {target: srv-1, action: kill, at_seconds: 1}",
     ':7: faults[0].target must be coordinator, server-R or worker-R, got "srv-1"'),
    ("- {target: server-1, action: crash, at_seconds: 1}",
     ':7: faults[0].action must be one of kill | pause | restart, got "crash"'),
    ("- {action: kill, at_seconds: 1}",
     ":7: faults[0].target is required (coordinator, server-R or worker-R)"),
    ("- {target: server-1, at_seconds: 1}", ":7: faults[0].action is required (kill | pause | restart)"),
    ("- {target: server-1, action: kill}",
     ":7: faults[0] needs at_seconds (seconds after every process of the job started) or at_step"),
    ("- {target: server-1, action: kill, at_seconds: 1, at_step: 3}",
     ":7: faults[0] takes at_seconds or at_step, not both"),
    ("- {target: server-1, action: kill, at_seconds: -1}",
     ":7: faults[0].at_seconds must be a non-negative number (seconds after every process of the job started), "
     "got -1"),
    ("- {target: server-1, action: kill, at_step: 2.5}",
     ":7: faults[0].at_step must be a non-negative integer (a worker's step), got 2.5"),
    ("- {target: server-1, action: kill, at_seconds: 1, step_of: worker-0}",
     ":7: faults[0].step_of goes with at_step (whose steps count)"),
    ("- {target: server-1, action: kill, at_step: 1, step_of: server-0}",
     ':7: faults[0].step_of must be worker-R, got "server-0"'),
    ("- {target: server-1, action: kill, at_step: 1, step_of: worker-2}",
     ":7: faults[0].step_of worker-2 does not exist: the job has 2 workers (worker-0 to worker-1)"),
    ("- {target: server-1, action: pause, at_seconds: 1}",
     ":7: faults[0].duration_seconds is required for pause (seconds between SIGSTOP and SIGCONT)"),
    ("- {target: server-1, action: pause, at_seconds: 1, duration_seconds: 0}",
     ":7: faults[0].duration_seconds must be a positive number (seconds), got 0"),
    ("- {target: server-1, action: kill, at_seconds: 1, duration_seconds: 1}",
     ":7: faults[0].duration_seconds applies to pause only (action is kill)"),
    ("- {target: server-1, action: kill, at_seconds: 1, restart_delay_seconds: 1}",
     ":7: faults[0].restart_delay_seconds applies to restart only (action is kill)"),
    ("- {target: server-1, action: restart, at_seconds: 1, restart_delay_seconds: soon}",
     ':7: faults[0].restart_delay_seconds must be a non-negative number (seconds), got "soon"'),
    ("- {target: worker-1, action: restart, at_seconds: 1}",
     ":7: faults[0]: restarting worker-1 needs cluster.on_worker_loss: wait (it is stop)"),
    ("- {target: server-1, action: kill, at_second: 1}",
     ":7: unknown key faults[0].at_second; did you mean faults[0].at_seconds?"),
    ("- kill server-1", ':7: faults[0] must be a mapping with target, action and at_seconds or at_step, '
                        'got "kill server-1"'),
])
def test_bad_entries_are_named_by_index_and_key(tmp_path, entry, expected):
    path = config_with(tmp_path, entry)
    message = error_of(path)
    assert f"{path}{expected}" in message, message


def test_errors_point_at_the_line_of_the_bad_key_in_block_style(tmp_path):
    path = config_with(tmp_path, """\
        - target: server-1
          action: kill
          at_seconds: 1
        - target: worker-0
          action: pause
          at_seconds: 2
          duration_seconds: -3
        """)
    assert error_of(path) == f"{path}:13: faults[1].duration_seconds must be a positive number (seconds), got -3"


def test_faults_must_be_a_list(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(BASE + "faults:\n  target: server-1\n")
    assert error_of(path).startswith(f"{path}:6: faults must be a list of faults")


def test_faults_by_override(tmp_path):
    path = config_with(tmp_path, "- {target: server-1, action: kill, at_seconds: 2}\n")
    config = load_config(path, ["faults.0.at_seconds=4", "faults.0.target=server-2"])
    assert config.faults[0] == FaultSpec(0, "server-2", "kill", at_seconds=4.0)
    config = load_config(tmp_path / "job.yaml", ["faults=[{target: worker-0, action: kill, at_step: 3}]"])
    assert config.faults == (FaultSpec(0, "worker-0", "kill", at_step=3),)
    assert error_of(path, ["faults.0.at_seconds=later"]) == (
        '--set faults.0.at_seconds=later: faults[0].at_seconds must be a non-negative number (seconds after '
        'every process of the job started), got "later"')
    assert error_of(path, ["faults.3.at_seconds=1"]) == (
        "--set faults.3.at_seconds=1: faults.3: the list has 1 entries (0 to 0)")


def test_supervising_back_ends_take_faults_and_kubernetes_refuses_them(tmp_path, capsys):
    path = config_with(tmp_path, "- {target: server-1, action: kill, at_seconds: 2}\n")
    for backend in ("mpirun", "slurm"):
        assert main([backend, "--config", str(path), "--dry-run"]) == 0, backend
        assert "fault 0 (kill server-1 at 2 s)" in capsys.readouterr().out
    assert main(["kubernetes", "--config", str(path), "--dry-run"]) == 2
    assert "kubernetes does not supervise the job's processes" in capsys.readouterr().err


def test_dry_run_lists_the_faults(tmp_path, capsys):
    path = config_with(tmp_path, "- {target: server-1, action: kill, at_seconds: 2}\n")
    assert main(["local", "--config", str(path), "--dry-run"]) == 0
    assert "fault 0 (kill server-1 at 2 s)" in capsys.readouterr().out


# -- the schedule against real processes ------------------------------------------


SLEEPER = "import time\ntime.sleep(60)\n"
COUNTER = """\
import json, time
for step in range(1, 50):
    print("TESSERA_PROGRESS " + json.dumps({"step": step}), flush=True)
    time.sleep(0.02)
"""


@pytest.fixture
def sup_and_terminal(tmp_path):
    terminal = io.StringIO()
    progress = ProgressTracker(tmp_path / "progress.jsonl")
    sup = Supervisor(tmp_path / "logs", Console(terminal), progress, grace_seconds=1.0)
    yield sup, terminal, progress
    progress.close()


def scheduler_for(tmp_path, sup, progress, *specs):
    scheduler = FaultScheduler(list(specs), sup, tmp_path / "events.jsonl", progress.started)
    scheduler.attach()
    return scheduler


def test_kill_is_tolerated_and_recorded(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    server = [str(write_script(tmp_path / "server.py", SLEEPER))]
    leader = [str(write_script(tmp_path / "leader.py", "import time\ntime.sleep(1.0)\n"))]
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress, FaultSpec(0, "server-1", "kill", at_seconds=0.3))
        sup.start(ProcessSpec("coordinator", leader))
        sup.start(ProcessSpec("server-1", server))
        scheduler.arm()
        outcome = sup.run(timeout=20, leader="coordinator", leader_grace=5)
    scheduler.finish()
    assert outcome.status == "completed", outcome.reason
    assert sup.tolerated_failures == {"server-1": -signal.SIGKILL}
    assert "server-1 was killed by SIGKILL (fault 0: kill)" in terminal.getvalue()
    [record] = scheduler.records()
    assert record["fired"] and record["skipped"] is None
    assert 0.3 <= record["seconds"] < 0.6
    assert record["time"].startswith(time.strftime("%Y-")) and record["pid"] is not None
    [event] = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert event["kind"] == "fault" and event["what"] == "fault 0: kill server-1"
    assert event["elapsed"] >= record["seconds"]


def test_a_killed_coordinator_ends_the_job_naming_the_fault(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress, FaultSpec(0, "coordinator", "kill", at_seconds=0.1))
        sup.start(ProcessSpec("coordinator", [str(write_script(tmp_path / "c.py", SLEEPER))]))
        scheduler.arm()
        outcome = sup.run(timeout=20, leader="coordinator")
    assert outcome.status == "failed" and outcome.culprit == "coordinator"
    assert outcome.reason == "coordinator was killed by SIGKILL (fault 0: kill)"


def test_pause_stops_and_continues_the_process(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress,
                                  FaultSpec(0, "worker-0", "pause", at_step=20, duration_seconds=0.5))
        sup.start(ProcessSpec("worker-0", [str(write_script(tmp_path / "w.py", COUNTER))], rank=0))
        scheduler.arm()
        outcome = sup.run(timeout=30)
    scheduler.finish()
    assert outcome.status == "completed", outcome.reason
    [record] = scheduler.records()
    assert record["trigger"] == "worker-0 reported step 20"
    assert 0.5 <= record["resumed_seconds"] < 0.8
    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    gaps = [b["elapsed"] - a["elapsed"] for a, b in zip(records, records[1:])]
    assert max(gaps) >= 0.45  # the pause shows in the progress
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert kinds == ["fault", "resume"]


def test_step_of_waits_for_that_worker(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    slow = COUNTER.replace("0.02", "0.1").replace("50", "8")
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress,
                                  FaultSpec(0, "worker-0", "kill", at_step=5, step_of="worker-1"))
        sup.start(ProcessSpec("worker-0", [str(write_script(tmp_path / "w0.py", COUNTER))], rank=0))
        sup.start(ProcessSpec("worker-1", [str(write_script(tmp_path / "w1.py", slow))], rank=1, may_fail=True))
        scheduler.arm()
        outcome = sup.run(timeout=40)
    scheduler.finish()
    [record] = scheduler.records()
    assert record["trigger"] == "worker-1 reported step 5"
    assert record["seconds"] >= 0.35  # worker-0 was far past step 5 by then
    assert outcome.status == "completed"


LOSES_SERVER_1 = """\
    import time
    time.sleep(0.5)
    print("2026-12-03 08:42:31.094 coordinator warning lost server 1 (x): no heartbeat for 0.5 s; "
          "its shards fail over to their backups (map epoch 2)", flush=True)
    time.sleep(1.5)
    """


def test_restart_starts_the_same_command_again(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    marker = tmp_path / "starts"
    server = [str(write_script(tmp_path / "server.py", f"""\
        import time
        with open({str(marker)!r}, "a") as f:
            f.write("start\\n")
        print("up", flush=True)
        time.sleep(60)
        """))]
    leader = [str(write_script(tmp_path / "leader.py", LOSES_SERVER_1))]
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress,
                                  FaultSpec(0, "server-1", "restart", at_seconds=0.2, restart_delay_seconds=0.4))
        sup.start(ProcessSpec("coordinator", leader))
        sup.start(ProcessSpec("server-1", server))
        first_pid = sup.pid_of("server-1")
        scheduler.arm()
        outcome = sup.run(timeout=20, leader="coordinator", leader_grace=0.5)
    scheduler.finish()
    assert outcome.status == "completed" and outcome.stragglers == ["server-1"]
    assert marker.read_text() == "start\nstart\n"
    [record] = scheduler.records()
    assert 0.6 <= record["restarted_seconds"] < 1.0  # 0.4 s after the coordinator's line, 0.3 s after the kill
    assert record["restarted_pid"] not in (None, first_pid) and is_dead(first_pid)
    assert (tmp_path / "logs" / "server-1.log").read_text() == "[server-1] up\n[server-1] up\n"
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert kinds == ["fault", "restart"]


def test_worker_restart_waits_for_the_coordinator_to_declare_it_lost(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    coordinator = [str(write_script(tmp_path / "coordinator.py", """\
        import time
        time.sleep(1.0)
        print("2026-12-03 08:42:31.094 coordinator warning lost worker 1 (x): no heartbeat for 0.7 s; "
              "its place is kept for a replacement for up to 60 s (on_worker_loss: wait)", flush=True)
        time.sleep(1.0)
        """))]
    worker = [str(write_script(tmp_path / "worker.py", SLEEPER))]
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress,
                                  FaultSpec(0, "worker-1", "restart", at_seconds=0.2, restart_delay_seconds=0.1))
        sup.start(ProcessSpec("coordinator", coordinator))
        sup.start(ProcessSpec("worker-1", worker, rank=1))
        scheduler.arm()
        outcome = sup.run(timeout=20, leader="coordinator", leader_grace=0.3)
    scheduler.finish()
    [record] = scheduler.records()
    assert record["restarted_seconds"] >= 0.85  # the line came about 0.8 s after the kill
    assert outcome.stragglers == ["worker-1"]


def test_a_fault_on_a_process_that_has_exited_is_skipped(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    leader = [str(write_script(tmp_path / "leader.py", "import time\ntime.sleep(0.8)\n"))]
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress, FaultSpec(0, "server-0", "kill", at_seconds=0.4),
                                  FaultSpec(1, "server-1", "kill", at_seconds=60))
        sup.start(ProcessSpec("coordinator", leader))
        sup.start(ProcessSpec("server-0", [str(write_script(tmp_path / "quick.py", "pass\n"))]))
        scheduler.arm()
        outcome = sup.run(timeout=20, leader="coordinator")
    scheduler.finish()
    assert outcome.status == "completed"
    first, second = scheduler.records()
    assert first["skipped"] == "server-0 had already exited with status 0 when it was due"
    assert not first["fired"] and first["seconds"] is None
    assert second["skipped"] == "the job ended before it was due"
    assert "fault 0 (kill server-0 at 0.4 s): server-0 had already exited with status 0 when it was due; " \
           "skipped" in terminal.getvalue()


def test_stopping_the_job_wakes_a_paused_process(tmp_path, sup_and_terminal):
    sup, terminal, progress = sup_and_terminal
    handler = [str(write_script(tmp_path / "graceful.py", """\
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (print("bye", flush=True), sys.exit(0)))
        time.sleep(60)
        """))]
    with sup:
        scheduler = scheduler_for(tmp_path, sup, progress,
                                  FaultSpec(0, "server-0", "pause", at_seconds=0.1, duration_seconds=30))
        sup.start(ProcessSpec("server-0", handler))
        scheduler.arm()
        started = time.monotonic()
        outcome = sup.run(timeout=1.0)
    assert outcome.status == "timeout"
    assert time.monotonic() - started < 1.0 + 0.9  # SIGTERM acted at once, no SIGKILL after the grace
    assert "bye" in sup.tail("server-0")


# -- whole jobs against the stand-ins --------------------------------------------------


JOB = """\
job:
  name: fault-job
cluster:
  servers: 2
  workers: 2
  vshards: 8
timeouts:
  assemble_seconds: 5
worker:
  program: fake-worker
"""


def run_fake(tmp_path, fake_build, faults: str, *sets, skip=()):
    path = tmp_path / "job.yaml"
    path.write_text(JOB + "faults:\n" + textwrap.indent(textwrap.dedent(faults), "  "))
    terminal = io.StringIO()
    run_dir = tmp_path / "run"
    code = run_local(LocalOptions(config=str(path), build_dir=str(fake_build), run_dir=str(run_dir),
                                  overrides=list(sets), stream=terminal, skip=list(skip), quiet=True))
    return code, json.loads((run_dir / "summary.json").read_text()), terminal.getvalue(), run_dir


def test_job_with_a_killed_server_and_a_paused_worker(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_STEPS", "30")
    code, summary, terminal, run_dir = run_fake(tmp_path, fake_build, """\
        - {target: server-1, action: kill, at_step: 3, step_of: worker-0}
        - {target: worker-1, action: pause, at_step: 5, duration_seconds: 0.2}
        """)
    assert code == 0, terminal
    assert summary["status"] == "ok"
    assert summary["processes"]["server-1"] == -signal.SIGKILL
    kill, pause = summary["faults"]
    assert (kill["target"], kill["action"], kill["fired"]) == ("server-1", "kill", True)
    assert kill["trigger"] == "worker-0 reported step 3"
    # The stand-in coordinator logs no `lost server` line: null, with a note.
    assert kill["detection_seconds"] is None and kill["failover_seconds"] is None
    assert kill["recovered"] is False and "no 'lost server 1' line" in kill["note"]
    assert pause["recovered"] is True and pause["resumed_seconds"] >= 0.2
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["fault"]) for e in events] == [("fault", 0), ("fault", 1), ("resume", 1)]
    assert "fault         0: kill server-1 at " in terminal


def test_job_with_a_restarted_worker_measures_the_rejoin(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_STEPS", "20")
    code, summary, terminal, run_dir = run_fake(tmp_path, fake_build, """\
        - {target: worker-1, action: restart, at_step: 2, step_of: worker-1, restart_delay_seconds: 0.2}
        """, "cluster.on_worker_loss=wait")
    assert code == 0, terminal
    [fault] = summary["faults"]
    assert fault["restarted_seconds"] >= 0.2 and fault["recovered"] is True, fault
    assert fault["detection_seconds"] is not None and fault["rejoin_seconds"] >= fault["detection_seconds"]
    assert "worker-1 was killed by SIGKILL (fault 0: restart)" in terminal
    assert "fault 0: started worker-1 again" in terminal
    # Both incarnations wrote to the same log.
    assert (run_dir / "logs" / "worker-1.log").read_text().count("args") == 2


def test_a_fault_on_a_skipped_process_is_reported_and_skipped(tmp_path, fake_build):
    code, summary, terminal, run_dir = run_fake(tmp_path, fake_build, """\
        - {target: server-1, action: kill, at_seconds: 0}
        """, "timeouts.assemble_seconds=1", skip=["server-1"])
    assert code == 1  # the stand-in coordinator misses server-1
    [fault] = summary["faults"]
    assert fault["skipped"] == "server-1 was not started when it was due" and fault["recovered"] is None


def test_report_draws_and_lists_the_faults(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_STEPS", "30")
    code, summary, terminal, run_dir = run_fake(tmp_path, fake_build, """\
        - {target: server-1, action: kill, at_step: 3}
        """)
    assert main(["report", str(run_dir)]) == 0
    md = (run_dir / "report.md").read_text()
    assert "## Faults" in md
    assert "| 0 | kill server-1 | " in md and "| - | - | - | no | no 'lost server 1' line" in md
    assert (run_dir / "throughput.png").stat().st_size > 5000
