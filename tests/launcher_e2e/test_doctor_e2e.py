"""`tessera-launch doctor` with the real probe (BUILD/rdma/tessera-doctor-probe)
on this machine, which has no RDMA device: the report says RDMA is
unavailable and that the job would use ZeroMQ over tcp; with rdma.required
it says the job would fail, and exits 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Where RDMA devices appear when the kernel has any.
SYSFS_RDMA = Path("/sys/class/infiniband")


@pytest.fixture
def probe(build_dir) -> Path:
    path = build_dir / "rdma" / "tessera-doctor-probe"
    if not os.access(path, os.X_OK):
        pytest.skip(f"the probe is not built: {path} (cmake --build {build_dir} --target tessera-doctor-probe)")
    if SYSFS_RDMA.is_dir() and any(SYSFS_RDMA.iterdir()):
        pytest.skip(f"this machine has an RDMA device ({', '.join(p.name for p in SYSFS_RDMA.iterdir())}); "
                    "these checks are for one without")
    return path


def doctor(source_dir, build_dir, *args):
    argv = [sys.executable, str(source_dir / "launcher" / "tessera-launch"), "doctor",
            "--config", str(source_dir / "configs" / "local.yaml"), "--build-dir", str(build_dir), *args]
    return subprocess.run(argv, cwd=source_dir, capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL)


def test_doctor_on_this_machine(source_dir, build_dir, probe):
    # configs/local.yaml as it is: tcp, nothing to check but the host and its port.
    result = doctor(source_dir, build_dir)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text
    assert "transport: tcp -> ZeroMQ over tcp" in text, text
    assert "RDMA          unusable: " in text, text
    assert "reachable     yes: 127.0.0.1:" in text, text
    assert text.rstrip().endswith("the job could run as configured"), text

    # auto: RDMA unavailable, so the job would fall back to ZeroMQ.
    result = doctor(source_dir, build_dir, "--set", "cluster.transport=auto", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["problems"] == [], report
    (host,) = report["hosts"]
    rdma = host["probe"]["rdma"]
    assert rdma["usable"] is False and rdma["reason"], rdma
    assert rdma["test_registration"]["ok"] is False
    assert rdma["test_registration"]["bytes"] == 64 << 20  # --pool-bytes: rdma.pool_bytes
    assert host["probe"]["listen"]["host"] == "127.0.0.1" and host["reachable"]["ok"], host["reachable"]
    memlock = host["probe"]["memlock"]
    assert memlock["unlimited"] or (isinstance(memlock["soft"], int) and isinstance(memlock["hard"], int)), memlock
    assert host["uses"] == f"ZeroMQ over tcp (RDMA unavailable: {rdma['reason']})"
    assert report["would_use"][0] == f"transport: auto -> ZeroMQ over tcp (RDMA unavailable: {rdma['reason']})"
    assert report["would_use"][1].startswith("same-host pairs: shared memory (shm.enabled)")
    assert isinstance(host["probe"]["cuda"]["available"], bool)
    assert isinstance(host["probe"]["gpudirect"]["available"], bool)

    # rdma + required: the job could not run, and the doctor says why.
    result = doctor(source_dir, build_dir, "--set", "cluster.transport=rdma", "--set", "rdma.required=true")
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "transport: rdma + rdma.required -> the job would fail: RDMA is required but unusable on " in text, text
    assert f"({rdma['reason']})" in text, text
    assert text.rstrip().endswith("the job could NOT run as configured"), text
