"""Tests of tessera_launch.supervisor with real processes: tiny Python
scripts written into a temporary directory stand in for the job's programs.
They check the supervisor itself (prefixing, logs, progress, the stop policy,
escalation, timeouts, signals, orphans), not a Tessera job."""

import io
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import LAUNCHER_DIR, is_dead, wait_for, write_script
from tessera_launch.supervisor import Console, ProcessSpec, ProgressTracker, Supervisor, describe_exit


@pytest.fixture
def make(tmp_path):
    """make(echo=True, grace=1.0) -> (supervisor, terminal StringIO); the
    supervisor's progress goes to tmp_path/progress.jsonl."""
    made = []

    def factory(echo=True, grace=1.0, interval=1.0, handle_signals=True):
        terminal = io.StringIO()
        progress = ProgressTracker(tmp_path / "progress.jsonl", interval=interval)
        sup = Supervisor(tmp_path / "logs", Console(terminal, echo_processes=echo), progress,
                         grace_seconds=grace, handle_signals=handle_signals)
        made.append(progress)
        return sup, terminal

    yield factory
    for progress in made:
        progress.close()


def script(tmp_path, name, body):
    """A ProcessSpec argv for a throwaway script."""
    return [str(write_script(tmp_path / f"{name}.py", body))]


SLEEPER = """\
    import time
    time.sleep(60)
    """


def log_lines(tmp_path, name):
    return (tmp_path / "logs" / f"{name}.log").read_text().splitlines()


# -- output ----------------------------------------------------------------


def test_output_is_prefixed_on_the_terminal_and_in_the_log(tmp_path, make):
    argv = script(tmp_path, "talker", """\
        import sys
        print("hello", flush=True)
        print("oops", file=sys.stderr, flush=True)
        sys.stdout.write("no newline at the end")
        """)
    sup, terminal = make()
    with sup:
        sup.start(ProcessSpec("talker", argv))
        outcome = sup.run(timeout=20)
    assert outcome.status == "completed"
    expected = ["[talker] hello", "[talker] oops", "[talker] no newline at the end"]
    assert log_lines(tmp_path, "talker") == expected
    shown = terminal.getvalue().splitlines()
    assert [line for line in shown if line.startswith("[talker]")] == expected
    assert "[launch] talker exited with status 0" in shown
    assert sup.tail("talker") == ["hello", "oops", "no newline at the end"]


def test_quiet_keeps_process_output_off_the_terminal_only(tmp_path, make):
    argv = script(tmp_path, "talker", 'print("chatter")\n')
    sup, terminal = make(echo=False)
    with sup:
        sup.start(ProcessSpec("talker", argv))
        sup.run(timeout=20)
    assert "chatter" not in terminal.getvalue()
    assert "[launch] talker exited with status 0" in terminal.getvalue()
    assert log_lines(tmp_path, "talker") == ["[talker] chatter"]


def test_many_processes_keep_their_lines_apart(tmp_path, make):
    body = """\
        import sys
        for i in range(300):
            print(f"{sys.argv[1]} line {i}", flush=True)
        """
    path = write_script(tmp_path / "counter.py", body)
    sup, _ = make(echo=False)
    with sup:
        for n in range(3):
            sup.start(ProcessSpec(f"p-{n}", [str(path), f"p-{n}"]))
        assert sup.run(timeout=20).status == "completed"
    for n in range(3):
        assert log_lines(tmp_path, f"p-{n}") == [f"[p-{n}] p-{n} line {i}" for i in range(300)]


# -- the worker line protocol -----------------------------------------------


