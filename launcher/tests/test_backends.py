"""Back-ends without a cluster: Kubernetes manifests, hostfiles and
placement, rank mapping, the carrier protocol of the supervisor, and every
config in configs/ (the real mpirun, slurm and ssh runs are in
launcher/tests_cluster)."""

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCHER_DIR, is_dead, write_script
from tessera_launch.cli import main
from tessera_launch.config import load_config
from tessera_launch.kubernetes import manifests
from tessera_launch.local import SetupError, process_names
from tessera_launch.role import rank_from_environment
from tessera_launch.ssh import Host, parse_hostfile, place
from tessera_launch.supervisor import CONTROL_STDIN, Console, Member, ProcessSpec, Supervisor

REPO = LAUNCHER_DIR.parent
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_in_configs_is_valid(path):
    config = load_config(path)
    assert config.job.name and config.worker.program


def test_every_config_is_listed_in_the_readme():
    readme = (REPO / "configs" / "README.md").read_text()
    for path in CONFIGS:
        assert f"`{path.name}`" in readme, f"configs/README.md does not list {path.name}"


# -- kubernetes ----------------------------------------------------------------


def test_kubernetes_manifests_hold_the_expected_objects(tmp_path, capsys):
    config = REPO / "configs" / "local.yaml"
    code = main(["kubernetes", "--config", str(config), "--run-dir", str(tmp_path / "run"),
                 "--set", "kubernetes.namespace=ml", "--set", "kubernetes.port=9000", "--set", "security.curve=false"])
    assert code == 0
    docs = list(yaml.safe_load_all((tmp_path / "run" / "kubernetes.yaml").read_text()))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {("ConfigMap", "logreg-local-config"), ("Service", "logreg-local-coordinator"),
                     ("Deployment", "logreg-local-coordinator"), ("Service", "logreg-local-server"),
                     ("StatefulSet", "logreg-local-server"), ("Job", "logreg-local-worker")}
    assert all(d["metadata"]["namespace"] == "ml" for d in docs)
    by_kind = {(d["kind"], d["metadata"]["name"].rsplit("-", 1)[1]): d for d in docs}

    job_yaml = by_kind[("ConfigMap", "config")]["data"]["job.yaml"]
    assert yaml.safe_load(job_yaml)["cluster"]["servers"] == 2

    coordinator_service = by_kind[("Service", "coordinator")]["spec"]
    assert coordinator_service["ports"][0]["port"] == 9000 and "clusterIP" not in coordinator_service
    server_service = by_kind[("Service", "server")]["spec"]
    assert server_service["clusterIP"] == "None" and server_service["ports"][0]["port"] == 9001

    def container(kind, role):
        return by_kind[(kind, role)]["spec"]["template"]["spec"]["containers"][0]

    coordinator = container("Deployment", "coordinator")
    assert coordinator["command"] == ["/opt/tessera/build/coordinator/tessera-coordinator"]
    args = coordinator["args"]
    assert args[args.index("--bind") + 1] == "tcp://$(POD_IP):9000"
    assert args[args.index("--servers") + 1] == "2" and args[args.index("--workers") + 1] == "2"
    assert coordinator["ports"][0]["containerPort"] == 9000

    statefulset = by_kind[("StatefulSet", "server")]["spec"]
    assert statefulset["replicas"] == 2 and statefulset["serviceName"] == "logreg-local-server"
    server = container("StatefulSet", "server")
    address = "tcp://logreg-local-coordinator.ml.svc.cluster.local:9000"
    assert server["args"][server["args"].index("--coordinator") + 1] == address
    assert server["args"][server["args"].index("--rank") + 1] == "$(TESSERA_RANK)"
    assert server["ports"][0]["containerPort"] == 9001
    env = {e["name"]: e for e in server["env"]}
    assert "pod-index" in env["TESSERA_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]

    job = by_kind[("Job", "worker")]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == ("Indexed", 2, 2)
    worker = container("Job", "worker")
    assert worker["command"] == ["/opt/tessera/build/examples/tessera-logreg"]
    assert worker["args"][worker["args"].index("--bind") + 1] == "tcp://$(POD_IP):9002"
    assert worker["args"][worker["args"].index("--epochs") + 1] == "3"
    assert {"name": "config", "mountPath": "/etc/tessera", "readOnly": True} in worker["volumeMounts"]


def test_kubernetes_gives_a_worker_the_fate_its_loss_policy_says(tmp_path):
    """stop: one failed worker fails the Job; continue: the others go on
    (per-index backoff); wait: the container starts again in its pod and
    takes the place over. Servers are restarted by their StatefulSet and
    rejoin for their rank. Message faults reach every pod."""
    from tessera_launch.config import load_config as load

    def worker_job(*overrides):
        config = load(REPO / "configs" / "local.yaml", ["security.curve=false", *overrides])
        docs = manifests(config)
        return next(d for d in docs if d["kind"] == "Job")["spec"], docs

    stop, _ = worker_job()
    assert stop["backoffLimit"] == 0 and stop["template"]["spec"]["restartPolicy"] == "Never"
    go_on, _ = worker_job("cluster.on_worker_loss=continue")
    assert go_on["backoffLimitPerIndex"] == 0 and go_on["maxFailedIndexes"] == 1 and "backoffLimit" not in go_on
    assert go_on["template"]["spec"]["restartPolicy"] == "Never"
    wait, docs = worker_job("cluster.on_worker_loss=wait", "message_faults.spec=seed=1,drop=0.01")
    assert wait["backoffLimit"] > 0 and wait["template"]["spec"]["restartPolicy"] == "OnFailure"
    servers = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert servers["restartPolicy"] == "Always"
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            args = d["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[args.index("--faults") + 1] == "seed=1,drop=0.01", d["kind"]


def test_kubernetes_apply_hands_the_file_to_kubectl(tmp_path, monkeypatch, fake_build):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "kubectl-args"
    write_script(bin_dir / "kubectl", f"""\
        import sys
        open({str(record)!r}, "w").write(" ".join(sys.argv[1:]))
        """)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    output = tmp_path / "out" / "k8s.yaml"
    assert main(["kubernetes", "--config", str(REPO / "configs" / "kubernetes.yaml"), "--output", str(output),
                 "--build-dir", str(fake_build), "--apply"]) == 0
    assert record.read_text() == f"apply -f {output}"


def test_kubernetes_rejects_ipc(tmp_path, capsys):
    assert main(["kubernetes", "--config", str(REPO / "configs" / "kubernetes.yaml"), "--dry-run",
                 "--set", "cluster.transport=ipc"]) == 2
    assert "needs cluster.transport tcp" in capsys.readouterr().err


def test_kubernetes_pods_get_the_job_key_from_a_secret(tmp_path, fake_build):
    output = tmp_path / "k8s.yaml"
    assert main(["kubernetes", "--config", str(REPO / "configs" / "kubernetes.yaml"), "--output", str(output),
                 "--build-dir", str(fake_build)]) == 0
    assert output.stat().st_mode & 0o777 == 0o600, "the file holds the job key"
    docs = list(yaml.safe_load_all(output.read_text()))
    secret = [d for d in docs if d["kind"] == "Secret"][0]
    assert secret["metadata"]["name"] == "logreg-k8s-job-keys"
    assert secret["stringData"]["job.keys"].startswith("public ")
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            spec = d["spec"]["template"]["spec"]
            container = spec["containers"][0]
            args = container["args"]
            assert args[args.index("--job_keys") + 1] == "/etc/tessera-keys/job.keys"
            assert "TESSERA_JOB_KEYS" not in {e["name"] for e in container["env"]}
            assert {"name": "job-keys", "mountPath": "/etc/tessera-keys", "readOnly": True} in container["volumeMounts"]
            assert {"name": "job-keys", "secret": {"secretName": "logreg-k8s-job-keys", "defaultMode": 0o400}} in spec[
                "volumes"]
    # Without authentication, asked for explicitly: no Secret, no key in any pod.
    open_output = tmp_path / "open.yaml"
    assert main(["kubernetes", "--config", str(REPO / "configs" / "kubernetes.yaml"), "--output", str(open_output),
                 "--set", "security.curve=false"]) == 0
    docs = list(yaml.safe_load_all(open_output.read_text()))
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert "TESSERA_JOB_KEYS" not in open_output.read_text() and "--job_keys" not in open_output.read_text()


# -- ssh hostfiles ---------------------------------------------------------------


def test_hostfile_roles_slots_and_placement():
    hosts = parse_hostfile("# comment\nnode1 roles=coordinator,server slots=2  # trailing\n\n"
                           "node2 roles=worker slots=4 user=alice port=2222 addr=10.0.0.2\n", "hosts")
    assert hosts[1] == Host("node2", ("worker",), 4, "alice", 2222, "10.0.0.2")
    config_names = ["coordinator", "server-0", "worker-0", "worker-1"]
    placement = place(hosts, config_names)
    assert [placement[n].name for n in config_names] == ["node1", "node1", "node2", "node2"]
    with pytest.raises(SetupError, match="no free slot for server-1: hosts that take role server: node1"):
        place(hosts, ["coordinator", "server-0", "server-1"])


def test_hostfile_errors_name_the_line():
    with pytest.raises(SetupError) as error:
        parse_hostfile("a slots=0\nb roles=boss\nc colour=red\n", "hosts")
    message = str(error.value)
    assert "hosts:1: slots must be a positive integer" in message
    assert "hosts:2: roles must be" in message
    assert "hosts:3: expected KEY=VALUE" in message


# -- rank mapping ----------------------------------------------------------------


def test_ranks_map_to_coordinator_servers_workers(tmp_path):
    config = load_config(REPO / "configs" / "local.yaml")
    assert process_names(config) == ["coordinator", "server-0", "server-1", "worker-0", "worker-1"]
    assert rank_from_environment("mpi", {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "5"}) == (3, 5)
    assert rank_from_environment("slurm", {"SLURM_PROCID": "0", "SLURM_NTASKS": "5"}) == (0, 5)
    with pytest.raises(ValueError, match="SLURM_PROCID"):
        rank_from_environment("slurm", {})


# -- the carrier protocol ----------------------------------------------------------


def test_a_carrier_routes_member_lines_and_exits(tmp_path):
    carrier = write_script(tmp_path / "carrier.py", """\
        import sys
        for line in ["[launch] started", "[coordinator] TESSERA_ADDRESS tcp://127.0.0.1:1",
                     "[worker-0] hello", '[worker-0] TESSERA_RESULT {"steps": 3}',
                     "[worker-0] TESSERA_EXIT 0", "[server-0] TESSERA_EXIT 4", "plain"]:
            print(line, flush=True)
        """)
    terminal = io.StringIO()
    with Supervisor(tmp_path / "logs", Console(terminal), handle_signals=False) as sup:
        sup.start(ProcessSpec("carrier", [sys.executable, str(carrier)],
                              members=[Member("coordinator"), Member("server-0"), Member("worker-0", rank=0)]))
        outcome = sup.run()
    assert outcome.status == "failed" and outcome.culprit == "server-0"
    assert outcome.exit_codes["worker-0"] == 0 and outcome.exit_codes["server-0"] == 4
    assert sup.notices["coordinator"]["TESSERA_ADDRESS"] == "tcp://127.0.0.1:1"
    assert sup.results_by_rank() == {0: {"steps": 3}}
    assert (tmp_path / "logs" / "worker-0.log").read_text().splitlines()[0] == "[worker-0] hello"
    assert "[carrier] plain" in (tmp_path / "logs" / "carrier.log").read_text()


def test_role_runs_a_command_and_reports_its_exit(tmp_path):
    """The child's fate travels in TESSERA_EXIT; the role itself exits 0
    once it has said so, so that mpirun or srun never mistake one rank's
    end for a reason to end the others."""
    child = write_script(tmp_path / "child.py", "print('hi', flush=True)\nraise SystemExit(3)\n")
    proc = subprocess.run([sys.executable, str(LAUNCHER_DIR / "tessera-launch"), "role", "--name", "server-1",
                           "--", str(child)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    pids = [line.split()[-1] for line in lines if line.startswith("[server-1] TESSERA_PID ")]
    assert len(pids) == 1 and pids[0].isdigit(), lines
    assert "[server-1] hi" in lines and lines[-1] == "[server-1] TESSERA_EXIT 3"


def run_carrier(tmp_path, lines, members, exit_code):
    """A carrier that prints `lines` and exits with `exit_code`; returns the Outcome."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    carrier = write_script(tmp_path / "carrier.py", f"""\
        import sys
        for line in {lines!r}:
            print(line, flush=True)
        sys.exit({exit_code})
        """)
    with Supervisor(tmp_path / "logs", Console(io.StringIO()), handle_signals=False) as sup:
        sup.start(ProcessSpec("ssh-server-1", [sys.executable, str(carrier)], members=members))
        return sup.run()


def test_a_member_that_may_fail_is_not_failed_by_its_carrier(tmp_path):
    """The ssh regression: server-1 (replicated, may fail) was killed on its
    host, its role reported that and ssh then exited 137. The carrier's
    status is not the job's; the coordinator judges server-1."""
    outcome = run_carrier(tmp_path, ["[server-1] TESSERA_PID 77", "[server-1] TESSERA_EXIT -9"],
                          [Member("server-1", may_fail=True)], 137)
    assert outcome.status == "completed", outcome.reason
    assert outcome.exit_codes["server-1"] == -9


def test_a_member_lost_with_its_carrier_is_judged_as_itself(tmp_path):
    """A carrier that dies with a started member unreported (the ssh
    connection broke): the member is lost with it; may_fail decides."""
    started = ["[server-1] TESSERA_PID 77"]
    outcome = run_carrier(tmp_path / "a", started, [Member("server-1", may_fail=True)], 255)
    assert outcome.status == "completed", outcome.reason
    assert outcome.exit_codes["server-1"] == 255
    outcome = run_carrier(tmp_path / "b", started, [Member("server-1", may_fail=False)], 255)
    assert outcome.status == "failed" and outcome.culprit == "server-1", outcome
    assert "lost with its carrier ssh-server-1" in outcome.reason


def test_a_carrier_that_fails_before_its_member_starts_fails_the_job(tmp_path):
    outcome = run_carrier(tmp_path, ["ssh: connect to host node2 port 22: Connection refused"],
                          [Member("server-1", may_fail=True)], 255)
    assert outcome.status == "failed" and outcome.culprit == "ssh-server-1", outcome


def test_role_takes_commands_on_stdin(tmp_path):
    """signal, hold and restart through the control channel (as ssh carries
    it): the child is killed, reported, started again, and stopped when the
    connection closes."""
    child = write_script(tmp_path / "child.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    role = subprocess.Popen([sys.executable, str(LAUNCHER_DIR / "tessera-launch"), "role", "--name", "server-1",
                             "--watch-stdin", "--", str(child)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        def line_with(text):
            while True:
                line = role.stdout.readline()
                assert line, "the role ended"
                if text in line:
                    return line.strip()

        first = int(line_with("TESSERA_PID").split()[-1])
        line_with("] up")
        role.stdin.write("TESSERA_CONTROL worker-0 signal SIGKILL\n")  # another member's: ignored
        role.stdin.write("TESSERA_CONTROL server-1 hold\nTESSERA_CONTROL server-1 signal SIGKILL\n")
        role.stdin.flush()
        assert line_with("TESSERA_EXIT") == "[server-1] TESSERA_EXIT -9"
        assert role.poll() is None, "the role must stay for the restart it was told of"
        role.stdin.write("TESSERA_CONTROL server-1 restart\n")
        role.stdin.flush()
        second = int(line_with("TESSERA_PID").split()[-1])
        assert second != first
        line_with("] up")
        role.stdin.close()  # the launcher is gone: the child is stopped, its exit reported
        assert line_with("TESSERA_EXIT") == "[server-1] TESSERA_EXIT -15"
        assert role.wait(timeout=20) == 0
        assert is_dead(second)
    finally:
        if role.poll() is None:
            role.kill()


def test_dry_runs_show_the_carrier_commands(tmp_path, capsys, fake_build):
    config = str(REPO / "configs" / "local.yaml")
    assert main(["mpirun", "--config", config, "--build-dir", str(fake_build), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "mpirun: mpirun -np 5 --oversubscribe" in out and "role --rank-from mpi" in out
    assert main(["slurm", "--config", config, "--build-dir", str(fake_build), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "srun: srun --ntasks 5 --kill-on-bad-exit=1" in out and "role --rank-from slurm" in out


def test_faults_reach_a_carried_member_through_its_carrier(tmp_path):
    """The supervisor's fault hooks (signal_process, prepare_restart,
    restart) on a member carried by a real `tessera-launch role`, as ssh
    carries it: killed, reported, started again on its host, then stopped
    with the job."""
    child = write_script(tmp_path / "child.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    argv = [sys.executable, str(LAUNCHER_DIR / "tessera-launch"), "role", "--name", "server-1", "--watch-stdin",
            "--", str(child)]
    terminal = io.StringIO()
    with Supervisor(tmp_path / "logs", Console(terminal), handle_signals=False) as sup:
        assert sup.start(ProcessSpec("ssh-server-1", argv, members=[Member("server-1", may_fail=True)],
                                     keep_stdin=True, control=CONTROL_STDIN))
        assert sup.wait_until(lambda: sup.is_running("server-1"), 20) == "satisfied"
        first = sup.pid_of("server-1")
        assert sup.describe_state("server-1") == f"is running (pid {first})"
        sup.prepare_restart("server-1")
        sup.expect_fault_exit("server-1", "fault 0: restart")
        assert sup.signal_process("server-1", signal.SIGKILL) == first
        assert sup.wait_until(lambda: not sup.is_running("server-1"), 20) == "satisfied"
        assert sup.describe_state("server-1") == "had already been killed by SIGKILL"
        assert sup.is_running("ssh-server-1"), "the carrier stays for the restart"
        assert sup.restart("server-1")
        assert sup.wait_until(lambda: sup.is_running("server-1"), 20) == "satisfied"
        assert sup.pid_of("server-1") not in (None, first)
        outcome = sup.stop("interrupted", "test over")
    assert outcome.exit_codes["server-1"] == -15, terminal.getvalue()
    assert "server-1 was killed by SIGKILL (fault 0: restart)" in terminal.getvalue()
    assert is_dead(first)


def test_role_by_rank_reads_commands_from_its_control_file(tmp_path, monkeypatch):
    """mpirun and srun ranks take the launcher's commands from
    RUNDIR/control/NAME.control (the run directory every node shares)."""
    from tessera_launch.role import _Control
    control = _Control(watch_stdin=False)
    control.name = "server-0"
    control.control_file = tmp_path / "server-0.control"
    assert control() is None and control.commands == []  # no file yet: nothing
    control.control_file.write_text("TESSERA_CONTROL server-0 signal SIGSTOP\nTESSERA_CONTROL server-1 hold\n"
                                    "TESSERA_CONTROL server-0 si")
    assert control() is None
    assert control.commands == [("signal", "SIGSTOP")]
    with open(control.control_file, "a") as f:
        f.write("gnal SIGCONT\n")
    control()
    assert control.commands == [("signal", "SIGSTOP"), ("signal", "SIGCONT")]


def test_ssh_carries_every_setting_on_the_command_line(tmp_path, fake_build):
    """sshd passes on no environment: the job's settings (message faults,
    the job key, the transport) and the host's name go as flags of the
    role program; standby coordinators are placed like the coordinator."""
    from tessera_launch.local import load_job, LocalOptions
    from tessera_launch.ssh import SshBackend
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 roles=coordinator,server slots=4 addr=10.0.0.1\n"
                        "node2 roles=worker slots=2 addr=10.0.0.2\n")
    job = load_job(LocalOptions(config=str(REPO / "configs" / "local.yaml"), build_dir=str(fake_build),
                                overrides=["message_faults.spec=seed=3,drop=0.01", "coordinator.standbys=1", "coordinator.etcd=http://127.0.0.1:2379",
                                           "coordinator.etcd=http://10.0.0.1:2379", "cluster.servers=2"]))
    backend = SshBackend(str(hostfile))
    backend._place(job)
    assert [(name, host.name) for name, host in backend.placement.items()] == [
        ("coordinator", "node1"), ("coordinator-1", "node1"), ("server-0", "node1"), ("server-1", "node1"),
        ("worker-0", "node2"), ("worker-1", "node2")]
    argv = backend.process_command(job, "server-0", "tcp://10.0.0.1:5000")
    remote = argv[-1]
    assert "--faults seed=3,drop=0.01" in remote, remote
    assert "--host_id node1" in remote, remote
    assert "--job_keys " in remote, remote
    assert "--env TESSERA_" not in remote, remote
    assert "--watch-stdin" in remote and "--probe tcp://10.0.0.1:5000" in remote, remote
    standby = backend.process_command(job, "coordinator-1", "tcp://10.0.0.1:5000")[-1]
    assert "--probe" not in standby and "--name coordinator-1" in standby, standby


def test_who_may_fail_follows_the_config():
    """The supervision policy every back-end shares: a process the
    coordinator judges or replaces may die; others fail the job."""
    from tessera_launch.policy import may_fail

    def config(*overrides):
        return load_config(REPO / "configs" / "local.yaml", ["security.curve=false", *overrides])

    plain = config("cluster.replication=1", "coordinator.standbys=0")
    assert not may_fail(plain, "coordinator") and not may_fail(plain, "server-0") and not may_fail(plain, "worker-0")
    ha = config("cluster.servers=2", "cluster.replication=2", "coordinator.standbys=1", "coordinator.etcd=http://127.0.0.1:2379",
                "cluster.on_worker_loss=wait")
    assert may_fail(ha, "coordinator") and may_fail(ha, "coordinator-1")
    assert may_fail(ha, "server-1") and may_fail(ha, "worker-0")
