"""The `kubernetes` back-end: manifests for a job, applied with kubectl.

Objects (NAME is job.name made a DNS label):
  Secret      NAME-job-keys (security.curve): the job key file, made with
              tessera-keys (or security.keys_file), mounted read-only with
              mode 0400 at /etc/tessera-keys in every pod (--job_keys);
              the written manifest file is therefore mode 0600, and
              --dry-run shows a placeholder instead of the key
  ConfigMap   NAME-config: job.yaml, the resolved job config, mounted in
              every pod at /etc/tessera/job.yaml ($TESSERA_JOB_CONFIG)
  Deployment  NAME-coordinator (1 replica) and Service NAME-coordinator
              (port P): the address every other process is given
  StatefulSet NAME-server (servers replicas, pods started in parallel) with
              the headless Service NAME-server (port P+1); a pod's rank is
              its ordinal (label apps.kubernetes.io/pod-index)
  Job         NAME-worker, indexed: completions = parallelism = workers; a
              pod's rank is its completion index; no retries (a failed
              worker fails the Job)

Every container runs the same command line as under the other back-ends
(job.process_argv, its transport flags included: --transport, --shm*,
--coalesce*, --faults, ...), with these differences: processes bind their pod's IP
($(POD_IP)) on a fixed port (P, P+1, P+2 for coordinator, servers,
workers), the rank comes from $(TESSERA_RANK), --job_keys names the
mounted Secret, and the run directory is an
emptyDir at /var/run/tessera. The image must hold the build tree at
kubernetes.build_dir. Logs: `kubectl logs`; the coordinator's summary is in
its pod's /var/run/tessera.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from .job import Binaries, LocalOptions, RunLayout, SetupError, load_job, process_argv, start_run
from .policy import EXIT_FAILED, EXIT_OK, refuse_faults

CONFIG_MOUNT = "/etc/tessera"
RUN_DIR = "/var/run/tessera"
#: Where the job key Secret is mounted (security.curve).
KEYS_MOUNT = "/etc/tessera-keys"
#: What --dry-run shows instead of a key file.
REDACTED_KEYS = "(the job key file, made when the manifests are written)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", metavar="FILE",
                        help="where the manifests go (default: RUNDIR/kubernetes.yaml)")
    parser.add_argument("--apply", action="store_true", help="then run `kubectl apply -f FILE`")
    parser.add_argument("--dry-run", action="store_true", help="print the manifests; write nothing")


def object_name(job_name: str) -> str:
    """job.name as the prefix of a DNS label (lower case, '-' for the rest)."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-")[:40].strip("-")
    return name or "tessera-job"


def _set_flag(argv: list, flag: str, value: str) -> list:
    """argv with the value after `flag` replaced."""
    result = list(argv)
    result[result.index(flag) + 1] = value
    return result


