"""Fixtures of the multi-host tests: hosts in network namespaces, each with
an sshd (netns_hosts.py), made for one test and removed after it. Needs
root, iproute2 and openssh-server (scripts/setup.sh); a test skips, naming
the reason, only where namespaces or sshd cannot run at all.

By hand:  /usr/bin/python3 -m pytest -q tests/multihost -k NAME
(TESSERA_BUILD_DIR points at the build tree; default build/)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/jobprocs.py

from multihost import build_dir  # noqa: E402
from netns_hosts import NamespaceHosts, missing  # noqa: E402


@pytest.fixture
def binaries() -> Path:
    build = build_dir()
    for rel in ("coordinator/tessera-coordinator", "server/tessera-server", "examples/tessera-logreg",
                "tests/audit/tessera-audit-workload"):
        assert (build / rel).is_file(), f"{build / rel} is missing: build the project first"
    return build


@pytest.fixture
def make_hosts(tmp_path):
    """make_hosts(count, shape_mbit=None) -> started NamespaceHosts, stopped after the test."""
    problem = missing()
    if problem:
        pytest.skip(f"no namespace hosts here: {problem}")
    made = []

    def factory(count: int, shape_mbit=None) -> NamespaceHosts:
        hosts = NamespaceHosts(count, tmp_path / f"hosts{len(made)}", shape_mbit=shape_mbit)
        made.append(hosts)
        hosts.start()
        return hosts

    yield factory
    for hosts in made:
        hosts.stop()
