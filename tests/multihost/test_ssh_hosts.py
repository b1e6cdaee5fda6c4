"""Jobs across network-namespace hosts through the ssh back-end: the same
training as on one host, and the shared-memory path only within a host."""

from __future__ import annotations

import json
import re
import subprocess

from multihost import LAUNCH, PYTHON, REPO, HostJob

LOGREG = REPO / "configs" / "local.yaml"
#: Small enough for two loaded cores; the same for both runs compared.
SMALL = ("worker.args.train_examples=100000", "worker.args.test_examples=10000", "worker.args.epochs=2",
         "timeouts.assemble_seconds=30")
#: How far the AUC over several hosts may be from the one on one host.
AUC_TOLERANCE = 0.01


def test_ssh_across_four_hosts_trains_to_the_auc_of_local(tmp_path, make_hosts, binaries):
    """Logistic regression: coordinator, 2 servers and 2 workers over 4
    hosts (ssh) ends within AUC_TOLERANCE of the same job on one host."""
    local_run = tmp_path / "local"
    local = subprocess.run([PYTHON, str(LAUNCH), "local", "--config", str(LOGREG), "--build-dir", str(binaries),
                            "--run-dir", str(local_run), "--quiet", "--timeout", "200",
                            *sum((["--set", o] for o in SMALL), [])],
                           capture_output=True, text=True, timeout=260, cwd=REPO)
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr
    local_auc = json.loads((local_run / "summary.json").read_text())["test_auc"]

    hosts = make_hosts(4)
    layout = [["coordinator"], ["server-0"], ["server-1", "worker-0"], ["worker-1"]]
    job = HostJob(hosts, tmp_path / "ssh", layout, config=LOGREG, overrides=SMALL, audit=False, timeout=200)
    out = job.finish()
    assert job.process.returncode == 0, job.describe()
    summary = job.summary()
    assert summary["status"] == "ok", summary.get("reason")
    assert set(summary["processes"]) == {"coordinator", "server-0", "server-1", "worker-0", "worker-1"}
    assert all(code == 0 for code in summary["processes"].values()), summary["processes"]
    # Every process ran on its own host: the address it bound is that host's.
    for name, address in (("server-0", hosts.addresses[1]), ("server-1", hosts.addresses[2])):
        assert re.search(rf"listening on tcp://{re.escape(address)}:\d+", job.log(name)), job.log(name)[-2000:]
    assert abs(summary["test_auc"] - local_auc) <= AUC_TOLERANCE, (
        f"AUC over 4 hosts {summary['test_auc']:.4f}, on one host {local_auc:.4f}\n{out[-2000:]}")


def test_shared_memory_only_between_processes_of_one_host(tmp_path, make_hosts, binaries):
    """Two hosts, each with a server and a worker. Namespaces share the
    kernel's boot id and /dev/shm, which once made every pair "same host":
    the ring must be chosen between processes of one namespace only, and
    everything between hosts must cross the network. Also: the job's
    message faults reach every process on both hosts."""
    hosts = make_hosts(2)
    layout = [["coordinator", "server-0", "worker-0"], ["server-1", "worker-1"]]
    job = HostJob(hosts, tmp_path, layout, config=LOGREG, audit=False, timeout=200,
                  overrides=SMALL + ("shm.min_frame_bytes=4096", "worker.args.epochs=1",
                                     "message_faults.spec=seed=5,delay_ms=0-1"))
    job.finish()
    assert job.process.returncode == 0, job.describe()
    # The job's settings reach every process on every host (sshd passes no
    # environment on): here the message faults, which each process names.
    for name in ("coordinator", "server-0", "server-1", "worker-0", "worker-1"):
        assert "fault injection on: seed=5," in job.log(name), f"{name}: {job.log(name)[-1500:]}"
    same_host = re.compile(r"same-host peer tcp://([0-9.]+):\d+")
    for name, host in (("worker-0", 0), ("worker-1", 1), ("server-0", 0), ("server-1", 1)):
        peers = set(same_host.findall(job.log(name)))
        assert peers == {hosts.addresses[host]}, (
            f"{name} on {hosts.addresses[host]} took these for its own host: {sorted(peers)}\n"
            f"{job.log(name)[-2000:]}")
