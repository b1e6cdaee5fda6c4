"""Tests of tessera_launch.fault_logs: what followed a fault, read from log
text in the C++ programs' format (`[NAME] YYYY-mm-dd HH:MM:SS.mmm NAME LEVEL
message`, local time)."""

import datetime

import pytest

from tessera_launch import fault_logs
from tessera_launch.fault_logs import analyze, analyze_all, lost_in_message, parse_line, parse_lines, read_logs

#: The moment of the fault in these samples (a whole millisecond, local time).
T0 = datetime.datetime(2026, 12, 3, 8, 42, 30, 586000).timestamp()


def stamp(offset: float) -> str:
    """The log timestamp `offset` seconds after T0 (milliseconds, truncated)."""
    return datetime.datetime.fromtimestamp(T0 + offset).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def line(process: str, offset: float, message: str, level: str = "info") -> str:
    return f"[{process}] {stamp(offset)} {process} {level} {message}"


SERVER_KILL = [
    line("coordinator", -2.5, "job assembled: 3 servers, 3 workers, 16 virtual shards; shard map epoch 1"),
    line("coordinator", 0.508, "lost server 1 (tcp://127.0.0.1:33321): no heartbeat for 0.508 s; its shards fail "
                               "over to their backups (map epoch 2)", "warning"),
    line("server-0", 0.509, "shard map epoch 2: lost server 1 (tcp://127.0.0.1:33321): no heartbeat for 0.508 s"),
    line("worker-0", 0.509, "shard map epoch 2: lost server 1 (tcp://127.0.0.1:33321): no heartbeat for 0.508 s"),
    line("worker-2", 0.510, "shard map epoch 2: lost server 1 (tcp://127.0.0.1:33321): no heartbeat for 0.508 s"),
    line("worker-2", 0.522, "first push acknowledged on shard map epoch 2, 12.3 ms after the map arrived"),
    line("worker-0", 0.531, "first push acknowledged on shard map epoch 2, 22.0 ms after the map arrived"),
    "[worker-0] TESSERA_RESULT {\"steps\": 400}",
]


def test_parse_line_reads_process_time_level_and_message():
    parsed = parse_line(line("coordinator", 0.508, "lost server 1 (x): y", "warning"))
    assert parsed.process == "coordinator"
    assert parsed.level == "warning"
    assert parsed.message == "lost server 1 (x): y"
    assert parsed.time == pytest.approx(T0 + 0.508, abs=1e-6)


@pytest.mark.parametrize("text", [
    "[worker-0] TESSERA_PROGRESS {\"step\": 3}",
    "[launch] started server-0 (pid 12)",
    "2026-12-03 08:42:31.094 coordinator warning no prefix",
    "[coordinator] 2026-13-03 08:42:31.094 coordinator warning no such month",
    "",
])
def test_lines_without_a_timestamp_are_not_log_lines(text):
    assert parse_line(text) is None


def test_lost_in_message_matches_role_and_rank_exactly():
    message = "lost server 1 (tcp://127.0.0.1:1): no heartbeat for 0.5 s; its shards fail over"
    assert lost_in_message(message, "server", 1)
    assert not lost_in_message(message, "server", 11)
    assert not lost_in_message(message, "worker", 1)
    assert lost_in_message("lost server 2 (a): x; worker 1 (b): y", "server", 2)
    assert not lost_in_message("server 1 (a) is back after 0.7 s of silence", "server", 1)


def test_server_kill_detection_and_failover():
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, parse_lines(SERVER_KILL))
    assert figures == {
        "detection_seconds": 0.508, "failover_seconds": 0.522, "failover_seconds_last_worker": 0.531,
        "failover_epoch": 2, "rereplication_seconds": 0.508, "recovered": True, "note": None}


