"""Kill the launcher with SIGKILL in the middle of a job: every process it
started must be gone within the lease (they notice their launcher, or their
coordinator, is gone). No process may be left to hold ports or GPUs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def descendants(pid: int) -> set:
    """Every live descendant of pid (via /proc/<pid>/task/*/children)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for c in map(int, children):
                if c not in found:
                    found.add(c)
                    todo.append(c)
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:120]
    except OSError:
        return "?"


def test_sigkill_of_the_launcher_leaves_no_process(source_dir, binaries, tmp_path):
    argv = [sys.executable, str(source_dir / "launcher" / "tessera-launch"), "local",
            "--config", str(source_dir / "configs" / "local.yaml"), "--run-dir", str(tmp_path / "run"),
            "--build-dir", str(binaries), "--quiet", "--set", "worker.args.step_ms=20",
            "--set", "timeouts.lease_seconds=3"]
    launcher = subprocess.Popen(argv, cwd=source_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        children = set()
        while time.monotonic() < deadline:  # the coordinator, 2 servers, 2 workers
            children = {p for p in descendants(launcher.pid) if any(
                t in name(p) for t in ("tessera-coordinator", "tessera-server", "tessera-logreg"))}
            if len(children) >= 5:
                break
            time.sleep(0.1)
        assert len(children) >= 5, f"the job did not start: {[name(p) for p in children]}"
        time.sleep(1.0)  # training
        all_started = descendants(launcher.pid)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 3 + 2  # the lease, and a margin
        left = all_started
        while time.monotonic() < deadline:
            left = {p for p in all_started if alive(p)}
            if not left:
                break
            time.sleep(0.1)
        assert not left, "left running: " + "; ".join(name(p) for p in left)
    finally:
        for p in descendants(launcher.pid) if launcher.poll() is None else ():
            os.kill(p, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
