"""Options and fixtures of the launcher end-to-end tests.

The tests run real jobs: launcher/tessera-launch starting tessera-coordinator,
tessera-server and tessera-logreg from a CMake build tree. ctest passes
--build-dir and --source-dir; run by hand:

    /usr/bin/python3 -m pytest -q tests/launcher_e2e --build-dir build
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE_DIR_DEFAULT = Path(__file__).resolve().parents[2]


def pytest_addoption(parser):
    parser.addoption("--build-dir", default=None,
                     help="CMake build tree holding the binaries (default: $TESSERA_BUILD_DIR, else <repo>/build)")
    parser.addoption("--source-dir", default=str(SOURCE_DIR_DEFAULT), help="the repository root")


@dataclass
class LaunchResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    run_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        """For assertion messages: the status and the end of the output."""
        tail = "\n".join(self.output.splitlines()[-40:])
        return f"exit status {self.returncode} after {self.seconds:.1f} s; last output:\n{tail}"


class Launcher:
    """Runs `tessera-launch local` with a fresh run directory per call."""

    def __init__(self, source_dir: Path, build_dir: Path, tmp_path: Path):
        self.source_dir = source_dir
        self.build_dir = build_dir
        self.tmp_path = tmp_path
        self.runs = 0

    def local(self, *args: str, timeout: float = 170) -> LaunchResult:
        import time

        self.runs += 1
        run_dir = self.tmp_path / f"run{self.runs}"
        argv = [sys.executable, str(self.source_dir / "launcher" / "tessera-launch"), "local",
                "--run-dir", str(run_dir), "--build-dir", str(self.build_dir), *args]
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=self.source_dir, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return LaunchResult(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start, run_dir)


@pytest.fixture
def source_dir(request) -> Path:
    return Path(request.config.getoption("--source-dir")).resolve()


@pytest.fixture
def build_dir(request, source_dir) -> Path:
    chosen = request.config.getoption("--build-dir") or os.environ.get("TESSERA_BUILD_DIR")
    return Path(chosen).resolve() if chosen else source_dir / "build"


@pytest.fixture
def binaries(build_dir) -> Path:
    """The build tree, after checking that the job's binaries are built."""
    needed = [build_dir / "coordinator" / "tessera-coordinator", build_dir / "server" / "tessera-server",
              build_dir / "examples" / "tessera-logreg"]
    missing = [str(p) for p in needed if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail("not built: " + ", ".join(missing) + " (cmake --build the build tree first)")
    return build_dir


@pytest.fixture
def launcher(source_dir, build_dir, tmp_path) -> Launcher:
    return Launcher(source_dir, build_dir, tmp_path)


def free_port_base(count: int) -> int:
    """A port with `count` free ports from it (checked by binding them)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for p in range(base, base + count):
                t = socket.socket()
                sockets.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in sockets:
                t.close()
    raise RuntimeError("no run of free ports")