def test_rereplication_ends_when_every_remade_copy_is_in_sync():
    lost = ("lost server 1 (a): no heartbeat for 0.5 s; its shards fail over to their backups (map epoch 2); "
            "11 lost copies re-made on other servers")
    lines = SERVER_KILL[:1] + [line("coordinator", 0.508, lost, "warning")] + SERVER_KILL[2:] + [
        line("coordinator", 0.40, "server 0 is in sync with server 2 on 3 shard copies (map epoch 1)"),  # before
        line("coordinator", 0.60, "server 0 is in sync with server 2 on 5 shard copies (map epoch 2)"),
        line("coordinator", 0.75, "server 2 is in sync with server 0 on 6 shard copies (map epoch 2)"),
        line("coordinator", 0.90, "server 2 is in sync with server 0 on 2 shard copies (map epoch 3)")]
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, parse_lines(lines))
    assert figures["rereplication_seconds"] == 0.75 and figures["note"] is None, figures
    short = [l for l in lines if "on 6 shard" not in l]
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, parse_lines(short))
    assert figures["rereplication_seconds"] is None, figures
    assert "only 7 of the 11 re-made copies were reported in sync" in figures["note"]


def test_an_earlier_loss_of_the_same_server_does_not_count():
    earlier = [line("coordinator", -0.2, "lost server 1 (a): no heartbeat for 0.5 s; its shards fail over to "
                                         "their backups (map epoch 2)", "warning")]
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, parse_lines(earlier))
    assert figures["detection_seconds"] is None and figures["recovered"] is False
    assert "no 'lost server 1' line" in figures["note"]


def test_acknowledgements_on_an_older_map_are_not_the_failover():
    lines = parse_lines(SERVER_KILL[:2] + [
        line("worker-0", 0.6, "first push acknowledged on shard map epoch 1, 1.0 ms after the map arrived"),
        line("worker-1", 0.7, "first push acknowledged on shard map epoch 3, 5.0 ms after the map arrived")])
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, lines)
    assert figures["failover_seconds"] == 0.7
    assert "map epoch 3 (a later failover came first)" in figures["note"]


def test_missing_failover_line_is_null_with_a_note():
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, parse_lines(SERVER_KILL[:4]))
    assert figures["detection_seconds"] == 0.508
    assert figures["failover_seconds"] is None and figures["failover_epoch"] == 2
    assert figures["recovered"] is False
    assert "no worker logged 'first push acknowledged on shard map epoch 2'" in figures["note"]


def test_a_server_loss_without_failover_is_not_recovered():
    lines = parse_lines([line("coordinator", 0.51, "job failed: lost server 1 (a): no heartbeat for 0.5 s; shards "
                                                   "3, 7 lose their last copy (replication 1)", "error")])
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, lines)
    assert figures["detection_seconds"] == 0.51
    assert figures["recovered"] is False and figures["failover_seconds"] is None
    assert "did not fail server-1 over" in figures["note"]


def test_server_restart_rejoins():
    rejoined = line("coordinator", 1.21, "server 1 rejoined from tcp://127.0.0.1:40001 (incarnation 1) 1.2 s after "
                                         "it was last heard; it holds 5 shard copies (map epoch 3)", "warning")
    figures = analyze({"target": "server-1", "action": "restart", "unix_time": T0},
                      parse_lines(SERVER_KILL + [rejoined]))
    assert (figures["detection_seconds"], figures["failover_seconds"], figures["rejoin_seconds"]) == (
        0.508, 0.522, 1.21)
    assert figures["recovered"] is True and figures["note"] is None


def test_server_restart_without_a_rejoin_has_not_recovered():
    figures = analyze({"target": "server-1", "action": "restart", "unix_time": T0}, parse_lines(SERVER_KILL))
    assert figures["rejoin_seconds"] is None and figures["failover_seconds"] == 0.522
    assert figures["recovered"] is False
    assert "no 'server 1 rejoined' line" in figures["note"]


def test_failover_line_with_recruited_copies():
    lines = parse_lines([line("coordinator", 0.5, "lost server 1 (a): no heartbeat for 0.5 s; its shards fail over "
                                                  "to their backups (map epoch 2); 4 lost copies re-made on other "
                                                  "servers", "warning"),
                         line("worker-0", 0.6, "first push acknowledged on shard map epoch 2, 3.0 ms after the map "
                                               "arrived")])
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, lines)
    assert (figures["failover_epoch"], figures["failover_seconds"], figures["recovered"]) == (2, 0.6, True)


