"""The launcher's timing defaults are the binaries' defaults.

The C++ defaults live in one place (node/timing_defaults.h), used by
tessera-coordinator's and tessera-server's flags and by the simulator's
scale runs; the launcher passes its own `timeouts.*` values as flags. If
the two drifted apart, a job started by hand and one started by the
launcher would time out differently, and simulated scale figures would
not be the launcher's. This test reads each binary's --help."""
import re
import subprocess
import sys
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
sys.path.insert(0, str(LAUNCHER))

from tessera_launch.config import DiskSection, LimitsSection, TimeoutsSection  # noqa: E402


def help_defaults(binary: Path) -> dict:
    """{flag: default} from a CLI11 --help ("--lease FLOAT:POSITIVE=5",
    "--a_b,--a-b INT:INT in [1 - 9]=2", "--shm 1|0=1": under its first name)."""
    text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    pattern = r"^\s+(--[\w-]+)(?:,--[\w-]+)* [A-Z0-9][^=\n]*?=(\S+)"
    return {m.group(1): m.group(2) for m in re.finditer(pattern, text, re.M)}


def test_the_launchers_timeouts_are_the_coordinators_and_servers_defaults(binaries):
    t = TimeoutsSection()
    coordinator = help_defaults(binaries / "coordinator" / "tessera-coordinator")
    server = help_defaults(binaries / "server" / "tessera-server")
    pairs = [
        ("coordinator --heartbeat-interval", coordinator.get("--heartbeat-interval"), t.heartbeat_seconds),
        ("coordinator --lease", coordinator.get("--lease"), t.lease_seconds),
        ("coordinator --server-lease", coordinator.get("--server-lease"), t.server_lease_seconds),
        ("server --lease", server.get("--lease"), t.lease_seconds),
        ("server --heartbeat-interval", server.get("--heartbeat-interval"), t.server_heartbeat_seconds),
    ]
    wrong = [f"{flag}: binary {value}, launcher {want}" for flag, value, want in pairs
             if value is None or float(value) != float(want)]
    assert not wrong, wrong
    # Servers heartbeat well inside the server lease.
    assert t.server_heartbeat_seconds <= t.server_lease_seconds / 4


def test_the_launchers_message_limit_is_the_servers_and_the_workers_default(binaries):
    """limits.max_message_mb, tessera-server --max-message-mb and a worker
    program's --transfer_max_message_mb (worker/worker_flags.h) start equal
    (common/message.h kDefaultMaxMessageBytes): workers split their requests
    to fit what servers accept, and the launcher passes the workers the
    limit only when it is not that default."""
    server = help_defaults(binaries / "server" / "tessera-server")
    worker = help_defaults(binaries / "examples" / "tessera-logreg")
    assert int(server["--max-message-mb"]) == LimitsSection.max_message_mb, server
    assert int(worker["--transfer_max_message_mb"]) == LimitsSection.max_message_mb, worker


def test_the_launchers_row_piece_bytes_is_the_workers_default(binaries):
    """transfer.row_piece_bytes is passed to workers only when it is not
    their default (worker/worker_flags.h --transfer_row_piece_bytes, from
    common/message.h kDefaultRowPieceBytes): the two must agree, or a
    config that says the default would run something else."""
    from tessera_launch.config import DEFAULT_ROW_PIECE_BYTES, TransferSection
    worker = help_defaults(binaries / "examples" / "tessera-logreg")
    assert int(worker["--transfer_row_piece_bytes"]) == DEFAULT_ROW_PIECE_BYTES == TransferSection().row_piece_bytes, worker


def test_the_launchers_disk_store_is_the_servers_default(binaries):
    """disk.store is passed to servers only when it is not their default
    (tessera-server --disk-store)."""
    server = help_defaults(binaries / "server" / "tessera-server")
    assert server.get("--disk-dir") is None or server["--disk-dir"] == "", server  # no default directory
    assert server["--disk-store"] == DiskSection.store, server


def test_every_limit_the_launcher_passes_is_the_servers_default(binaries):
    """Each limits.* setting reaches tessera-server as --max-* (job.py
    server_argv); their defaults must agree, so a server started by hand
    is as safe as one the launcher starts."""
    server = help_defaults(binaries / "server" / "tessera-server")
    limits = LimitsSection()
    wrong = []
    for name in ("max_keys_per_request", "max_table_mb", "max_held_per_peer", "max_message_mb",
                 "max_mb_in_flight_per_peer", "max_requests_in_flight_per_peer"):
        flag = "--" + name.replace("_", "-")
        if str(server.get(flag)) != str(getattr(limits, name)):
            wrong.append(f"{flag}: server {server.get(flag)}, launcher limits.{name} {getattr(limits, name)}")
    assert not wrong, wrong


def test_every_transport_default_of_the_launcher_is_every_binarys(binaries, tmp_path):
    """The launcher passes a transport flag (local.transport_flags) only
    where the job's value is not its own default (config.py's rdma, shm and
    coalesce sections, cluster.transport's zmq); the binaries' defaults are
    TransportChoice's (transport/transport_factory.h), shown by the --help
    of every binary that makes a transport (transport/transport_flags.h).
    They must agree, or a config that says the default would run something
    else. Checked both ways: every default, and that a job at the defaults
    passes no transport flag at all."""
    from tessera_launch.config import CoalesceSection, RdmaSection, ShmSection, load_config
    from tessera_launch.local import RunLayout, transport_flags

    def switch(on):
        return "1" if on else "0"

    expected = {
        "--transport": "zmq",
        "--rdma_required": switch(RdmaSection.required),
        "--rdma_pool_bytes": str(RdmaSection.pool_bytes),
        "--rdma_max_pinned_bytes": str(RdmaSection.max_pinned_bytes),
        "--shm": switch(ShmSection.enabled),
        "--shm_min_frame_bytes": str(ShmSection.min_frame_bytes),
        "--shm_ring_bytes": str(ShmSection.ring_bytes),
        "--shm_cross_memory": switch(ShmSection.cross_memory),
        "--shm_min_lend_bytes": str(ShmSection.min_lend_bytes),
        "--coalesce": switch(CoalesceSection.enabled),
        "--coalesce_max_message_bytes": str(CoalesceSection.max_message_bytes),
        "--coalesce_max_batch_bytes": str(CoalesceSection.max_batch_bytes),
        "--coalesce_max_delay_us": str(CoalesceSection.max_delay_us),
    }
    wrong = []
    for binary in (binaries / "coordinator" / "tessera-coordinator", binaries / "server" / "tessera-server",
                   binaries / "examples" / "tessera-logreg"):
        shown = help_defaults(binary)
        wrong += [f"{binary.name} {flag}: binary {shown.get(flag)}, launcher {want}"
                  for flag, want in expected.items() if shown.get(flag) != want]
    assert not wrong, wrong
    job = tmp_path / "job.yaml"
    job.write_text("job:\n  name: defaults\nsecurity:\n  curve: false\nworker:\n  program: w\n")
    assert transport_flags(load_config(job), RunLayout(tmp_path / "run")) == []