def manifests(config, debug: bool = False, job_keys: str = REDACTED_KEYS) -> list:
    """The job's Kubernetes objects, as dicts, in apply order. With
    security.curve, `job_keys` (the key file's text) goes into a Secret that
    every pod mounts read-only, mode 0400, and names with --job_keys."""
    k8s = config.kubernetes
    if config.cluster.bind_scheme != "tcp":
        raise SetupError("the kubernetes back-end needs cluster.transport tcp (or zmq, rdma, auto): ipc works on "
                         "one host only")
    base, namespace, port = object_name(config.job.name), k8s.namespace, k8s.port
    binaries = Binaries.locate(Path(k8s.build_dir), config.worker.program)
    layout = RunLayout(Path(RUN_DIR))
    coordinator_address = f"tcp://{base}-coordinator.{namespace}.svc.cluster.local:{port}"

    def argv(name, bind_port):
        command = process_argv(config, binaries, layout, name, coordinator_address, debug, bind_workers=True)
        command = _set_flag(command, "--bind", f"tcp://$(POD_IP):{bind_port}")
        if config.security.curve:
            command = _set_flag(command, "--job_keys", f"{KEYS_MOUNT}/job.keys")
        if name != "coordinator":
            command = _set_flag(command, "--rank", "$(TESSERA_RANK)")
            command = _set_flag(command, "--name", name.partition("-")[0] + "-$(TESSERA_RANK)")
        return command

    def labels(role):
        return {"app.kubernetes.io/name": "tessera", "app.kubernetes.io/instance": base,
                "app.kubernetes.io/component": role}

    def pod(role, command, container_port, rank_field=None, restart="Always"):
        env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
               {"name": "TESSERA_JOB_CONFIG", "value": f"{CONFIG_MOUNT}/job.yaml"},
               {"name": "PYTHONUNBUFFERED", "value": "1"}]
        if rank_field:
            env.insert(1, {"name": "TESSERA_RANK", "valueFrom": {"fieldRef": {"fieldPath": rank_field}}})
        mounts = [{"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
                  {"name": "run", "mountPath": RUN_DIR}]
        volumes = [{"name": "config", "configMap": {"name": f"{base}-config"}},
                   {"name": "run", "emptyDir": {}}]
        if config.security.curve:
            mounts.append({"name": "job-keys", "mountPath": KEYS_MOUNT, "readOnly": True})
            volumes.append({"name": "job-keys", "secret": {"secretName": f"{base}-job-keys", "defaultMode": 0o400}})
        return {
            "metadata": {"labels": labels(role)},
            "spec": {
                "restartPolicy": restart,
                "containers": [{
                    "name": role, "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy,
                    "command": command[:1], "args": command[1:], "env": env,
                    "ports": [{"name": role, "containerPort": container_port, "protocol": "TCP"}],
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        }

    def meta(name, role):
        return {"name": name, "namespace": namespace, "labels": labels(role)}

    def service(name, role, service_port, headless):
        spec = {"selector": labels(role), "ports": [{"name": role, "port": service_port, "targetPort": service_port,
                                                     "protocol": "TCP"}]}
        if headless:
            spec["clusterIP"] = "None"
        return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, role), "spec": spec}

    secret = [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta(f"{base}-job-keys", "keys"),
               "stringData": {"job.keys": job_keys}}] if config.security.curve else []
    return secret + [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{base}-config", "config"),
         "data": {"job.yaml": config.to_yaml()}},
        service(f"{base}-coordinator", "coordinator", port, headless=False),
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(f"{base}-coordinator", "coordinator"),
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels("coordinator")},
                  "template": pod("coordinator", argv("coordinator", port), port)}},
        service(f"{base}-server", "server", port + 1, headless=True),
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(f"{base}-server", "server"),
         "spec": {"serviceName": f"{base}-server", "replicas": config.cluster.servers,
                  "podManagementPolicy": "Parallel", "selector": {"matchLabels": labels("server")},
                  "template": pod("server", argv("server-0", port + 1), port + 1,
                                  "metadata.labels['apps.kubernetes.io/pod-index']")}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta(f"{base}-worker", "worker"),
         "spec": {"completionMode": "Indexed", "completions": config.cluster.workers,
                  "parallelism": config.cluster.workers, **worker_failure_policy(config),
                  "template": pod("worker", argv("worker-0", port + 2), port + 2,
                                  "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                                  restart="OnFailure" if config.cluster.on_worker_loss == "wait" else "Never")}},
    ]


#: Container restarts a worker index gets under on_worker_loss: wait (each
#: one a replacement that takes the lost worker's place over).
WORKER_RESTARTS = 6


def worker_failure_policy(config) -> dict:
    """The worker Job's failure fields, so that a worker's death has the fate
    it has on every other back-end (cluster.on_worker_loss):
      stop      backoffLimit 0: one failed worker fails the Job (the
                coordinator fails the job too);
      continue  backoffLimitPerIndex 0 (Kubernetes 1.29+): a failed index
                stays failed and the other workers go on (without it, one
                failure would fail the Job and Kubernetes would stop every
                other worker pod); the Job then lists that index as failed,
                while the coordinator's summary has the job's status;
      wait      restartPolicy OnFailure with backoffLimit WORKER_RESTARTS:
                the container starts again in its pod, same index, and
                takes the lost worker's place over."""
    policy = config.cluster.on_worker_loss
    if policy == "continue":
        return {"backoffLimitPerIndex": 0, "maxFailedIndexes": max(0, config.cluster.workers - 1)}
    if policy == "wait":
        return {"backoffLimit": WORKER_RESTARTS}
    return {"backoffLimit": 0}


def _job_keys_text(job) -> str:
    """The key file the pods get (security.curve): security.keys_file, or a
    new pair made with this build's tessera-keys. "" without curve."""
    security = job.config.security
    if not security.curve:
        return ""
    if security.keys_file:
        path = Path(security.keys_file)
        if not path.is_file():
            raise SetupError(f"security.keys_file {path}: no such file (make one with tessera-keys FILE)")
        return path.read_text(encoding="utf-8")
    if not os.access(job.binaries.keys, os.X_OK):
        raise SetupError(f"tessera-keys not found: {job.binaries.keys}; build it (--build-dir), give "
                         "security.keys_file, or set security.curve: false")
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "job.keys"
        made = subprocess.run([str(job.binaries.keys), str(path)], capture_output=True, text=True)
        if made.returncode != 0:
            raise SetupError(f"cannot make the job key: {(made.stderr or made.stdout).strip()}")
        return path.read_text(encoding="utf-8")


def render(objects: list) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


def run(options: LocalOptions, args: argparse.Namespace) -> int:
    """`tessera-launch kubernetes`: write the manifests, and apply them."""
    job = load_job(options)
    refuse_faults("kubernetes", job.config)
    if args.dry_run:
        print(render(manifests(job.config, options.debug)), end="")
        return EXIT_OK
    text = render(manifests(job.config, options.debug, _job_keys_text(job)))
    if args.apply and shutil.which("kubectl") is None:
        raise SetupError("kubectl not found on PATH (needed by --apply)")
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
    else:
        start_run(job, options.run_dir)
        output = job.layout.root / "kubernetes.yaml"
    # The file may hold the job key (a Secret): readable by its owner only.
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(output, 0o600)
    print(f"[launch] wrote {output}", flush=True)
    if not args.apply:
        return EXIT_OK
    applied = subprocess.run(["kubectl", "apply", "-f", str(output)], stdin=subprocess.DEVNULL)
    if applied.returncode != 0:
        print(f"[launch] kubectl apply failed with status {applied.returncode}", flush=True)
        return EXIT_FAILED
    return EXIT_OK
