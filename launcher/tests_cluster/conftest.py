"""Options of the back-end tests that run real jobs (tessera-coordinator,
tessera-server and tessera-logreg from a build tree) under real Open MPI,
Slurm and ssh on this machine. ctest passes --build-dir; by hand:

    /usr/bin/python3 -m pytest -q launcher/tests_cluster --build-dir build
"""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_addoption(parser):
    parser.addoption("--build-dir", default=str(REPO / "build"), help="CMake build tree holding the binaries")


@pytest.fixture
def build_dir(request) -> Path:
    build = Path(request.config.getoption("--build-dir")).resolve()
    for rel in ("coordinator/tessera-coordinator", "server/tessera-server", "examples/tessera-logreg"):
        assert (build / rel).is_file(), f"{build / rel} is missing: build the project first"
    return build
