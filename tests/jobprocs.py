"""Finding the processes of a job started by tessera-launch, for tests that
inject faults by signalling them (tests/consistency, tests/audit)."""
import time
from pathlib import Path


def find_process(binary: str, coordinator: str, name: str):
    """The pid of the process running `binary` (a path ending) with
    `coordinator` and `name` among its arguments, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(binary.encode()) and coordinator.encode() in argv and name.encode() in argv:
            return int(entry.name)
    return None


def wait_for_process(binary: str, coordinator: str, name: str, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = find_process(binary, coordinator, name)
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no {name} ({binary}) of the job at {coordinator} within {timeout} s")


def wait_for_address(run_dir: Path, job, timeout: float = 30.0) -> str:
    """The coordinator's address once the launcher has written it; fails if
    the launcher process `job` ends first."""
    path = Path(run_dir) / "coordinator.address"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert job.poll() is None, job.stdout.read() if job.stdout else "the launcher ended"
        time.sleep(0.05)
    raise AssertionError(f"no coordinator address in {path} after {timeout} s")


def command_line(pid: int) -> list:
    """The arguments process `pid` was started with."""
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
