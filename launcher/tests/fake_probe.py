"""A stand-in for BUILD/rdma/tessera-doctor-probe, and for the programs the
doctor reaches hosts through (ssh, srun, mpirun).

Usage:
  fake_probe.py probe --pool-bytes N --listen HOST --listen-seconds S
  fake_probe.py ssh [ssh options] HOST COMMAND     runs COMMAND here as HOST
  fake_probe.py srun|mpirun [options] PYTHON ...   runs PYTHON ... once per node

The probe follows the real one's contract (launcher/tessera_launch/doctor.py):
one JSON report line on stdout, then it listens on HOST (a free port) for S
seconds and answers every connection with the line `tessera-doctor-probe`.

What it reports is set per host by a JSON file named by FAKE_PROBE_SPEC:
{"*": {...}, "node1": {...}}, the host's entry over "*". The host is
FAKE_PROBE_HOST (set by the fake ssh, srun and mpirun), else this machine's
name. Keys (default: a machine without RDMA or CUDA, memlock 8 MiB):
  mode            ok | garbage (a line that is not JSON) | fail (stderr, exit 4)
                  | silent (prints nothing) | partial (a report lacking memlock.soft)
  rdma_usable     true: one active InfiniBand device, registration ok
  registration_ok whether the test registration works (with rdma_usable;
                  default: when the pool fits under memlock_soft)
  memlock_soft, memlock_hard   bytes; null for unlimited (reported as -1)
  wrong_port      true: report a port nobody listens on
  listen_error    true: report that it could not listen (as the real probe does)
  cuda            a list of device names (CUDA available)
  gpudirect       true: GPUDirect available
FAKE_PROBE_RECORD names a file each probe appends its argv to (one JSON
list a line). The fake ssh refuses hosts listed in FAKE_SSH_DOWN
(comma-separated) like ssh does (status 255).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time


def settings(host):
    path = os.environ.get("FAKE_PROBE_SPEC")
    spec = json.load(open(path)) if path else {}
    return {**spec.get("*", {}), **spec.get(host, {})}


def flag(argv, name):
    if name not in argv:
        print(f"fake probe: missing {name}", file=sys.stderr)
        sys.exit(2)
    return argv[argv.index(name) + 1]


def probe(argv):
    pool = int(flag(argv, "--pool-bytes"))
    listen_host = flag(argv, "--listen")
    seconds = float(flag(argv, "--listen-seconds"))
    host = os.environ.get("FAKE_PROBE_HOST") or socket.gethostname()
    s = settings(host)
    if os.environ.get("FAKE_PROBE_RECORD"):
        with open(os.environ["FAKE_PROBE_RECORD"], "a") as f:
            f.write(json.dumps([host] + argv) + "\n")
    mode = s.get("mode", "ok")
    if mode == "fail":
        print("tessera-doctor-probe: cannot read /sys/class/infiniband: Permission denied", file=sys.stderr,
              flush=True)
        sys.exit(4)
    if mode == "silent":
        time.sleep(seconds)
        return
    if mode == "garbage":
        print("probe v0 starting up", flush=True)
        time.sleep(seconds)
        return
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((listen_host, 0))
    server.listen(16)
    port = server.getsockname()[1]
    if s.get("listen_error"):
        server.close()
    if s.get("wrong_port"):
        with socket.socket() as unused:
            unused.bind((listen_host, 0))
            port = unused.getsockname()[1]
    usable = bool(s.get("rdma_usable"))
    soft = s.get("memlock_soft", 8 << 20)
    hard = s.get("memlock_hard", 8 << 20)
    # Past the soft memlock limit a registration fails (unless the user may lock more, as root may).
    registration_ok = usable and s.get("registration_ok", soft is None or soft >= pool)
    infinite = -1  # how the probe writes RLIM_INFINITY
    report = {
        "host": host,
        "rdma": {
            "usable": usable,
            "reason": "" if usable else "no RDMA device (ibv_get_device_list: Function not implemented)",
            "devices": [{"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand",
                                                      "active_mtu": 4096}]}] if usable else [],
            "test_registration": {"ok": registration_ok, "bytes": pool,
                                  "error": "" if registration_ok else
                                  ("ibv_reg_mr: Cannot allocate memory" if usable else "no device")},
        },
        "gpudirect": {"available": bool(s.get("gpudirect")),
                      "reason": "nvidia_peermem is loaded and an RDMA device exists" if s.get("gpudirect") else
                      "no nvidia_peermem or nv_peer_mem kernel module"},
        "memlock": {"soft": infinite if soft is None else soft, "hard": infinite if hard is None else hard,
                    "unlimited": soft is None},
        "cuda": {"available": bool(s.get("cuda")),
                 "devices": [{"index": i, "name": n, "memory_bytes": 150754820096}
                             for i, n in enumerate(s.get("cuda", []))],
                 "error": "" if s.get("cuda") else "libcuda.so.1 not found"},
        "listen": {"host": listen_host, "port": port},
    }
    if mode == "partial":
        del report["memlock"]["soft"]
    if s.get("listen_error"):
        report["listen"] = {"host": listen_host, "port": 0,
                            "error": f"cannot listen on {listen_host}: Cannot assign requested address"}
    sys.stdout.write(json.dumps(report) + "\n")  # one write: the lines of several probes may share a pipe
    sys.stdout.flush()
    if s.get("listen_error"):
        return
    server.settimeout(0.1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        with conn:
            conn.sendall(b"tessera-doctor-probe\n")


def ssh(argv):
    with_value = {"-o", "-p", "-l", "-i", "-F"}
    i = 0
    while argv[i].startswith("-"):
        i += 2 if argv[i] in with_value else 1
    host, command = argv[i], " ".join(argv[i + 1:])
    if host in os.environ.get("FAKE_SSH_DOWN", "").split(","):
        print(f"ssh: connect to host {host} port 22: Connection refused", file=sys.stderr)
        sys.exit(255)
    os.execve("/bin/sh", ["/bin/sh", "-c", command], {**os.environ, "FAKE_PROBE_HOST": host})


def per_node(argv, count_flag):
    count = int(argv[argv.index(count_flag) + 1])
    start = argv.index(sys.executable)
    if os.environ.get("FAKE_CARRIER_RECORD"):
        with open(os.environ["FAKE_CARRIER_RECORD"], "w") as f:
            json.dump(argv, f)
    children = [subprocess.Popen(argv[start:], env={**os.environ, "FAKE_PROBE_HOST": f"node{i}"})
                for i in range(count)]

    def stop(signum, frame):
        for child in children:
            child.terminate()

    signal.signal(signal.SIGTERM, stop)
    codes = [child.wait() for child in children]
    sys.exit(max(codes))


if __name__ == "__main__":
    kind, rest = sys.argv[1], sys.argv[2:]
    if kind == "probe":
        probe(rest)
    elif kind == "ssh":
        ssh(rest)
    elif kind == "srun":
        per_node(rest, "--ntasks")
    elif kind == "mpirun":
        per_node(rest, "-np")
