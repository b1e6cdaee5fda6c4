"""The rank-based back-ends across network-namespace hosts: a real
multi-node Slurm (one slurmd per host, slurm_hosts.py) and Open MPI's
mpirun over ssh to the hosts. Each runs the audit job across the hosts,
kills a server with the config's faults (the command reaches the rank
through RUNDIR/control/, which every host sees) and must end ok with
nothing acknowledged lost."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from jobprocs import check_audit_verdict, run_audit_check
from multihost import AUDIT_CONFIG, LAUNCH, PYTHON, REPO, build_dir
from slurm_hosts import SlurmHosts
from slurm_hosts import missing as slurm_missing

KILL = "faults=[{target: server-1, action: kill, at_step: 300}]"


def audit_overrides(tmp_path) -> list:
    records, audit = tmp_path / "records", tmp_path / "audit"
    records.mkdir()
    audit.mkdir()
    sets = [f"worker.program={build_dir() / 'tests' / 'audit' / 'tessera-audit-workload'}",
            f"worker.args.records={records}", f"audit.dir={audit}", "worker.args.clocks=1500",
            "cluster.host=auto", "timeouts.lease_seconds=3", KILL]
    return sum((["--set", s] for s in sets), [])


def check(tmp_path, proc, run_dir, hosts, min_hosts: int) -> None:
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok", summary["reason"]
    assert summary["processes"]["server-1"] == -9, summary["processes"]
    check_audit_verdict(*run_audit_check(tmp_path / "records", tmp_path / "audit", tmp_path / "audit.json"), 300)
    bound = set()
    for name in ("server-0", "server-1", "server-2", "worker-0", "worker-1", "worker-2"):
        log = (run_dir / "logs" / f"{name}.log").read_text()
        match = re.search(r"(?:listening on|joined from) tcp://([0-9.]+):\d+", log)
        assert match, f"{name}: {log[-1500:]}"
        assert match.group(1) in hosts.addresses, f"{name} bound {match.group(1)}, not a test host's address"
        bound.add(match.group(1))
    assert len(bound) >= min_hosts, f"the processes ran on {sorted(bound)} only"


def test_slurm_across_hosts_survives_a_server_kill(tmp_path, make_hosts, binaries):
    if slurm_missing():
        pytest.skip(slurm_missing())
    hosts = make_hosts(5)  # slurmctld on host 0, node1..node4 on hosts 1..4
    with SlurmHosts(hosts, tmp_path / "slurm") as slurm:
        run_dir = tmp_path / "run"
        proc = subprocess.run([PYTHON, str(LAUNCH), "slurm", "--config", str(AUDIT_CONFIG), "--build-dir",
                               str(binaries), "--run-dir", str(run_dir), "--quiet", "--timeout", "200",
                               "--set", "slurm.nodes=4", *audit_overrides(tmp_path)],
                              capture_output=True, text=True, timeout=300, env=slurm.env, cwd=REPO)
    check(tmp_path, proc, run_dir, hosts, min_hosts=4)


def test_mpirun_across_hosts_survives_a_server_kill(tmp_path, make_hosts, binaries):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is missing (scripts/setup.sh installs openmpi-bin)")
    hosts = make_hosts(4)
    hostfile = tmp_path / "mpi-hosts"
    hostfile.write_text("".join(f"{address} slots=2\n" for address in hosts.addresses))
    agent = "ssh " + " ".join(hosts.ssh_args)
    run_dir = tmp_path / "run"
    args = json.dumps(["--oversubscribe", "--map-by", "node", "--mca", "plm_rsh_agent", agent,
                       "--mca", "btl_tcp_if_include", str(hosts.subnet), "--mca", "oob_tcp_if_include",
                       str(hosts.subnet)])
    proc = subprocess.run([PYTHON, str(LAUNCH), "mpirun", "--config", str(AUDIT_CONFIG), "--build-dir",
                           str(binaries), "--run-dir", str(run_dir), "--quiet", "--timeout", "200",
                           "--set", f"mpirun.hostfile={hostfile}", "--set", f"mpirun.args={args}",
                           *audit_overrides(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    check(tmp_path, proc, run_dir, hosts, min_hosts=4)
