"""Fixtures: a real Tessera job on loopback (a tessera-coordinator and
tessera-server processes from the build tree); the test process itself is
the worker(s). Processes are killed at teardown, whatever happened."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TESSERA_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(BUILD / "python"))  # `import tessera` without PYTHONPATH too

import tessera  # noqa: E402


class LocalJob:
    """A coordinator expecting `servers` servers and `workers` workers, and
    the servers, all on 127.0.0.1 with ports chosen by the kernel (port 0).
    `address` is the coordinator's; `summary()` reads its summary once it
    has exited."""

    def __init__(self, directory: Path, servers: int, workers: int):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.processes = []
        self._logs = []
        coordinator = BUILD / "coordinator" / "tessera-coordinator"
        server = BUILD / "server" / "tessera-server"
        for binary in (coordinator, server):
            if not os.access(binary, os.X_OK):
                raise RuntimeError(f"{binary} is missing: build tessera-coordinator and tessera-server first")
        address_file = directory / "coordinator.address"
        address_file.unlink(missing_ok=True)  # a stale one from an earlier job in this directory
        self.summary_file = directory / "coordinator-summary.json"
        self.coordinator = self._start("coordinator", [
            str(coordinator), "--bind", "tcp://127.0.0.1:0", "--address-file", str(address_file),
            "--summary-file", str(self.summary_file), "--servers", str(servers), "--workers", str(workers),
            "--assemble-timeout", "60", "--name", "coordinator"])
        deadline = time.monotonic() + 20
        while not (address_file.exists() and address_file.read_text().strip()):
            if self.coordinator.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the coordinator did not start:\n" + self.logs())
            time.sleep(0.02)
        self.address = address_file.read_text().strip()
        for rank in range(servers):
            self._start(f"server-{rank}", [
                str(server), "--coordinator", self.address, "--rank", str(rank), "--bind", "tcp://127.0.0.1:0",
                "--name", f"server-{rank}", "--connect-timeout", "65", "--disk-dir", str(directory / "disk")])

    def _start(self, name, argv):
        log = open(self.directory / f"{name}.log", "w")
        self._logs.append(log)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.directory.glob("*.log")))

    def wait_coordinator(self, timeout=30.0) -> int:
        return self.coordinator.wait(timeout=timeout)

    def summary(self) -> dict:
        import json
        return json.loads(self.summary_file.read_text())

    def stop(self):
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 3
        for p in self.processes:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self._logs:
            log.close()


@pytest.fixture
def make_job(tmp_path):
    """make_job(servers, workers) -> LocalJob; every job is stopped at teardown."""
    jobs = []

    def make(servers=2, workers=1):
        job = LocalJob(tmp_path / f"job{len(jobs)}", servers, workers)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.stop()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One worker (rank 0) in a job of 2 servers and 1 worker, shared by the
    tests of a module (each test uses its own table ids)."""
    job = LocalJob(tmp_path_factory.mktemp("job"), servers=2, workers=1)
    try:
        w = tessera.Worker.connect(job.address, rank=0, connect_timeout=30, request_timeout=30)
    except BaseException:
        print(job.logs())
        job.stop()
        raise
    yield w
    w.close()
    job.stop()


_next_table = [100]


@pytest.fixture
def table_id():
    """A table id no other test of this process used."""
    _next_table[0] += 10
    return _next_table[0]


# Worker flags for a test that checks exactly which pushes a pull reflects:
# resend timers long enough that no request is sent again. A pull sent again
# (its answer late on a loaded machine) is read when the resend arrives, so it
# may reflect pushes issued after the first send: fresher than the bound the
# test checks, never staler (docs/embeddings.md, "Pipelined training").
NO_RESENDS = ("--resend_initial_ms", "30000", "--resend_floor_ms", "30000")


def connect(job, rank, flags=()):
    """A Worker of `job` for `rank`; `flags` as tessera-launch passes them
    (worker/worker_flags.h), e.g. NO_RESENDS."""
    if not flags:
        return tessera.Worker.connect(job.address, rank=rank, connect_timeout=30, request_timeout=60)
    w, rest = tessera.Worker.from_args(["--coordinator", job.address, "--rank", str(rank),
                                        "--connect_timeout_seconds", "30", "--request_timeout_seconds", "60",
                                        *flags])
    assert not rest, rest
    return w


def run_workers(job, count, body, timeout=120, flags=()):
    """Runs body(worker) for ranks 0..count-1 in threads, each with its own
    Worker of `job` (connected with `flags`), then finish() (the orderly job
    end); returns their results by rank, re-raising the first exception."""
    results = [None] * count
    errors = [None] * count

    def run(rank):
        try:
            w = connect(job, rank, flags)
            try:
                results[rank] = body(w)
                w.finish(steps=0, final_loss=0.0)
            finally:
                w.close()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError("a worker thread did not finish in time:\n" + job.logs())
    for e in errors:
        if e is not None:
            raise e
    return results