def test_worker_restart_under_wait_rejoins():
    lines = parse_lines([
        line("coordinator", 5.004, "lost worker 1 (tcp://127.0.0.1:4000): no heartbeat for 5.0 s; its place is kept "
                                   "for a replacement for up to 60 s (on_worker_loss: wait)", "warning"),
        line("coordinator", 5.731, "worker 1 rejoined from tcp://127.0.0.1:4100 (incarnation 1) 0.727 s after it "
                                   "was lost", "warning"),
    ])
    figures = analyze({"target": "worker-1", "action": "restart", "unix_time": T0}, lines, on_worker_loss="wait")
    assert figures == {"detection_seconds": 5.004, "rejoin_seconds": 5.731, "recovered": True, "note": None}


def test_worker_restart_without_a_rejoin_line():
    lines = parse_lines([line("coordinator", 5.0, "lost worker 1 (a): no heartbeat for 5.0 s; its place is kept "
                                                  "for a replacement for up to 60 s (on_worker_loss: wait)")])
    figures = analyze({"target": "worker-1", "action": "restart", "unix_time": T0}, lines, on_worker_loss="wait")
    assert figures["rejoin_seconds"] is None and figures["recovered"] is False
    assert "no 'worker 1 rejoined' line" in figures["note"]


def test_worker_kill_under_continue_and_stop():
    go_on = parse_lines([line("coordinator", 5.0, "lost worker 0 (a): no heartbeat for 5.0 s; the job goes on "
                                                  "without it (on_worker_loss: continue)")])
    figures = analyze({"target": "worker-0", "action": "kill", "unix_time": T0}, go_on, on_worker_loss="continue")
    assert figures == {"detection_seconds": 5.0, "recovered": True, "note": None}
    fail = parse_lines([line("coordinator", 5.0, "job failed: lost worker 0 (a): no heartbeat for 5.0 s", "error")])
    figures = analyze({"target": "worker-0", "action": "kill", "unix_time": T0}, fail, on_worker_loss="stop")
    assert figures["detection_seconds"] == 5.0 and figures["recovered"] is False
    assert "on_worker_loss: stop" in figures["note"]


def test_short_pause_is_not_detected_and_recovers():
    later = parse_lines([line("coordinator", 9.0, "lost worker 1 (a): no heartbeat for 5.0 s; the job goes on "
                                                  "without it (on_worker_loss: continue)")])
    figures = analyze({"target": "worker-1", "action": "pause", "unix_time": T0, "duration_seconds": 0.3}, later)
    assert figures["detection_seconds"] is None and figures["recovered"] is True
    assert "paused 0.3 s" in figures["note"]


def test_long_server_pause_fails_over():
    figures = analyze({"target": "server-1", "action": "pause", "unix_time": T0, "duration_seconds": 2},
                      parse_lines(SERVER_KILL))
    assert figures["detection_seconds"] == 0.508 and figures["failover_seconds"] == 0.522
    assert figures["recovered"] is True


def test_long_worker_pause_under_wait_comes_back():
    lines = parse_lines([
        line("coordinator", 5.0, "lost worker 1 (a): no heartbeat for 5.0 s; its place is kept for a replacement "
                                 "for up to 60 s (on_worker_loss: wait)"),
        line("coordinator", 6.1, "worker 1 (a) is back after 1.1 s of silence")])
    figures = analyze({"target": "worker-1", "action": "pause", "unix_time": T0, "duration_seconds": 6},
                      lines, on_worker_loss="wait")
    assert figures["detection_seconds"] == 5.0 and figures["rejoin_seconds"] is None
    assert figures["recovered"] is True and "came back after the pause" in figures["note"]


def test_coordinator_faults():
    killed = analyze({"target": "coordinator", "action": "kill", "unix_time": T0}, [])
    assert killed["recovered"] is False and killed["detection_seconds"] is None
    paused = analyze({"target": "coordinator", "action": "pause", "unix_time": T0, "duration_seconds": 1}, [],
                     job_ok=True)
    assert paused["recovered"] is True


