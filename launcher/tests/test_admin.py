"""`tessera-launch drain`: what it reads from the run directory, the
tessera-admin command line it builds, and its errors. (The drain itself,
with real processes under load, is tests/audit/test_audit.py.)"""

import argparse

import pytest

from tessera_launch.admin import AdminError, command
from tessera_launch.cli import main


def args(run_dir, build_dir, **kwargs):
    values = dict(run_dir=str(run_dir), server=2, wait=False, timeout=600.0, keys=None, build_dir=str(build_dir))
    values.update(kwargs)
    return argparse.Namespace(**values)


@pytest.fixture
def build(tmp_path):
    binary = tmp_path / "build" / "coordinator" / "tessera-admin"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    return tmp_path / "build"


def test_the_address_and_the_key_come_from_the_run_directory(tmp_path, build):
    run = tmp_path / "run"
    run.mkdir()
    (run / "coordinator.address").write_text("tcp://127.0.0.1:5123\n")
    argv, env = command(args(run, build, wait=True, timeout=30.0), environ={})
    assert argv == [str(build / "coordinator" / "tessera-admin"), "drain", "--coordinator", "tcp://127.0.0.1:5123",
                    "--server", "2", "--wait", "--timeout", "30.0"]
    assert "--job_keys" not in argv and "TESSERA_JOB_KEYS" not in env
    (run / "job.keys").write_text("keys")
    argv, env = command(args(run, build), environ={})
    assert argv[-2:] == ["--job_keys", str((run / "job.keys").resolve())] and "TESSERA_JOB_KEYS" not in env
    other = tmp_path / "elsewhere.keys"
    other.write_text("keys")
    argv, _ = command(args(run, build, keys=str(other)), environ={})
    assert argv[-2:] == ["--job_keys", str(other.resolve())]


def test_errors_say_what_is_missing(tmp_path, build):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(AdminError, match="coordinator.address is missing or empty"):
        command(args(run, build), environ={})
    (run / "coordinator.address").write_text("tcp://127.0.0.1:5123")
    with pytest.raises(AdminError, match="--server must be a server rank"):
        command(args(run, build, server=-1), environ={})
    with pytest.raises(AdminError, match="no such file"):
        command(args(run, build, keys=str(tmp_path / "nope")), environ={})
    with pytest.raises(AdminError, match="tessera-admin not found"):
        command(args(run, tmp_path / "empty"), environ={})


def test_the_command_line_reports_a_run_directory_without_a_job(tmp_path, capsys):
    assert main(["drain", "--run-dir", str(tmp_path), "--server", "1"]) == 2
    assert "coordinator.address is missing or empty" in capsys.readouterr().err
