"""Tests of the local back-end, the summary and the command line.

Whole jobs run against fake_cluster.py, stand-ins that follow the process
contract (flags, address file, coordinator summary, worker line protocol),
so these check the launcher's side of that contract without the C++
binaries."""

import io
import json
import math
import re
import subprocess

import pytest
import yaml

from conftest import LAUNCHER_DIR
from tessera_launch.config import ConfigError, load_config
from tessera_launch.local import (Binaries, LocalOptions, RunLayout, SetupError, coordinator_argv,
                                  process_argv, process_env, run_local, server_argv, with_launcher_environment,
                                  worker_argv)
from tessera_launch.summary import build_summary, format_report, merge_worker_reports
from tessera_launch.supervisor import Outcome

LAUNCH = LAUNCHER_DIR / "tessera-launch"

JOB = """\
job:
  name: fake-job
cluster:
  servers: 2
  workers: 2
  vshards: 8
timeouts:
  assemble_seconds: 5
worker:
  program: fake-worker
  args:
    epochs: 1
    learning_rate: 0.5
    verbose: true
"""


@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    return path


def launch(job_file, build, run_dir, *extra_sets, **options):
    """Runs the job in-process; returns (exit code, summary, terminal text)."""
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file), build_dir=str(build), run_dir=str(run_dir),
                                  overrides=list(extra_sets), stream=terminal, **options))
    summary = json.loads((run_dir / "summary.json").read_text())
    return code, summary, terminal.getvalue()


# -- whole jobs against the stand-ins ----------------------------------------


def test_successful_job(tmp_path, job_file, fake_build):
    run_dir = tmp_path / "run"
    code, summary, terminal = launch(job_file, fake_build, run_dir)
    assert code == 0, terminal
    assert summary["status"] == "ok"
    assert summary["reason"] == "all workers done"
    assert (summary["workers"], summary["servers"]) == (2, 2)
    assert summary["steps"] == 12
    assert math.isclose(summary["final_loss"], 0.7 * 0.9 ** 6)
    assert math.isclose(summary["test_auc"], 0.755)
    assert (summary["bytes_pushed"], summary["bytes_pulled"]) == (2000, 4000)
    assert summary["processes"] == {"coordinator": 0, "server-0": 0, "server-1": 0, "worker-0": 0, "worker-1": 0}
    assert summary["run_dir"] == str(run_dir.resolve())
    assert summary["wall_seconds"] > 0
    report = summary["worker_reports"][1]
    assert report["rank"] == 1
    assert report["report"] == {"pushes": 6, "test_auc": 0.76, "examples": 100}  # coordinator + TESSERA_RESULT

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["cluster"]["servers"] == 2 and resolved["cluster"]["transport"] == "tcp"
    for name in ("launcher", "coordinator", "server-0", "server-1", "worker-0", "worker-1"):
        assert (run_dir / "logs" / f"{name}.log").is_file()
    worker_log = (run_dir / "logs" / "worker-0.log").read_text()
    assert "[worker-0] INFO worker-0 args --epochs 1 --learning_rate 0.5 --verbose true" in worker_log
    progress = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    assert len(progress) == 12 and {p["worker"] for p in progress} == {0, 1}
    assert "==== tessera job fake-job: OK ====" in terminal
    assert "[server-1] INFO server-1 shutting down" in terminal


def test_ipc_transport(tmp_path, job_file, fake_build):
    run_dir = tmp_path / "run"
    code, summary, terminal = launch(job_file, fake_build, run_dir, "cluster.transport=ipc")
    assert code == 0, terminal
    assert f"coordinator is at ipc://{run_dir.resolve()}/sock/coordinator.sock" in terminal


def test_skipped_server_is_detected_and_named(tmp_path, job_file, fake_build):
    run_dir = tmp_path / "run"
    code, summary, terminal = launch(job_file, fake_build, run_dir, "timeouts.assemble_seconds=1",
                                     skip=["server-1"], quiet=True)
    assert code == 1
    assert summary["status"] == "failed"
    # the coordinator's reason names the missing server (a slow machine may
    # add a worker that had not registered yet either)
    assert re.search(r"coordinator: server-1(, worker-\d)* did not register", summary["reason"])
    assert summary["skipped"] == ["server-1"]
    assert summary["processes"]["server-1"] is None
    assert "not starting server-1 (--skip)" in terminal
    assert "ERROR server-1" in terminal  # the coordinator's last lines