def test_progress_and_result_lines_are_parsed(tmp_path, make):
    argv = script(tmp_path, "worker", """\
        import json
        for step in (10, 20):
            print("TESSERA_PROGRESS " + json.dumps({"epoch": 1, "step": step, "loss": 1.0 / step}), flush=True)
        print("TESSERA_PROGRESS {not json", flush=True)
        print("TESSERA_PROGRESS [1, 2]", flush=True)
        print('TESSERA_RESULT {"steps": 20, "final_loss": 0.05, "test_auc": 0.8}', flush=True)
        """)
    sup, terminal = make()
    with sup:
        sup.start(ProcessSpec("worker-3", argv, rank=3))
        sup.run(timeout=20)

    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20]
    assert all(r["worker"] == 3 and r["epoch"] == 1 for r in records)
    assert all(isinstance(r["time"], float) and r["elapsed"] >= 0 for r in records)
    assert sup.results == {"worker-3": {"steps": 20, "final_loss": 0.05, "test_auc": 0.8}}
    assert sup.results_by_rank() == {3: {"steps": 20, "final_loss": 0.05, "test_auc": 0.8}}

    shown = terminal.getvalue()
    assert '"step": 10' not in shown  # well-formed progress stays off the terminal
    assert "[worker-3] TESSERA_PROGRESS {not json" in shown  # malformed: shown as text
    assert shown.count("malformed TESSERA_PROGRESS line") == 1  # warned once
    assert "[worker-3] TESSERA_RESULT" in shown
    assert len(log_lines(tmp_path, "worker-3")) == 5  # the log has every line


def test_protocol_lines_of_non_workers_are_plain_text(tmp_path, make):
    argv = script(tmp_path, "server", 'print("TESSERA_PROGRESS {\\"step\\": 1}", flush=True)\n')
    sup, terminal = make()
    with sup:
        sup.start(ProcessSpec("server-0", argv))  # no rank: not a worker
        sup.run(timeout=20)
    assert not (tmp_path / "progress.jsonl").read_text()
    assert '[server-0] TESSERA_PROGRESS {"step": 1}' in terminal.getvalue()


def test_progress_report_at_most_once_per_interval():
    now = [100.0]
    tracker = ProgressTracker(None, interval=1.0, clock=lambda: now[0], wall_clock=lambda: 0.0)
    assert tracker.due_report() is None  # nothing yet
    tracker.record(0, {"epoch": 1, "step": 100, "loss": 0.5})
    tracker.record(1, {"epoch": 1, "step": 100, "loss": 0.3})
    now[0] = 100.5
    assert tracker.due_report() is None  # too soon
    tracker.record(0, {"epoch": 2, "step": 150, "loss": 0.5})
    now[0] = 101.0
    report = tracker.due_report()
    assert report == "epoch 2 | step 250 | loss 0.4 | 50.0 steps/s | elapsed 0:01 | 2 workers reporting"
    now[0] = 103.0
    assert tracker.due_report() is None  # nothing new since the last report
    tracker.record(1, {"epoch": 2, "step": 250})
    assert "step 400" in tracker.due_report()


# -- the stop policy ---------------------------------------------------------


def test_first_failure_stops_everything_and_reports_its_exit_code(tmp_path, make):
    failer = script(tmp_path, "failer", """\
        import sys, time
        time.sleep(0.3)
        print("giving up", flush=True)
        sys.exit(3)
        """)
    sup, terminal = make(grace=1.0)
    started = time.monotonic()
    with sup:
        sup.start(ProcessSpec("sleeper-a", script(tmp_path, "sleeper", SLEEPER)))
        sup.start(ProcessSpec("failer", failer))
        sup.start(ProcessSpec("sleeper-b", script(tmp_path, "sleeper", SLEEPER)))
        outcome = sup.run(timeout=30)
    assert time.monotonic() - started < 10
    assert outcome.status == "failed"
    assert (outcome.culprit, outcome.culprit_code) == ("failer", 3)
    assert outcome.reason == "failer exited with status 3"
    assert outcome.exit_codes == {"sleeper-a": -signal.SIGTERM, "failer": 3, "sleeper-b": -signal.SIGTERM}
    assert outcome.stopped == ["sleeper-a", "sleeper-b"]
    assert sup.tail("failer") == ["giving up"]


