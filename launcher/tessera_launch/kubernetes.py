"""The `kubernetes` back-end: manifests for a job, applied with kubectl.

Objects (NAME is job.name made a DNS label):
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
(local.process_argv), with these differences: processes bind their pod's IP
($(POD_IP)) on a fixed port (P, P+1, P+2 for coordinator, servers,
workers), the rank comes from $(TESSERA_RANK), and the run directory is an
emptyDir at /var/run/tessera. The image must hold the build tree at
kubernetes.build_dir. Logs: `kubectl logs`; the coordinator's summary is in
its pod's /var/run/tessera.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from .local import (EXIT_FAILED, EXIT_OK, Binaries, LocalOptions, RunLayout, SetupError, check_fault_support,
                    load_job, process_argv, start_run)

CONFIG_MOUNT = "/etc/tessera"
RUN_DIR = "/var/run/tessera"


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


def manifests(config, debug: bool = False) -> list:
    """The job's Kubernetes objects, as dicts, in apply order."""
    k8s = config.kubernetes
    if config.cluster.transport != "tcp":
        raise SetupError("the kubernetes back-end needs cluster.transport tcp")
    base, namespace, port = object_name(config.job.name), k8s.namespace, k8s.port
    binaries = Binaries.locate(Path(k8s.build_dir), config.worker.program)
    layout = RunLayout(Path(RUN_DIR))
    coordinator_address = f"tcp://{base}-coordinator.{namespace}.svc.cluster.local:{port}"

    def argv(name, bind_port):
        command = process_argv(config, binaries, layout, name, coordinator_address, debug, bind_workers=True)
        command = _set_flag(command, "--bind", f"tcp://$(POD_IP):{bind_port}")
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
        return {
            "metadata": {"labels": labels(role)},
            "spec": {
                "restartPolicy": restart,
                "containers": [{
                    "name": role, "image": k8s.image, "imagePullPolicy": k8s.image_pull_policy,
                    "command": command[:1], "args": command[1:], "env": env,
                    "ports": [{"name": role, "containerPort": container_port, "protocol": "TCP"}],
                    "volumeMounts": [{"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
                                     {"name": "run", "mountPath": RUN_DIR}],
                }],
                "volumes": [{"name": "config", "configMap": {"name": f"{base}-config"}},
                            {"name": "run", "emptyDir": {}}],
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

    return [
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
                  "parallelism": config.cluster.workers, "backoffLimit": 0,
                  "template": pod("worker", argv("worker-0", port + 2), port + 2,
                                  "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                                  restart="Never")}},
    ]


def render(objects: list) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)


def run(options: LocalOptions, args: argparse.Namespace) -> int:
    """`tessera-launch kubernetes`: write the manifests, and apply them."""
    job = load_job(options)
    check_fault_support("kubernetes", False, job.config)
    if job.config.security.curve:
        raise SetupError("security.curve is true, but the kubernetes back-end does not hand the job key to its "
                         "pods yet (a Secret is planned): set security.curve: false, which leaves the job's "
                         "ports open to whatever can reach the pods (restrict them with a NetworkPolicy)")
    text = render(manifests(job.config, options.debug))
    if args.dry_run:
        print(text, end="")
        return EXIT_OK
    if args.apply and shutil.which("kubectl") is None:
        raise SetupError("kubectl not found on PATH (needed by --apply)")
    if args.output:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
    else:
        start_run(job, options.run_dir)
        output = job.layout.root / "kubernetes.yaml"
    output.write_text(text, encoding="utf-8")
    print(f"[launch] wrote {output}", flush=True)
    if not args.apply:
        return EXIT_OK
    applied = subprocess.run(["kubectl", "apply", "-f", str(output)], stdin=subprocess.DEVNULL)
    if applied.returncode != 0:
        print(f"[launch] kubectl apply failed with status {applied.returncode}", flush=True)
        return EXIT_FAILED
    return EXIT_OK