def test_failing_worker_fails_the_job(tmp_path, job_file, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_FAIL", "1")
    code, summary, terminal = launch(job_file, fake_build, tmp_path / "run", quiet=True)
    assert code == 1
    assert summary["first_failure"] == "worker-1"
    assert "worker-1 exited with status 5" in summary["reason"]
    assert summary["processes"]["worker-1"] == 5
    assert "worker-1" not in summary["stopped"]
    failed_line = next(line for line in terminal.splitlines() if line.startswith("failed  "))
    assert "worker-1 (exited with status 5)" in failed_line
    assert "  ERROR worker-1: fake failure" in terminal


def test_coordinator_dying_before_its_address_is_reported(tmp_path, job_file, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_COORDINATOR_CRASH", "1")
    code, summary, terminal = launch(job_file, fake_build, tmp_path / "run")
    assert code == 1
    assert summary["reason"] == "coordinator exited with status 3; the coordinator wrote no summary file"
    assert summary["processes"] == {"coordinator": 3, "server-0": None, "server-1": None,
                                    "worker-0": None, "worker-1": None}
    assert "last lines of coordinator:" in terminal
    assert "ERROR cannot bind" in terminal


def test_job_timeout(tmp_path, job_file, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER_STEPS", "100000")
    code, summary, terminal = launch(job_file, fake_build, tmp_path / "run", timeout=1.5, quiet=True)
    assert code == 124
    assert summary["end"] == "timeout"
    assert "still running: coordinator, server-0, server-1, worker-0, worker-1" in summary["reason"]


def test_default_run_dir(tmp_path, job_file, fake_build, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert run_local(LocalOptions(config=str(job_file), build_dir=str(fake_build),
                                      stream=io.StringIO(), quiet=True)) == 0
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(name.startswith("fake-job-") for name in runs)


# -- setup errors: nothing starts ------------------------------------------


def test_missing_binaries(tmp_path, job_file):
    with pytest.raises(SetupError, match="coordinator not found"):
        run_local(LocalOptions(config=str(job_file), build_dir=str(tmp_path / "empty"),
                               run_dir=str(tmp_path / "run"), stream=io.StringIO()))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("skip, message", [
    ("coordinator", "the coordinator cannot be skipped"),
    ("server-2", "the job has 2 servers"),
    ("worker", "expected server-INDEX or worker-INDEX"),
])
def test_bad_skip(tmp_path, job_file, fake_build, skip, message):
    with pytest.raises(SetupError, match=message):
        run_local(LocalOptions(config=str(job_file), build_dir=str(fake_build), skip=[skip],
                               run_dir=str(tmp_path / "run"), stream=io.StringIO()))


def test_run_dir_must_be_new_or_empty(tmp_path, job_file, fake_build):
    used = tmp_path / "used"
    used.mkdir()
    (used / "summary.json").write_text("{}")
    with pytest.raises(SetupError, match="exists and is not empty"):
        run_local(LocalOptions(config=str(job_file), build_dir=str(fake_build), run_dir=str(used),
                               stream=io.StringIO()))


def test_ipc_socket_path_length_is_checked(tmp_path, job_file, fake_build):
    deep = tmp_path / ("d" * 100)
    with pytest.raises(SetupError, match="ipc socket path too long"):
        run_local(LocalOptions(config=str(job_file), build_dir=str(fake_build), run_dir=str(deep),
                               overrides=["cluster.transport=ipc"], stream=io.StringIO()))
    assert not deep.exists()


def test_dry_run_prints_commands_and_starts_nothing(tmp_path, job_file, fake_build, monkeypatch):
    monkeypatch.chdir(tmp_path)
    terminal = io.StringIO()
    code = run_local(LocalOptions(config=str(job_file), build_dir=str(fake_build), dry_run=True,
                                  skip=["worker-1"], stream=terminal))
    assert code == 0
    text = terminal.getvalue()
    assert "coordinator: " in text and "--servers 2 --workers 2 --vshards 8" in text
    assert "worker-1: " in text and text.rstrip().endswith("# skipped")
    assert not (tmp_path / "runs").exists()


# -- command lines (the process contract) -----------------------------------


def test_command_lines_follow_the_contract(tmp_path, job_file):
    config = load_config(job_file, ["timeouts.heartbeat_seconds=0.5"])
    binaries = Binaries.locate(tmp_path / "build", config.worker.program)
    layout = RunLayout(tmp_path / "run")
    assert coordinator_argv(config, binaries, layout, debug=True) == [
        str(tmp_path / "build/coordinator/tessera-coordinator"),
        "--bind", "tcp://127.0.0.1:0", "--address-file", str(layout.address_file),
        "--servers", "2", "--workers", "2", "--vshards", "8",
        "--assemble-timeout", "5", "--heartbeat-interval", "0.5", "--lease", "5", "--on-worker-loss", "stop",
        "--rejoin-timeout", "60",
        "--replication", "2",
        "--server-lease", "0.5", "--silence-give-up", "60",
        "--on-shard-loss", "stop",
        "--rebalance-threshold", "0.0", "--rebalance-interval", "10", "--rebalance-request-cost", "1024.0",
        "--move-timeout", "60",
        "--summary-file", str(layout.coordinator_summary), "--state-file", str(layout.root / "coordinator.state"),
        "--name", "coordinator", "--debug"]
    assert server_argv(config, binaries, layout, 1, "tcp://h:1", debug=False) == [
        str(tmp_path / "build/server/tessera-server"), "--coordinator", "tcp://h:1", "--rank", "1",
        "--bind", "tcp://127.0.0.1:0", "--name", "server-1", "--connect-timeout", "10",
        "--coordinator-give-up", "60",
        "--max-keys-per-request", "67108864", "--max-table-mb", "auto", "--max-held-per-peer", "1024",
        "--max-message-mb", "256", "--disk-dir", str(layout.root / "disk")]
    set_limits = load_config(job_file, ["limits.max_mb_in_flight_per_peer=8",
                                        "limits.max_requests_in_flight_per_peer=100"])
    assert server_argv(set_limits, binaries, layout, 1, "tcp://h:1", debug=False)[-6:-2] == [
        "--max-mb-in-flight-per-peer", "8", "--max-requests-in-flight-per-peer", "100"]
    # The disk tier's directory: relative to the run directory, or absolute; the store when not the default.
    on_ssd = load_config(job_file, ["disk.dir=/mnt/ssd/tessera", "disk.store=rocks"])
    assert server_argv(on_ssd, binaries, layout, 1, "tcp://h:1", debug=False)[-4:] == [
        "--disk-dir", "/mnt/ssd/tessera", "--disk-store", "rocks"]
    assert worker_argv(config, binaries, layout, 0, "tcp://h:1") == [
        str(tmp_path / "build/examples/fake-worker"), "--coordinator", "tcp://h:1", "--rank", "0",
        "--name", "worker-0", "--epochs", "1", "--learning_rate", "0.5", "--verbose", "true"]


def test_audit_and_message_faults_are_job_settings(tmp_path, job_file, monkeypatch):
    """audit.dir and message_faults.spec reach the processes as flags
    (--audit-dir for servers, --faults for every process), which every
    back-end hands over; the launcher's
    own TESSERA_AUDIT_DIR and TESSERA_FAULTS fill them in where they are
    empty (so they reach remote processes too), and the config wins."""
    monkeypatch.delenv("TESSERA_AUDIT_DIR", raising=False)
    monkeypatch.delenv("TESSERA_FAULTS", raising=False)
    binaries = Binaries.locate(tmp_path / "build", "tessera-logreg")
    layout = RunLayout(tmp_path / "run")
    plain = load_config(job_file)
    assert "--audit-dir" not in server_argv(plain, binaries, layout, 0, "tcp://h:1", debug=False)
    assert "--faults" not in process_argv(plain, binaries, layout, "server-0", "tcp://h:1", debug=False)
    config = load_config(job_file, [f"audit.dir={tmp_path / 'audit'}", "message_faults.spec=seed=3,drop=0.01"])
    argv = server_argv(config, binaries, layout, 0, "tcp://h:1", debug=False)
    assert argv[argv.index("--audit-dir") + 1] == str(tmp_path / "audit")
    for name in ("coordinator", "server-0", "worker-1"):
        argv = process_argv(config, binaries, layout, name, "tcp://h:1", debug=False)
        assert argv[argv.index("--faults") + 1] == "seed=3,drop=0.01", argv
    assert "TESSERA_FAULTS" not in process_env(config, layout, binaries)
    environ = {"TESSERA_AUDIT_DIR": str(tmp_path / "from-env"), "TESSERA_FAULTS": "seed=9,dup=0.5"}
    filled = with_launcher_environment(plain, environ)
    assert (filled.audit.dir, filled.message_faults.spec) == (str(tmp_path / "from-env"), "seed=9,dup=0.5")
    assert "message_faults:\n  spec: seed=9,dup=0.5" in filled.to_yaml(), "ranks read it from config.yaml"
    kept = with_launcher_environment(config, environ)
    assert (kept.audit.dir, kept.message_faults.spec) == (str(tmp_path / "audit"), "seed=3,drop=0.01")


def test_the_coordinator_give_up_reaches_workers_only_when_set(tmp_path, job_file):
    """Servers always get --coordinator-give-up; workers get
    --coordinator_give_up_seconds only for a value other than the default,
    so that worker programs without the flag still run."""
    binaries = Binaries.locate(tmp_path / "build", "tessera-logreg")
    layout = RunLayout(tmp_path / "run")
    assert "--coordinator_give_up_seconds" not in worker_argv(load_config(job_file), binaries, layout, 0, "tcp://h:1")
    config = load_config(job_file, ["timeouts.coordinator_give_up_seconds=90"])
    argv = worker_argv(config, binaries, layout, 0, "tcp://h:1")
    assert argv[argv.index("--coordinator_give_up_seconds") + 1] == "90"
    argv = server_argv(config, binaries, layout, 0, "tcp://h:1", debug=False)
    assert argv[argv.index("--coordinator-give-up") + 1] == "90"


def test_a_larger_message_limit_reaches_servers_and_workers(tmp_path, job_file):
    """limits.max_message_mb is the servers' --max-message-mb and, when not
    the default, the workers' --transfer_max_message_mb (they split their
    requests to fit it); a worker program without the flag still runs with
    the default, which is the workers' own."""
    binaries = Binaries.locate(tmp_path / "build", "tessera-logreg")
    layout = RunLayout(tmp_path / "run")
    assert "--transfer_max_message_mb" not in worker_argv(load_config(job_file), binaries, layout, 0, "tcp://h:1")
    config = load_config(job_file, ["limits.max_message_mb=1024"])
    argv = worker_argv(config, binaries, layout, 0, "tcp://h:1")
    assert argv[argv.index("--transfer_max_message_mb") + 1] == "1024"
    argv = server_argv(config, binaries, layout, 0, "tcp://h:1", debug=False)
    assert argv[argv.index("--max-message-mb") + 1] == "1024"


def test_a_job_with_server_weights_in_its_file_runs(tmp_path, fake_build):
    path = tmp_path / "weighted.yaml"
    path.write_text(JOB.replace("  vshards: 8\n", "  vshards: 8\n  server_weights: [1, 3]\n"))
    run_dir = tmp_path / "run"
    code, summary, terminal = launch(path, fake_build, run_dir)
    assert code == 0, terminal
    assert "server_weights:\n  - 1\n  - 3\n" in (run_dir / "config.yaml").read_text()
    logs = "".join(p.read_text() for p in run_dir.rglob("coordinator*.log"))
    assert "server weights 1,3" in logs


def test_server_weights_reach_the_coordinator(tmp_path, job_file):
    binaries = Binaries.locate(tmp_path / "build", "fake-worker")
    layout = RunLayout(tmp_path / "run")
    config = load_config(job_file, ["cluster.server_weights=[1, 2.5]"])
    argv = coordinator_argv(config, binaries, layout, debug=False)
    assert argv[argv.index("--server-weights") + 1] == "1,2.5"
    assert argv.index("--server-weights") == argv.index("--replication") + 2
    # Every back-end builds its command lines through process_argv.
    assert "--server-weights" in process_argv(config, binaries, layout, "coordinator", "", debug=False)
    # Without weights (all servers equal) the flag is left out.
    assert "--server-weights" not in coordinator_argv(load_config(job_file), binaries, layout, debug=False)


def test_rebalancing_reaches_the_coordinator(tmp_path, job_file):
    binaries = Binaries.locate(tmp_path / "build", "fake-worker")
    layout = RunLayout(tmp_path / "run")
    config = load_config(job_file, ["rebalance.threshold=1.25", "rebalance.interval_seconds=2",
                                    "rebalance.move_timeout_seconds=30"])
    argv = coordinator_argv(config, binaries, layout, debug=False)
    assert argv[argv.index("--rebalance-threshold") + 1] == "1.25"
    assert argv[argv.index("--rebalance-interval") + 1] == "2"
    assert argv[argv.index("--move-timeout") + 1] == "30"
    # Off by default.
    argv = coordinator_argv(load_config(job_file), binaries, layout, debug=False)
    assert argv[argv.index("--rebalance-threshold") + 1] == "0.0"
    assert "--max-servers" not in argv
    argv = coordinator_argv(load_config(job_file, ["cluster.max_servers=4"]), binaries, layout, debug=False)
    assert argv[argv.index("--max-servers") + 1] == "4"
    assert "--max-workers" not in argv
    argv = coordinator_argv(load_config(job_file, ["cluster.max_workers=5"]), binaries, layout, debug=False)
    assert argv[argv.index("--max-workers") + 1] == "5"


def test_transfer_settings_reach_the_workers_only_when_set(tmp_path, job_file):
    binaries = Binaries.locate(tmp_path / "build", "fake-worker")
    layout = RunLayout(tmp_path / "run")
    argv = worker_argv(load_config(job_file), binaries, layout, 0, "tcp://h:1")
    assert not [a for a in argv if a.startswith("--transfer")]
    config = load_config(job_file, ["transfer.part_bytes=65536", "transfer.max_bytes_in_flight_per_server=262144"])
    argv = worker_argv(config, binaries, layout, 0, "tcp://h:1")
    assert argv[argv.index("--transfer_part_bytes") + 1] == "65536"
    assert argv[argv.index("--transfer_max_bytes_in_flight_per_server") + 1] == "262144"
    argv = worker_argv(load_config(job_file, ["transfer.part_bytes=4096"]), binaries, layout, 0, "tcp://h:1")
    assert argv[argv.index("--transfer_part_bytes") + 1] == "4096"
    assert "--transfer_max_bytes_in_flight_per_server" not in argv


def test_ipc_addresses_and_program_paths(tmp_path, job_file):
    config = load_config(job_file, ["cluster.transport=ipc", "worker.program=./bin/my-worker"])
    binaries = Binaries.locate(tmp_path / "build", config.worker.program)
    layout = RunLayout(tmp_path / "run")
    argv = worker_argv(config, binaries, layout, 1, "ipc:///x")
    assert argv[0].endswith("/bin/my-worker") and argv[0].startswith("/")
    assert argv[argv.index("--bind") + 1] == f"ipc://{tmp_path}/run/sock/worker-1.sock"
    assert f"ipc://{tmp_path}/run/sock/coordinator.sock" in coordinator_argv(config, binaries, layout, False)


# -- the summary ---------------------------------------------------------------


def _summary(outcome, coordinator, error=None, results=None):
    return build_summary(job_name="j", run_dir="/r", config_source="c.yaml", worker_count=2,
                         server_count=1, outcome=outcome, coordinator=coordinator,
                         coordinator_error=error, results_by_rank=results or {}, wall_seconds=1.0,
                         started_at="t0", finished_at="t1")


def test_worker_reports_merge_coordinator_first():
    merged = merge_worker_reports(
        [{"rank": 1, "steps": 10, "final_loss": 0.2, "report": {"test_auc": 0.9}}],
        {1: {"steps": 99, "test_auc": 0.1, "extra": 5}, 0: {"steps": 7, "final_loss": 0.4}})
    assert merged == [
        {"rank": 0, "source": "worker", "steps": 7, "final_loss": 0.4, "report": {}},
        {"rank": 1, "steps": 10, "final_loss": 0.2, "report": {"test_auc": 0.9, "extra": 5}},
    ]


def test_summary_without_coordinator_summary_fails():
    summary = _summary(Outcome("completed", "fine", exit_codes={"coordinator": 0}), None,
                       "the coordinator wrote no summary file", {0: {"steps": 5, "final_loss": 0.5}})
    assert summary["status"] == "failed"
    assert summary["reason"] == "the coordinator wrote no summary file"
    assert summary["steps"] == 5 and summary["final_loss"] == 0.5  # the workers' own numbers
    assert summary["test_auc"] is None


def test_summary_keeps_strict_json():
    coordinator = {"status": "ok", "reason": "", "workers": [
        {"rank": 0, "steps": 1, "final_loss": float("nan"), "report": {}},
        {"rank": 1, "steps": 1, "final_loss": 0.5, "report": {}}]}
    summary = _summary(Outcome("completed", "fine"), coordinator)
    assert summary["status"] == "ok" and summary["reason"] == "all workers finished"
    assert summary["final_loss"] == 0.5
    assert summary["worker_reports"][0]["final_loss"] is None
    json.dumps(summary, allow_nan=False)
    assert format_report(summary)[0] == "==== tessera job j: OK ===="


def test_coordinator_failure_reason_is_kept():
    outcome = Outcome("failed", "coordinator exited with status 1", culprit="coordinator",
                      exit_codes={"coordinator": 1})
    summary = _summary(outcome, {"status": "failed", "reason": "server 1 lost", "workers": []})
    assert summary["reason"] == "coordinator: server 1 lost; coordinator exited with status 1"


def test_a_stopped_coordinators_reason_comes_after_the_culprit():
    outcome = Outcome("failed", "worker-0 was killed by SIGSEGV", culprit="worker-0",
                      exit_codes={"coordinator": -15, "worker-0": -11}, stopped=["coordinator"])
    summary = _summary(outcome, {"status": "failed", "reason": "terminated", "workers": []})
    assert summary["reason"] == "worker-0 was killed by SIGSEGV; coordinator: terminated"


# -- the command line ----------------------------------------------------------


def run_cli(*args, cwd=None):
    return subprocess.run([str(LAUNCH), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_help_on_every_level():
    top = run_cli("--help")
    assert top.returncode == 0 and "local" in top.stdout and "exit status" in top.stdout
    local = run_cli("local", "--help")
    assert local.returncode == 0
    for flag in ("--config", "--run-dir", "--build-dir", "--set", "--skip", "--timeout", "--quiet"):
        assert flag in local.stdout


def test_cli_config_error_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  servers: two\nworker:\n  program: p\n")
    result = run_cli("local", "--config", str(bad), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f'tessera-launch: error: {bad}:2: cluster.servers must be a positive integer, got "two"')
    assert not (tmp_path / "run").exists()


def test_cli_runs_a_job(tmp_path, job_file, fake_build):
    result = run_cli("local", "--config", str(job_file), "--build-dir", str(fake_build),
                     "--run-dir", str(tmp_path / "run"), "--quiet", "--set", "cluster.workers=3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["workers"] == 3


def test_cli_rejects_bad_timeout():
    result = run_cli("local", "--config", "x.yaml", "--timeout", "-1")
    assert result.returncode == 2 and "must be positive" in result.stderr


def test_the_servers_heartbeat_reaches_them_only_when_set(tmp_path, job_file):
    """timeouts.server_heartbeat_seconds is the servers' --heartbeat-interval
    (0.1 s by default, the binary's own default, so not passed); it must be
    shorter than the server lease."""
    binaries = Binaries.locate(tmp_path / "build", "tessera-logreg")
    layout = RunLayout(tmp_path / "run")
    assert "--heartbeat-interval" not in server_argv(load_config(job_file), binaries, layout, 0, "tcp://h:1", False)
    config = load_config(job_file, ["timeouts.server_heartbeat_seconds=2", "timeouts.server_lease_seconds=10"])
    argv = server_argv(config, binaries, layout, 0, "tcp://h:1", debug=False)
    assert argv[argv.index("--heartbeat-interval") + 1] == "2"
    with pytest.raises(ConfigError, match=r"timeouts.server_lease_seconds \(0.5\) must be greater than "
                                          r"timeouts.server_heartbeat_seconds \(2\)"):
        load_config(job_file, ["timeouts.server_heartbeat_seconds=2"])