def test_a_cascade_settles_before_the_launcher_stops_anyone(tmp_path, make):
    first = script(tmp_path, "first", "import sys\nsys.exit(2)\n")
    follows = script(tmp_path, "follows", "import sys, time\ntime.sleep(0.3)\nsys.exit(7)\n")
    sup, _ = make()
    with sup:
        sup.start(ProcessSpec("first", first))
        sup.start(ProcessSpec("follows", follows))
        sup.start(ProcessSpec("sleeper", script(tmp_path, "sleeper", SLEEPER)))
        outcome = sup.run(timeout=30)
    assert outcome.culprit == "first"
    assert outcome.exit_codes == {"first": 2, "follows": 7, "sleeper": -signal.SIGTERM}
    assert outcome.stopped == ["sleeper"]  # "follows" failed by itself


def test_death_by_signal_is_a_failure(tmp_path, make):
    argv = script(tmp_path, "crasher", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    sup, _ = make()
    with sup:
        sup.start(ProcessSpec("crasher", argv))
        sup.start(ProcessSpec("sleeper", script(tmp_path, "sleeper", SLEEPER)))
        outcome = sup.run(timeout=30)
    assert outcome.status == "failed"
    assert outcome.culprit_code == -signal.SIGSEGV
    assert outcome.reason == "crasher was killed by SIGSEGV"


def test_sigterm_is_escalated_to_sigkill(tmp_path, make):
    ready = tmp_path / "ready"
    stubborn = script(tmp_path, "stubborn", f"""\
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(ready)!r}, "w").close()
        time.sleep(60)
        """)
    sup, terminal = make(grace=0.5)
    with sup:
        sup.start(ProcessSpec("stubborn", stubborn))
        assert sup.wait_until(ready.exists, timeout=20) == "satisfied"
        began = time.monotonic()
        outcome = sup.stop("failed", "stopping for the test")
        took = time.monotonic() - began
    assert outcome.exit_codes == {"stubborn": -signal.SIGKILL}
    assert 0.5 <= took < 5
    assert "[launch] stubborn is still running; sending SIGKILL" in terminal.getvalue()


def test_a_process_that_honours_sigterm_is_not_killed(tmp_path, make):
    ready = tmp_path / "ready"
    polite = script(tmp_path, "polite", f"""\
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (print("bye", flush=True), sys.exit(0)))
        open({str(ready)!r}, "w").close()
        time.sleep(60)
        """)
    sup, terminal = make(grace=5.0)
    with sup:
        sup.start(ProcessSpec("polite", polite))
        sup.wait_until(ready.exists, timeout=20)
        outcome = sup.stop("failed", "test")
    assert outcome.exit_codes == {"polite": 0}
    assert sup.tail("polite") == ["bye"]
    assert "SIGKILL" not in terminal.getvalue().split("SIGTERM, then SIGKILL")[-1]


def test_timeout_stops_the_job_and_names_who_still_runs(tmp_path, make):
    sup, _ = make(grace=1.0)
    with sup:
        sup.start(ProcessSpec("quick", script(tmp_path, "quick", "pass\n")))
        sup.start(ProcessSpec("sleeper", script(tmp_path, "sleeper", SLEEPER)))
        began = time.monotonic()
        outcome = sup.run(timeout=1.0)
    assert 1.0 <= time.monotonic() - began < 10
    assert outcome.status == "timeout"
    assert outcome.still_running == ["sleeper"]
    assert "still running: sleeper" in outcome.reason
    assert outcome.exit_codes == {"quick": 0, "sleeper": -signal.SIGTERM}


def test_all_exiting_zero_completes(tmp_path, make):
    sup, _ = make()
    with sup:
        for n in range(3):
            sup.start(ProcessSpec(f"ok-{n}", script(tmp_path, "ok", "pass\n")))
        outcome = sup.run(timeout=20)
    assert outcome.status == "completed"
    assert outcome.exit_codes == {"ok-0": 0, "ok-1": 0, "ok-2": 0}
    assert outcome.stopped == []


def test_others_get_a_grace_after_the_leader_finishes(tmp_path, make):
    sup, terminal = make(grace=1.0)
    with sup:
        sup.start(ProcessSpec("leader", script(tmp_path, "leader", "pass\n")))
        sup.start(ProcessSpec("follower", script(tmp_path, "sleeper", SLEEPER)))
        outcome = sup.run(timeout=30, leader="leader", leader_grace=0.5)
    assert outcome.status == "completed"
    assert outcome.stragglers == ["follower"]
    assert outcome.exit_codes["follower"] == -signal.SIGTERM


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_the_job(tmp_path, make, signum):
    previous = signal.getsignal(signum)
    sup, terminal = make(grace=1.0)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signum))
    with sup:
        sup.start(ProcessSpec("sleeper", script(tmp_path, "sleeper", SLEEPER)))
        timer.start()
        outcome = sup.run(timeout=30)
    timer.join()
    assert outcome.status == "interrupted"
    assert outcome.signal == signum
    assert outcome.exit_codes == {"sleeper": -signal.SIGTERM}
    assert signal.getsignal(signum) == previous  # handlers restored


