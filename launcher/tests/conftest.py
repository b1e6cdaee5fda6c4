"""Shared test setup: makes tessera_launch importable and offers helpers."""

import os
import signal
import stat
import sys
import textwrap
from pathlib import Path

import pytest

LAUNCHER_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(LAUNCHER_DIR))

FAKE_CLUSTER = Path(__file__).resolve().parent / "fake_cluster.py"


def write_script(path: Path, body: str) -> Path:
    """Writes an executable Python script (shebang: this interpreter).

    Atomically (a new file renamed over the path): a test that writes the
    same script again for a second process must not truncate it under the
    first one, which may still be starting and would then run an empty
    script and exit 0."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
    os.replace(tmp, path)
    return path


@pytest.fixture
def fake_build(tmp_path):
    """A build tree whose binaries are the fake_cluster.py stand-ins."""
    build = tmp_path / "build"
    for role, rel in (("coordinator", "coordinator/tessera-coordinator"),
                      ("server", "server/tessera-server"),
                      ("worker", "examples/fake-worker")):
        path = build / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_CLUSTER} {role} "$@"\n')
        path.chmod(0o755)
    # tessera-keys: a key file in the real one's format (the fakes do not use it).
    keys = build / "transport" / "tessera-keys"
    keys.parent.mkdir(parents=True, exist_ok=True)
    keys.write_text('#!/bin/sh\n(umask 077 && printf "public %040d\\nsecret %040d\\n" 0 0 > "$1")\n')
    keys.chmod(0o755)
    return build


@pytest.fixture(autouse=True)
def _no_fake_switches(monkeypatch):
    """Tests start from a clean environment for the fake cluster."""
    for name in list(os.environ):
        if name.startswith("FAKE_") or name == "TESSERA_BUILD_DIR":
            monkeypatch.delenv(name)


#: No test may take longer than this; a hung test fails instead of hanging.
TEST_TIME_LIMIT_SECONDS = 60


class TestTookTooLong(Exception):
    pass


@pytest.fixture(autouse=True)
def _time_limit():
    """Fails a test that runs past TEST_TIME_LIMIT_SECONDS (SIGALRM)."""
    def expire(signum, frame):
        raise TestTookTooLong(f"test ran longer than {TEST_TIME_LIMIT_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_TIME_LIMIT_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def is_dead(pid: int) -> bool:
    """True once the process is gone or a zombie (killed, not yet reaped by
    whoever inherited it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Polls predicate until it holds (True) or timeout passes (False)."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
