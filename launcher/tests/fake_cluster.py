"""Stand-ins for tessera-coordinator, tessera-server and a worker program.

They follow the launcher's process contract (docs/launcher.md): the same
flags, the address file, the coordinator's summary file, the worker line
protocol, exit statuses. Their "protocol" is one line of text per message over
a TCP or Unix socket, just enough for a coordinator to know who registered,
who finished and whom to shut down. They let the local back-end be tested
without the C++ binaries.

Usage: fake_cluster.py coordinator|server|worker [the binary's flags]

Behaviour switches (environment):
  FAKE_COORDINATOR_CRASH=1   the coordinator prints an error and exits 3
                             before writing its address
  FAKE_WORKER_FAIL=R         worker R exits 5 after its first progress line
  FAKE_WORKER_STEPS=N        steps per worker (default 6)
  FAKE_STEP_SECONDS=S        seconds per step (default 0.02)
  FAKE_SHOW_TRANSPORT_ENV=1  every process logs the transport flags it got

The transport flags (--transport, --rdma_required, ...; transport/transport_flags.h)
are taken as the real binaries take them, and honoured as the real transport
factory does on a machine without an RDMA device: with rdma or auto each
process logs one line that RDMA is unavailable and it falls back to ZeroMQ;
with --rdma_required 1 too it logs why and exits 1 instead. Any environment
variable named like an old transport setting (TESSERA_SHM, ...) makes a
process log a warning, as the real binaries do.

With --on-worker-loss wait, a worker whose connection closes before it is
done is declared lost (`lost worker R (...)`, in the C++ programs' log
format) and a process registering as the same worker takes its place
(`worker R rejoined from ...`); servers that went away are not sent the
shutdown.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time


def log(text):
    print(text, flush=True)


def stamped(name, level, text):
    """A line as the C++ programs log it: local time with milliseconds."""
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    log(f"{now} {name} {level} {text}")


def listen(bind):
    if bind.startswith("tcp://"):
        host, _, port = bind[len("tcp://"):].rpartition(":")
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, int(port)))
        server.listen(64)
        return server, f"tcp://{host}:{server.getsockname()[1]}"
    path = bind[len("ipc://"):]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    return server, bind


def connect(address, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if address.startswith("tcp://"):
                host, _, port = address[len("tcp://"):].rpartition(":")
                sock = socket.create_connection((host, int(port)), timeout=1)
                sock.settimeout(None)
                return sock
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(address[len("ipc://"):])
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


#: The transport flags and their defaults (the binaries': TransportChoice in
#: transport/transport_factory.h), with the variables they replaced.
TRANSPORT_FLAGS = (("--transport", "zmq", "TESSERA_TRANSPORT"), ("--rdma_required", "0", "TESSERA_RDMA_REQUIRED"),
                   ("--rdma_pool_bytes", "67108864", "TESSERA_RDMA_POOL_BYTES"),
                   ("--rdma_max_pinned_bytes", "1073741824", "TESSERA_RDMA_MAX_PINNED_BYTES"),
                   ("--shm", "1", "TESSERA_SHM"), ("--shm_min_frame_bytes", "65536", "TESSERA_SHM_MIN_FRAME_BYTES"),
                   ("--shm_ring_bytes", "67108864", "TESSERA_SHM_RING_BYTES"),
                   ("--shm_cross_memory", "1", "TESSERA_SHM_CROSS_MEMORY"),
                   ("--shm_min_lend_bytes", "2097152", "TESSERA_SHM_MIN_LEND_BYTES"),
                   ("--coalesce", "1", "TESSERA_COALESCE"),
                   ("--coalesce_max_message_bytes", "16384", "TESSERA_COALESCE_MAX_MESSAGE_BYTES"),
                   ("--coalesce_max_batch_bytes", "65536", "TESSERA_COALESCE_MAX_BATCH_BYTES"),
                   ("--coalesce_max_delay_us", "1000", "TESSERA_COALESCE_MAX_DELAY_US"),
                   ("--host_id", "", "TESSERA_HOST_ID"), ("--job_keys", "", "TESSERA_JOB_KEYS"),
                   ("--faults", "", "TESSERA_FAULTS"))


def add_transport_flags(parser):
    for flag, default, _ in TRANSPORT_FLAGS:
        parser.add_argument(flag, default=default)


def make_transport(name, a):
    """What the transport factory does with the flags (parsed into `a`),
    without an RDMA device."""
    for flag, _, variable in TRANSPORT_FLAGS:
        if variable in os.environ:
            stamped(name, "warning", f"{variable} is set but no longer read: the flag {flag} replaces it")
    if os.environ.get("FAKE_SHOW_TRANSPORT_ENV"):
        log(f"INFO {name} transport flags " + " ".join(
            f"{flag}={getattr(a, flag[2:])}" for flag, _, _ in TRANSPORT_FLAGS))
    if a.transport in ("rdma", "auto"):
        reason = "no RDMA device (fake: ibv_get_device_list: Function not implemented)"
        if a.rdma_required == "1":
            stamped(name, "error", f"RDMA is required (--rdma_required 1) but unusable: {reason}")
            sys.exit(1)
        stamped(name, "warning", f"RDMA unavailable ({reason}); falling back to ZeroMQ over tcp")


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def coordinator(argv):
    p = argparse.ArgumentParser()
    for flag in ("--bind", "--address-file", "--summary-file", "--name"):
        p.add_argument(flag, required=True)
    for flag in ("--servers", "--workers", "--vshards"):
        p.add_argument(flag, type=int, required=True)
    for flag in ("--assemble-timeout", "--heartbeat-interval", "--lease"):
        p.add_argument(flag, type=float, required=True)
    p.add_argument("--on-worker-loss", choices=("stop", "continue", "wait"), default="stop")
    p.add_argument("--rejoin-timeout", type=float, default=60)
    p.add_argument("--replication", type=int, default=2)
    p.add_argument("--server-weights", default="")
    p.add_argument("--server-lease", type=float, default=0.5)
    p.add_argument("--silence-give-up", type=float, default=60)
    p.add_argument("--on-shard-loss", default="stop")
    p.add_argument("--rebalance-threshold", type=float, default=0)
    p.add_argument("--rebalance-interval", type=float, default=10)
    p.add_argument("--rebalance-request-cost", type=float, default=1024)
    p.add_argument("--move-timeout", type=float, default=60)
    p.add_argument("--max-servers", type=int, default=0)
    p.add_argument("--state-file", default="")
    p.add_argument("--debug", action="store_true")
    add_transport_flags(p)
    a = p.parse_args(argv)
    make_transport(a.name, a)
    if os.environ.get("FAKE_COORDINATOR_CRASH"):
        log("ERROR cannot bind: address already in use (fake crash)")
        sys.exit(3)
    server, address = listen(a.bind)
    write_atomically(a.address_file, address + "\n")
    log(f"INFO coordinator listening on {address}")
    if a.server_weights:
        log(f"INFO server weights {a.server_weights}")

    def finish(status, reason, workers=(), code=0):
        summary = {"status": status, "reason": reason, "workers": list(workers),
                   "servers": [{"rank": r, "address": f"fake://server-{r}"} for r in range(a.servers)]}
        write_atomically(a.summary_file, json.dumps(summary))
        if status != "ok":
            log(f"ERROR {reason}")
        sys.exit(code)

    members = {}  # name -> (socket, reader)
    deadline = time.monotonic() + a.assemble_timeout
    expected = [f"server-{r}" for r in range(a.servers)] + [f"worker-{r}" for r in range(a.workers)]
    server.settimeout(0.1)
    while len(members) < len(expected):
        if time.monotonic() > deadline:
            missing = [n for n in expected if n not in members]
            finish("failed", f"{', '.join(missing)} did not register within {a.assemble_timeout:g} s", code=1)
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        reader = conn.makefile("r")
        name = reader.readline().split()[-1]
        members[name] = (conn, reader)
        log(f"INFO {name} registered")
    for name, (conn, _) in members.items():
        if name.startswith("worker"):
            conn.sendall(b"start\n")
    reports = []
    for r in range(a.workers):
        line = members[f"worker-{r}"][1].readline()
        while not line.startswith("done ") and a.on_worker_loss == "wait":
            stamped("coordinator", "warning", f"lost worker {r} (fake://worker-{r}): connection closed; its place "
                                              f"is kept for a replacement for up to {a.rejoin_timeout:g} s")
            server.settimeout(a.rejoin_timeout)
            try:
                conn, _ = server.accept()
            except socket.timeout:
                finish("failed", f"lost worker {r}, and no replacement joined", reports, code=1)
            conn.settimeout(None)
            reader = conn.makefile("r")
            name = reader.readline().split()[-1]
            members[name] = (conn, reader)
            stamped("coordinator", "warning", f"worker {r} rejoined from fake://{name} (incarnation 1)")
            conn.sendall(b"start\n")
            line = reader.readline()
        if not line.startswith("done "):
            finish("failed", f"worker-{r} was lost", reports, code=1)
        reports.append(json.loads(line[len("done "):]))
    for name, (conn, _) in members.items():
        if name.startswith("server"):
            try:
                conn.sendall(b"shutdown\n")
            except OSError:
                pass  # it is gone (killed)
    finish("ok", "all workers done", reports)


def server_main(argv):
    p = argparse.ArgumentParser()
    for flag in ("--coordinator", "--bind", "--name"):
        p.add_argument(flag, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--connect-timeout", type=float, required=True)
    p.add_argument("--coordinator-give-up", type=float, required=True)  # the real server's (ignored here)
    p.add_argument("--audit-dir", default="")
    for flag in ("--max-keys-per-request", "--max-held-per-peer", "--max-message-mb"):
        p.add_argument(flag, type=int, required=True)  # the real server's limits (ignored here)
    for flag in ("--max-mb-in-flight-per-peer", "--max-requests-in-flight-per-peer"):
        p.add_argument(flag, type=int)  # passed when set
    p.add_argument("--max-table-mb", required=True)  # "auto" or MiB
    p.add_argument("--disk-dir", required=True)  # the real server's disk tier (unused here)
    p.add_argument("--disk-store", choices=("bucket", "log", "rocks"))  # passed when not the default
    p.add_argument("--debug", action="store_true")
    add_transport_flags(p)
    a = p.parse_args(argv)
    make_transport(a.name, a)
    sock = connect(a.coordinator, a.connect_timeout)
    sock.sendall(f"register {a.name}\n".encode())
    log(f"INFO {a.name} registered with {a.coordinator}")
    line = sock.makefile("r").readline()
    if line.strip() != "shutdown":
        log(f"ERROR {a.name}: lost the coordinator")
        sys.exit(1)
    log(f"INFO {a.name} shutting down")


def worker_main(argv):
    p = argparse.ArgumentParser()
    for flag in ("--coordinator", "--name"):
        p.add_argument(flag, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--bind")
    add_transport_flags(p)
    a, extra = p.parse_known_args(argv)
    log(f"INFO {a.name} args {' '.join(extra)}")
    make_transport(a.name, a)
    sock = connect(a.coordinator, 10)
    sock.sendall(f"register {a.name}\n".encode())
    sock.makefile("r").readline()  # start
    steps = int(os.environ.get("FAKE_WORKER_STEPS", "6"))
    loss = 0.7
    for step in range(1, steps + 1):
        loss *= 0.9
        print("TESSERA_PROGRESS " + json.dumps({"epoch": 1, "step": step, "loss": loss}), flush=True)
        if os.environ.get("FAKE_WORKER_FAIL") == str(a.rank):
            log(f"ERROR {a.name}: fake failure")
            sys.exit(5)
        time.sleep(float(os.environ.get("FAKE_STEP_SECONDS", "0.02")))
    result = {"steps": steps, "final_loss": loss, "test_auc": 0.75 + 0.01 * a.rank, "examples": 100}
    print("TESSERA_RESULT " + json.dumps(result), flush=True)
    report = {"rank": a.rank, "steps": steps, "final_loss": loss, "bytes_pushed": 1000,
              "bytes_pulled": 2000, "report": {"pushes": steps}}
    sock.sendall(f"done {json.dumps(report)}\n".encode())


if __name__ == "__main__":
    role, rest = sys.argv[1], sys.argv[2:]
    {"coordinator": coordinator, "server": server_main, "worker": worker_main}[role](rest)
