"""Metrics during a running job: scrape a server, a worker and the
coordinator of a real job twice and check that the named series are there
and their counters grow. The job's frames of 4 KiB and more take the
same-host shared-memory path, which the transport series and the logs show."""

import json
import re
import subprocess
import sys
import time
import urllib.request

from conftest import free_port_base


def scrape(port: int, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def value(text: str, series: str) -> float:
    m = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    assert m, f"{series} missing from:\n{text}"
    return float(m.group(1))


def test_scrapes_show_growing_counters(source_dir, binaries, tmp_path):
    base = free_port_base(3)
    argv = [sys.executable, str(source_dir / "launcher" / "tessera-launch"), "local",
            "--config", str(source_dir / "configs" / "local.yaml"), "--run-dir", str(tmp_path / "run"),
            "--build-dir", str(binaries), "--quiet", "--timeout", "120",
            "--set", "cluster.servers=1", "--set", "cluster.workers=1", "--set", f"metrics.port={base}",
            "--set", "worker.args.epochs=1", "--set", "worker.args.train_examples=60000",
            "--set", "worker.args.step_ms=10",  # 300 steps of at least 10 ms: a few seconds to watch
            "--set", "shm.min_frame_bytes=4096",  # the batches' key frames (about 32 KB) take the rings
            "--set", "shm.min_lend_bytes=4096"]  # and their pull replies (about 16 KB) are lent
    job = subprocess.Popen(argv, cwd=source_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        # The first scrapes once training is under way (the worker makes its
        # data first, which takes a while in a sanitizer build).
        while True:
            server1, worker1 = scrape(base, deadline), scrape(base + 1, deadline)
            if value(server1, "tessera_server_push_requests_total") > 0 and value(
                    worker1, "tessera_worker_pushes_total") > 0:
                break
            assert time.monotonic() < deadline, "no push within 60 s"
            time.sleep(0.1)
        coordinator1 = scrape(base + 2, deadline)
        time.sleep(1.0)
        server2, worker2 = scrape(base, deadline), scrape(base + 1, deadline)
        coordinator2 = scrape(base + 2, deadline)
    finally:
        out, _ = job.communicate(timeout=150)
    assert job.returncode == 0, out[-3000:]
    for series in ("tessera_server_push_requests_total", "tessera_server_pull_requests_total",
                   "tessera_server_received_bytes_total"):
        assert value(server2, series) > value(server1, series), series
    for series in ("tessera_worker_pushes_total", 'tessera_worker_wire_bytes_total{kind="push"}'):
        assert value(worker2, series) > value(worker1, series), series
    assert "# TYPE tessera_worker_pull_staleness histogram" in worker2
    assert value(worker2, "tessera_worker_push_latency_seconds_count") > value(
        worker1, "tessera_worker_push_latency_seconds_count")
    assert value(server2, "tessera_server_rows") > 0
    # The coordinator: both nodes alive in a running job, and heartbeats keep coming.
    assert value(coordinator2, "tessera_coordinator_phase") == 1
    assert value(coordinator2, 'tessera_coordinator_nodes{role="server",state="alive"}') == 1
    assert value(coordinator2, 'tessera_coordinator_nodes{role="worker",state="alive"}') == 1
    assert value(coordinator2, "tessera_coordinator_heartbeats_total") > value(
        coordinator1, "tessera_coordinator_heartbeats_total")
    assert value(coordinator2, "tessera_coordinator_map_epoch") >= 1
    # The transport: messages both ways on every node; the worker's large
    # frames go to the server through shared memory, and the selection is
    # logged once per peer.
    for text in (server2, worker2, coordinator2):
        assert value(text, 'tessera_transport_messages_total{direction="received"}') > 0
    assert value(worker2, 'tessera_transport_shm_frames_total{direction="sent"}') > value(
        worker1, 'tessera_transport_shm_frames_total{direction="sent"}')
    assert value(server2, 'tessera_transport_shm_bytes_total{direction="received"}') > value(
        server1, 'tessera_transport_shm_bytes_total{direction="received"}')
    assert value(worker2, "tessera_transport_shm_peers") == 1
    assert value(server2, "tessera_transport_malformed_total") == 0
    # Pull replies are lent by the server and read in place by the worker.
    assert value(server2, 'tessera_transport_shm_lent_frames_total{direction="sent"}') > value(
        server1, 'tessera_transport_shm_lent_frames_total{direction="sent"}')
    assert value(worker2, 'tessera_transport_shm_lent_bytes_total{direction="received"}') > value(
        worker1, 'tessera_transport_shm_lent_bytes_total{direction="received"}')
    assert value(server2, "tessera_transport_shm_lends_reclaimed_total") == 0
    worker_log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert re.search(r"same-host peer tcp://\S+: frames of at least 4096 bytes go through shared memory",
                     worker_log), worker_log[-2000:]
    # ... and the values read that way are right: the model learns.
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["test_auc"] > 0.7, summary
    server_log = (tmp_path / "run" / "logs" / "server-0.log").read_text()
    assert re.search(r"same-host peer tcp://\S+ \(pid \d+\) reads our large frames in place", server_log), \
        server_log[-2000:]