def test_a_standby_taking_the_coordinator_over_is_its_detection():
    lines = parse_lines([
        line("coordinator-1", 1.0, "standing by: job j is led by the coordinator at tcp://a:1"),
        line("coordinator-1", 2.4, "won the leadership of job j after 2.4 s standing by"),
        line("coordinator-1", 3.1, "lost server 1 (b): no heartbeat for 0.5 s; its shards fail over to their "
                                   "backups (map epoch 3)", "warning")])
    taken = analyze({"target": "coordinator", "action": "kill", "unix_time": T0 + 1.5}, lines, job_ok=True)
    assert taken["detection_seconds"] == 0.9 and taken["recovered"] is True
    assert "coordinator-1 took the leadership over" in taken["note"]
    # A takeover before the fault is not the fault's.
    late = analyze({"target": "coordinator", "action": "kill", "unix_time": T0 + 2.5}, lines, job_ok=True)
    assert late["recovered"] is False and late["detection_seconds"] is None
    # After a takeover the standby's lines are the coordinator's: it declares servers lost.
    server = analyze({"target": "server-1", "action": "kill", "unix_time": T0 + 2.6}, lines)
    assert server["detection_seconds"] == 0.5


def test_analyze_all_keeps_each_faults_lines_apart():
    lines = parse_lines(SERVER_KILL + [
        line("coordinator", 3.0, "lost server 2 (b): no heartbeat for 0.5 s; its shards fail over to their backups "
                                 "(map epoch 3)", "warning"),
        line("worker-1", 3.01, "first push acknowledged on shard map epoch 3, 4.0 ms after the map arrived")])
    records = [
        {"index": 0, "target": "server-1", "action": "kill", "unix_time": T0},
        {"index": 1, "target": "server-2", "action": "kill", "unix_time": T0 + 2.5},
        {"index": 2, "target": "worker-0", "action": "kill", "unix_time": None, "skipped": "the job ended first"},
    ]
    out = analyze_all(records, lines)
    assert (out[0]["detection_seconds"], out[0]["failover_seconds"]) == (0.508, 0.522)
    assert (out[1]["detection_seconds"], out[1]["failover_seconds"], out[1]["failover_epoch"]) == (0.5, 0.51, 3)
    assert out[2]["recovered"] is None and out[2]["note"] == "the job ended first"
    assert records[0].get("detection_seconds") is None  # the input is not changed


def test_a_second_fault_on_the_same_target_bounds_the_first():
    lines = parse_lines([line("coordinator", 1.5, "lost worker 1 (a): no heartbeat for 5.0 s; its place is kept "
                                                  "(on_worker_loss: wait)")])
    records = [{"index": 0, "target": "worker-1", "action": "kill", "unix_time": T0},
               {"index": 1, "target": "worker-1", "action": "kill", "unix_time": T0 + 1.0}]
    out = analyze_all(records, lines, on_worker_loss="wait")
    assert out[0]["detection_seconds"] is None
    assert out[1]["detection_seconds"] == 0.5  # from its own fault


def test_read_logs_skips_the_launchers_log(tmp_path):
    (tmp_path / "coordinator.log").write_text("\n".join(SERVER_KILL[:2]) + "\n")
    (tmp_path / "worker-2.log").write_text("\n".join(SERVER_KILL[4:6]) + "\n")
    (tmp_path / "launcher.log").write_text(line("coordinator", 0.1, "lost server 1 (x): copied") + "\n")
    lines = read_logs(tmp_path)
    assert [l.process for l in lines] == ["coordinator", "coordinator", "worker-2", "worker-2"]
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0}, lines)
    assert (figures["detection_seconds"], figures["failover_seconds"]) == (0.508, 0.522)


def test_timestamps_a_millisecond_early_still_count():
    # The fault at T0 + 0.0004 s; the coordinator's line, logged after it, reads T0 (milliseconds truncated).
    lines = parse_lines([line("coordinator", 0.0, "lost server 1 (a): x; its shards fail over to their backups "
                                                  "(map epoch 2)")])
    figures = analyze({"target": "server-1", "action": "kill", "unix_time": T0 + 0.0004}, lines)
    assert figures["detection_seconds"] == 0.0
    assert fault_logs.TIMESTAMP_SLACK_SECONDS == 0.001