def test_wait_until(tmp_path, make):
    marker = tmp_path / "marker"
    writer = script(tmp_path, "writer", f"""\
        import time
        time.sleep(0.3)
        open({str(marker)!r}, "w").close()
        time.sleep(60)
        """)
    sup, _ = make()
    with sup:
        sup.start(ProcessSpec("writer", writer))
        assert sup.wait_until(lambda: False, timeout=0.2) == "timeout"
        assert sup.wait_until(marker.exists, timeout=20) == "satisfied"
        sup.stop("failed", "done with the test")
    sup, _ = make()
    with sup:
        sup.start(ProcessSpec("quick", script(tmp_path, "quick", "pass\n")))
        assert sup.wait_until(lambda: False, timeout=20) == "ended"  # nothing runs any more
        assert sup.outcome is None  # exiting 0 is not a failure


def test_a_program_that_cannot_start_fails_the_job(tmp_path, make):
    sup, terminal = make()
    with sup:
        assert not sup.start(ProcessSpec("ghost", [str(tmp_path / "no-such-program")]))
        assert not sup.start(ProcessSpec("later", script(tmp_path, "ok", "pass\n")))  # job already ended
        outcome = sup.run(timeout=5)
    assert outcome.status == "failed"
    assert outcome.culprit == "ghost"
    assert "could not start ghost" in outcome.reason
    assert outcome.exit_codes == {"ghost": None}


# -- no orphans -------------------------------------------------------------


def test_grandchildren_die_with_their_parent(tmp_path, make):
    pid_file = tmp_path / "grandchild.pid"
    parent = script(tmp_path, "parent", f"""\
        import subprocess
        child = subprocess.Popen(["sleep", "60"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        """)
    sup, _ = make()
    with sup:
        sup.start(ProcessSpec("parent", parent))
        outcome = sup.run(timeout=20)
    assert outcome.status == "completed"
    assert wait_for(lambda: is_dead(int(pid_file.read_text())), timeout=5)


def test_children_die_when_the_launcher_is_killed(tmp_path):
    """PR_SET_PDEATHSIG: SIGKILL to the launcher takes its children along."""
    pid_file = tmp_path / "child.pid"
    child = write_script(tmp_path / "child.py", f"""\
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
        """)
    driver = write_script(tmp_path / "driver.py", f"""\
        import sys
        sys.path.insert(0, {str(LAUNCHER_DIR)!r})
        from tessera_launch.supervisor import Console, ProcessSpec, Supervisor
        with Supervisor({str(tmp_path / "logs")!r}, Console(sys.stdout)) as sup:
            sup.start(ProcessSpec("child", [{str(child)!r}]))
            sup.run(timeout=50)
        """)
    launcher = subprocess.Popen([str(driver)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=20)
        child_pid = int(pid_file.read_text())
        assert not is_dead(child_pid)
        launcher.kill()
        launcher.wait(timeout=10)
        assert wait_for(lambda: is_dead(child_pid), timeout=5)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)


def test_describe_exit():
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(2) == "exited with status 2"
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(None) == "was not started"
