"""Tests of tessera_launch.config: loading, --set overrides, defaults and
strict validation with messages that name the file, line and key path."""

import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import LAUNCHER_DIR
from tessera_launch.config import ConfigError, all_key_paths, load_config, parse_override

REPO = LAUNCHER_DIR.parent

MINIMAL = """\
worker:
  program: tessera-logreg
"""


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


# -- the shipped config and defaults ----------------------------------------


def test_shipped_local_config_is_valid():
    config = load_config(REPO / "configs" / "local.yaml")
    assert config.job.name == "logreg-local"
    assert (config.cluster.servers, config.cluster.workers, config.cluster.vshards) == (2, 2, 64)
    assert config.cluster.transport == "tcp"
    assert config.worker.program == "tessera-logreg"
    assert config.worker.args["epochs"] == 3
    assert config.timeouts.lease_seconds == 5


def test_missing_optional_sections_get_defaults(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert config.job.name == "tessera-job"
    assert (config.cluster.servers, config.cluster.workers, config.cluster.vshards) == (1, 1, 64)
    assert (config.cluster.transport, config.cluster.host) == ("tcp", "127.0.0.1")
    assert (config.timeouts.assemble_seconds, config.timeouts.heartbeat_seconds,
            config.timeouts.lease_seconds) == (30, 1, 5)
    assert config.worker.args == {}


def test_empty_section_means_defaults(tmp_path):
    config = load_config(write(tmp_path, MINIMAL + "timeouts:\ncluster:\n"))
    assert config.timeouts.assemble_seconds == 30
    assert config.cluster.servers == 1


def test_resolved_config_round_trips(tmp_path):
    config = load_config(REPO / "configs" / "local.yaml", ["cluster.servers=3"])
    again = load_config(write(tmp_path, config.to_yaml()))
    assert again.to_dict() == config.to_dict()
    assert "--set cluster.servers=3" in config.to_yaml()


def test_every_key_is_documented():
    readme = (REPO / "configs" / "README.md").read_text()
    for key in all_key_paths():
        assert f"`{key}`" in readme, f"configs/README.md does not document {key}"


# -- errors: each names the file (and line) and the key path -----------------


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert error_of(missing) == f"{missing}: no such file"


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, """\
        job:
          name: x
        cluster:
          servers: [2
        worker:
          program: p
        """)
    message = error_of(path)
    assert message.startswith(f"{path}:5:")
    assert "YAML syntax error" in message


def test_duplicate_key_is_an_error(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  servers: 2\n  servers: 3\n")
    message = error_of(path)
    assert message.startswith(f"{path}:5:")
    assert "duplicate key 'servers' (first given on line 4)" in message


def test_unknown_key_names_path_and_suggests(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  srevers: 2\n")
    assert error_of(path) == (
        f"{path}:4: unknown key cluster.srevers; did you mean cluster.servers? "
        "(known: servers, workers, vshards, server_weights, max_servers, max_workers, transport, host, replication, "
        "on_shard_loss, on_worker_loss)")


def test_unknown_section(tmp_path):
    path = write(tmp_path, MINIMAL + "clusters:\n  servers: 2\n")
    assert f"{path}:3: unknown key clusters; did you mean cluster?" in error_of(path)


def test_wrong_type_names_file_line_key_and_value(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  servers: two\n")
    assert error_of(path) == f'{path}:4: cluster.servers must be a positive integer, got "two"'


@pytest.mark.parametrize("value, shown", [
    ("-1", "-1"), ("0", "0"), ("2.5", "2.5"), ("true", "true"), ("null", "null"), ("[1, 2]", "a list"),
])
def test_non_positive_or_non_integer_counts(tmp_path, value, shown):
    path = write(tmp_path, MINIMAL + f"cluster:\n  workers: {value}\n")
    assert error_of(path) == f"{path}:4: cluster.workers must be a positive integer, got {shown}"


def test_unknown_transport(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  transport: udp\n")
    assert error_of(path) == f'{path}:4: cluster.transport must be one of tcp | ipc | zmq | rdma | auto, got "udp"'


def test_timeouts_must_be_positive_numbers(tmp_path):
    path = write(tmp_path, MINIMAL + "timeouts:\n  assemble_seconds: soon\n  lease_seconds: -5\n")
    message = error_of(path)
    assert f'{path}:4: timeouts.assemble_seconds must be a positive number (seconds), got "soon"' in message
    assert f"{path}:5: timeouts.lease_seconds must be a positive number (seconds), got -5" in message


def test_fractional_seconds_are_fine(tmp_path):
    config = load_config(write(tmp_path, MINIMAL + "timeouts:\n  heartbeat_seconds: 0.2\n  lease_seconds: 1\n"))
    assert config.timeouts.heartbeat_seconds == 0.2


def test_all_errors_are_reported_together(tmp_path):
    path = write(tmp_path, "cluster:\n  servers: 0\n  workers: x\n  transport: verbs\n")
    lines = error_of(path).splitlines()
    assert len(lines) == 4  # servers, workers, transport, and the missing worker.program
    assert any("worker.program is required" in line for line in lines)


def test_section_must_be_a_mapping(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster: 4\n")
    assert error_of(path) == f"{path}:3: cluster must be a mapping, got 4"


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- job\n- cluster\n")
    assert "the top level must be a mapping of sections" in error_of(path)


def test_worker_program_is_required(tmp_path):
    path = write(tmp_path, "cluster:\n  servers: 2\n")
    assert error_of(path).startswith(f"{path}: worker.program is required")


def test_job_name_must_be_usable_as_a_directory_name(tmp_path):
    path = write(tmp_path, MINIMAL + "job:\n  name: ../escape\n")
    assert f'{path}:4: job.name must be a name of letters' in error_of(path)


def test_worker_args_rules(tmp_path):
    path = write(tmp_path, """\
        worker:
          program: p
          args:
            rank: 3
            nested: {a: 1}
            "bad key": 1
            fine_key: 0.5
        """)
    message = error_of(path)
    assert f"{path}:4: worker.args.rank is reserved: the launcher passes --rank itself" in message
    assert f"{path}:5: worker.args.nested must be a string, number, boolean or a codec mapping" in message
    assert f'{path}:6: worker.args key "bad key" is not a valid flag name' in message
    assert "fine_key" not in message


def test_codec_mappings_become_spec_strings(tmp_path):
    config = load_config(write(tmp_path, """\
        worker:
          program: p
          args:
            compression: {codec: topk, ratio: 0.01, error_feedback: true}
            pull_compression: {codec: fp16}
        """))
    assert config.worker.args["compression"] == "topk:ratio=0.01,ef=true"
    assert config.worker.args["pull_compression"] == "fp16"
    path = write(tmp_path, """\
        worker:
          program: p
          args:
            compression: {codec: topk, ratio: [1, 2]}
        """)
    assert "codec option ratio must be a string, number or boolean" in error_of(path)


def test_cross_field_checks(tmp_path):
    path = write(tmp_path, MINIMAL + textwrap.dedent("""\
        cluster:
          servers: 8
          vshards: 4
        timeouts:
          heartbeat_seconds: 2
          lease_seconds: 2
        """))
    message = error_of(path)
    assert "cluster.vshards (4) must be at least cluster.servers (8)" in message
    assert "timeouts.lease_seconds (2) must be greater than timeouts.heartbeat_seconds (2)" in message


def test_server_weights_are_one_positive_number_per_server(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  servers: 3\n  server_weights: [1, 1, 2.5]\n")
    config = load_config(path)
    assert config.cluster.server_weights == [1, 1, 2.5]
    assert load_config(write(tmp_path, MINIMAL, "plain.yaml")).cluster.server_weights == []  # all equal
    # The resolved config (written to the run directory) reads back the same.
    again = load_config(write(tmp_path, config.to_yaml(), "resolved.yaml"))
    assert again.cluster.server_weights == [1, 1, 2.5] and again.to_dict() == config.to_dict()


@pytest.mark.parametrize("weights, problem", [
    ("[1, 2]", ":5: cluster.server_weights has 2 weights for cluster.servers 3: give one per server rank"),
    ("[1, 2, 3, 4]", ":5: cluster.server_weights has 4 weights for cluster.servers 3"),
    ("[1, 0, 2]", ":5: cluster.server_weights[1] must be a positive number (a server's weight, at most 3.4e38), "
                  "got 0"),
    ("[1, 1, -2]", ":5: cluster.server_weights[2] must be a positive number"),
    ("[.nan, 1, 1]", ":5: cluster.server_weights[0] must be a positive number"),
    ("[1, .inf, 1]", ":5: cluster.server_weights[1] must be a positive number"),
    ("[1, 1, 1.0e+39]", ":5: cluster.server_weights[2] must be a positive number"),  # no 32-bit float
    ("[1, true, 1]", ":5: cluster.server_weights[1] must be a positive number"),
    ("[1, two, 1]", ':5: cluster.server_weights[1] must be a positive number (a server\'s weight, at most 3.4e38), '
                    'got "two"'),
    ("2", ":5: cluster.server_weights must be a list of positive numbers, one per server (empty: all servers "
          "weigh the same), got 2"),
])
def test_bad_server_weights_are_named(tmp_path, weights, problem):
    path = write(tmp_path, MINIMAL + f"cluster:\n  servers: 3\n  server_weights: {weights}\n")
    assert f"{path}{problem}" in error_of(path)


@pytest.mark.parametrize("setting, problem", [
    ("threshold: 0.9", "rebalance.threshold must be 0 (off) or a multiple of the mean load above 1, e.g. 1.25"),
    ("threshold: -1", "rebalance.threshold must be 0 (off)"),
    ("interval_seconds: 0", "rebalance.interval_seconds must be a positive number"),
    ("request_cost_bytes: -5", "rebalance.request_cost_bytes must be a number of bytes, 0 or more"),
])
def test_bad_rebalance_settings_are_named(tmp_path, setting, problem):
    path = write(tmp_path, MINIMAL + f"rebalance:\n  {setting}\n")
    assert problem in error_of(path)
    assert load_config(write(tmp_path, MINIMAL + "rebalance:\n  threshold: 1.25\n", "ok.yaml")).rebalance.threshold == 1.25


def test_max_servers_is_at_least_servers(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  servers: 3\n  max_servers: 2\n")
    assert "cluster.max_servers (2) must be 0 or at least cluster.servers (3)" in error_of(path)
    ok = write(tmp_path, MINIMAL + "cluster:\n  servers: 3\n  max_servers: 5\n", "ok.yaml")
    assert load_config(ok).cluster.max_servers == 5


def test_max_workers_is_at_least_workers(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  workers: 3\n  max_workers: 2\n")
    assert "cluster.max_workers (2) must be 0 or at least cluster.workers (3)" in error_of(path)
    ok = write(tmp_path, MINIMAL + "cluster:\n  workers: 3\n  max_workers: 4\n", "ok.yaml")
    assert load_config(ok).cluster.max_workers == 4


def test_a_bad_server_weight_is_placed_on_its_line(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  servers: 2\n  server_weights:\n    - 1\n    - 0\n")
    assert error_of(path).startswith(f"{path}:7: cluster.server_weights[1] must be a positive number")
    assert error_of(path, ["cluster.server_weights=[1]"]).startswith(
        "--set cluster.server_weights=[1]: cluster.server_weights has 1 weights for cluster.servers 2")


# -- --set overrides ---------------------------------------------------------


def test_overrides_apply_in_order_with_yaml_typing(tmp_path):
    path = write(tmp_path, MINIMAL)
    config = load_config(path, ["cluster.servers=3", "cluster.servers=4", "cluster.transport=ipc",
                                "timeouts.lease_seconds=2.5", "worker.args.epochs=1",
                                "worker.args.name_prefix=abc", "job.name=exp-7"])
    assert config.cluster.servers == 4
    assert config.cluster.transport == "ipc"
    assert config.timeouts.lease_seconds == 2.5
    assert config.worker.args == {"epochs": 1, "name_prefix": "abc"}
    assert config.job.name == "exp-7"
    assert config.overrides[0] == "cluster.servers=3"


def test_override_can_supply_a_required_key(tmp_path):
    path = write(tmp_path, "cluster:\n  servers: 2\n")
    assert load_config(path, ["worker.program=./my-worker"]).worker.program == "./my-worker"


def test_bad_override_value_is_blamed_on_the_override(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert error_of(path, ["cluster.servers=two"]) == (
        '--set cluster.servers=two: cluster.servers must be a positive integer, got "two"')


def test_override_of_unknown_key(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert error_of(path, ["cluster.replicas=2"]).startswith(
        "--set cluster.replicas=2: unknown key cluster.replicas")
    assert error_of(path, ["cluster.servers=2", "cluster.servers.x=2"]) == (
        "--set cluster.servers.x=2: cluster.servers is not a mapping")


@pytest.mark.parametrize("text", ["cluster.servers", "=3", "cluster..servers=3", ".x=1"])
def test_malformed_override(text):
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        parse_override(text)


def test_override_values_are_yaml_scalars():
    assert parse_override("a.b=3").value == 3
    assert parse_override("a.b=0.5").value == 0.5
    assert parse_override("a.b=true").value is True
    assert parse_override("a.b=x=y").value == "x=y"
    assert parse_override("a.b=").value is None
    assert parse_override("a.b=[unclosed").value == "[unclosed"  # not YAML: taken as text


def test_overrides_do_not_change_the_file_or_its_line_numbers(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  servers: 2\n  workers: zero\n")
    message = error_of(path, ["cluster.servers=5"])
    assert message == f'{path}:5: cluster.workers must be a positive integer, got "zero"'
    assert yaml.safe_load(path.read_text())["cluster"]["servers"] == 2


# -- transports: cluster.transport, rdma, shm, coalesce ---------------------------


def test_transport_sections_default_and_land_in_the_resolved_config(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert (config.rdma.required, config.rdma.pool_bytes, config.rdma.max_pinned_bytes) == (False, 64 << 20, 1 << 30)
    assert (config.shm.enabled, config.shm.min_frame_bytes, config.shm.ring_bytes) == (True, 65536, 64 << 20)
    resolved = yaml.safe_load(config.to_yaml())
    assert resolved["rdma"] == {"required": False, "pool_bytes": 67108864, "max_pinned_bytes": 1073741824}
    assert resolved["shm"] == {"enabled": True, "min_frame_bytes": 65536, "ring_bytes": 67108864,
                               "cross_memory": True, "min_lend_bytes": 2097152}
    assert (config.coalesce.enabled, config.coalesce.max_message_bytes, config.coalesce.max_batch_bytes,
            config.coalesce.max_delay_us) == (True, 16384, 65536, 1000)
    assert resolved["coalesce"] == {"enabled": True, "max_message_bytes": 16384, "max_batch_bytes": 65536,
                                    "max_delay_us": 1000}
    assert resolved["cluster"]["transport"] == "tcp"


@pytest.mark.parametrize("transport, wire, scheme", [
    ("tcp", "zmq", "tcp"), ("zmq", "zmq", "tcp"), ("ipc", "zmq", "ipc"), ("rdma", "rdma", "tcp"),
    ("auto", "auto", "tcp"),
])
def test_every_transport_is_accepted(tmp_path, transport, wire, scheme):
    config = load_config(write(tmp_path, MINIMAL), [f"cluster.transport={transport}"])
    assert (config.cluster.transport, config.cluster.wire, config.cluster.bind_scheme) == (transport, wire, scheme)


def test_transport_sections_from_a_file_and_overrides(tmp_path):
    path = write(tmp_path, MINIMAL + textwrap.dedent("""\
        cluster:
          transport: rdma
        rdma:
          required: true
          pool_bytes: 1048576
          max_pinned_bytes: 2097152
        shm:
          enabled: false
          min_frame_bytes: 4096
          ring_bytes: 8388608
        """))
    config = load_config(path, ["rdma.pool_bytes=2097152", "shm.enabled=true"])
    assert (config.rdma.required, config.rdma.pool_bytes, config.rdma.max_pinned_bytes) == (True, 2097152, 2097152)
    assert config.rdma.pinned_bytes == 4194304
    assert (config.shm.enabled, config.shm.min_frame_bytes, config.shm.ring_bytes) == (True, 4096, 8388608)
    again = load_config(write(tmp_path, config.to_yaml(), "resolved.yaml"))
    assert again.to_dict() == config.to_dict()


def test_required_rdma_with_a_zeromq_transport_says_why(tmp_path):
    path = write(tmp_path, MINIMAL + "cluster:\n  transport: tcp\nrdma:\n  required: true\n")
    assert error_of(path) == (
        f"{path}:6: rdma.required is true, but cluster.transport is tcp, which never uses RDMA: set "
        "cluster.transport to rdma or auto, or rdma.required to false")
    for transport in ("ipc", "zmq"):
        assert "which never uses RDMA" in error_of(path, [f"cluster.transport={transport}"])
    # The default transport is tcp: required alone is the same mistake, blamed on the --set.
    assert error_of(write(tmp_path, MINIMAL, "plain.yaml"), ["rdma.required=true"]).startswith(
        "--set rdma.required=true: rdma.required is true, but cluster.transport is tcp")
    for transport in ("rdma", "auto"):
        assert load_config(path, [f"cluster.transport={transport}"]).rdma.required is True


def test_transport_section_values_are_checked(tmp_path):
    path = write(tmp_path, MINIMAL + textwrap.dedent("""\
        rdma:
          required: "yes"
          pool_bytes: 0
          max_pinned_bytes: 1.5
        shm:
          enabled: 1
          min_frame_bytes: -4
          ring_bytes: 3000000
          ringbytes: 2
        """))
    message = error_of(path)
    assert f'{path}:4: rdma.required must be true or false, got "yes"' in message
    assert f"{path}:5: rdma.pool_bytes must be a positive integer (bytes), got 0" in message
    assert f"{path}:6: rdma.max_pinned_bytes must be a positive integer (bytes), got 1.5" in message
    assert f"{path}:8: shm.enabled must be true or false, got 1" in message
    assert f"{path}:9: shm.min_frame_bytes must be a positive integer (bytes), got -4" in message
    assert f"{path}:10: shm.ring_bytes must be a power of two of at least 1048576 (1 MiB), in bytes, got 3000000" \
        in message
    assert f"{path}:11: unknown key shm.ringbytes; did you mean shm.ring_bytes?" in message
    assert len(message.splitlines()) == 7


def test_coalesce_section_from_a_file_and_overrides(tmp_path):
    path = write(tmp_path, MINIMAL + textwrap.dedent("""\
        coalesce:
          enabled: false
          max_message_bytes: 4096
          max_batch_bytes: 32768
          max_delay_us: 250
        """))
    config = load_config(path)
    assert (config.coalesce.enabled, config.coalesce.max_message_bytes, config.coalesce.max_batch_bytes,
            config.coalesce.max_delay_us) == (False, 4096, 32768, 250)
    config = load_config(path, ["coalesce.enabled=true", "coalesce.max_delay_us=60000000"])
    assert (config.coalesce.enabled, config.coalesce.max_delay_us) == (True, 60000000)
    again = load_config(write(tmp_path, config.to_yaml(), "resolved.yaml"))
    assert again.to_dict() == config.to_dict()
    # Equal sizes are fine: a batch holds at least one message.
    assert load_config(path, ["coalesce.max_batch_bytes=4096"]).coalesce.max_batch_bytes == 4096


def test_coalesce_section_values_are_checked(tmp_path):
    path = write(tmp_path, MINIMAL + textwrap.dedent("""\
        coalesce:
          enabled: "yes"
          max_message_bytes: 0
          max_batch_bytes: 1.5
          max_delay_us: -1
          max_delay: 2
        """))
    message = error_of(path)
    assert f'{path}:4: coalesce.enabled must be true or false, got "yes"' in message
    assert f"{path}:5: coalesce.max_message_bytes must be a positive integer (bytes), got 0" in message
    assert f"{path}:6: coalesce.max_batch_bytes must be a positive integer (bytes), got 1.5" in message
    assert f"{path}:7: coalesce.max_delay_us must be a positive integer (microseconds), at most 60000000 " \
        "(a minute), got -1" in message
    assert f"{path}:8: unknown key coalesce.max_delay; did you mean coalesce.max_delay_us?" in message
    assert len(message.splitlines()) == 5
    plain = write(tmp_path, MINIMAL, "plain.yaml")
    for key, bad in (("max_message_bytes", "-4096"), ("max_batch_bytes", "0"), ("max_delay_us", "0"),
                     ("max_message_bytes", "true"), ("max_batch_bytes", "64KiB"), ("max_delay_us", "1.5"),
                     ("max_delay_us", "60000001"), ("enabled", "1")):
        assert error_of(plain, [f"coalesce.{key}={bad}"]).startswith(f"--set coalesce.{key}={bad}: coalesce.{key} must"), \
            (key, bad)
    assert "coalesce must be a mapping" in error_of(plain, ["coalesce=4"])


def test_coalesce_message_and_batch_sizes_against_each_other(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert error_of(path, ["coalesce.max_message_bytes=65537"]) == (
        "--set coalesce.max_message_bytes=65537: coalesce.max_batch_bytes (65536) must be at least "
        "coalesce.max_message_bytes (65537)")
    file = write(tmp_path, MINIMAL + "coalesce:\n  max_message_bytes: 8192\n  max_batch_bytes: 4096\n", "both.yaml")
    assert error_of(file) == (f"{file}:5: coalesce.max_batch_bytes (4096) must be at least "
                              "coalesce.max_message_bytes (8192)")
    # Checked with coalescing off too: every process still reads (and checks) the sizes.
    assert "must be at least coalesce.max_message_bytes" in error_of(file, ["coalesce.enabled=false"])
    # Only max_message_bytes given: it is blamed (in the file too).
    only = write(tmp_path, MINIMAL + "coalesce:\n  enabled: true\n  max_message_bytes: 100000\n", "only.yaml")
    assert error_of(only) == (f"{only}:5: coalesce.max_batch_bytes (65536) must be at least "
                              "coalesce.max_message_bytes (100000)")
    config = load_config(path, ["coalesce.max_message_bytes=131072", "coalesce.max_batch_bytes=262144"])
    assert (config.coalesce.max_message_bytes, config.coalesce.max_batch_bytes) == (131072, 262144)


def test_transfer_section_defaults_values_and_errors(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert (config.transfer.part_bytes, config.transfer.max_bytes_in_flight_per_server) == (0, 0)
    assert config.transfer.row_piece_bytes == 2 << 20
    assert config.transfer.worker_flags() == [], "the workers' own defaults: nothing passed"
    whole = load_config(write(tmp_path, MINIMAL + "transfer:\n  row_piece_bytes: 0\n", "whole.yaml"))
    assert whole.transfer.worker_flags() == ["--transfer_row_piece_bytes", "0"]
    path = write(tmp_path, MINIMAL + "transfer:\n  part_bytes: 65536\n  max_bytes_in_flight_per_server: 262144\n")
    config = load_config(path)
    assert config.transfer.worker_flags() == ["--transfer_part_bytes", "65536",
                                              "--transfer_max_bytes_in_flight_per_server", "262144"]
    again = load_config(write(tmp_path, config.to_yaml(), "resolved.yaml"))
    assert again.to_dict() == config.to_dict()
    bad = write(tmp_path, MINIMAL + "transfer:\n  part_bytes: -1\n  max_bytes_in_flight_per_server: 1.5\n"
                "  part_byte: 3\n", "bad.yaml")
    message = error_of(bad)
    assert f"{bad}:4: transfer.part_bytes must be an integer, 0 or more (bytes; 0: off), got -1" in message
    assert (f"{bad}:5: transfer.max_bytes_in_flight_per_server must be an integer, 0 or more (bytes; 0: off), "
            "got 1.5") in message
    assert "unknown key transfer.part_byte; did you mean transfer.part_bytes?" in message
    assert "got true" in error_of(write(tmp_path, MINIMAL, "plain.yaml"), ["transfer.part_bytes=true"])
    reserved = write(tmp_path, MINIMAL + "  args:\n    transfer_part_bytes: 4096\n", "reserved.yaml")
    assert "worker.args.transfer_part_bytes is reserved" in error_of(reserved)
    reserved = write(tmp_path, MINIMAL + "  args:\n    transfer_row_piece_bytes: 4096\n", "reserved2.yaml")
    assert "worker.args.transfer_row_piece_bytes is reserved" in error_of(reserved)
    assert "transfer.row_piece_bytes must be an integer" in error_of(write(tmp_path, MINIMAL, "plain2.yaml"),
                                                                       ["transfer.row_piece_bytes=-5"])


def test_transport_byte_counts_against_each_other(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert error_of(path, ["rdma.pool_bytes=2097152", "rdma.max_pinned_bytes=1048576"]) == (
        "--set rdma.max_pinned_bytes=1048576: rdma.max_pinned_bytes (1048576) must be at least rdma.pool_bytes "
        "(2097152)")
    assert error_of(path, ["shm.min_frame_bytes=1048576", "shm.ring_bytes=1048576"]) == (
        "--set shm.ring_bytes=1048576: shm.ring_bytes (1048576) must be at least 2 * shm.min_frame_bytes (2097152)")
    assert "shm.ring_bytes must be a power of two" in error_of(path, ["shm.ring_bytes=524288"])
    config = load_config(path, ["shm.min_frame_bytes=524288", "shm.ring_bytes=1048576",
                                "rdma.pool_bytes=4096", "rdma.max_pinned_bytes=4096"])
    assert (config.shm.ring_bytes, config.rdma.max_pinned_bytes) == (1048576, 4096)


def test_table_memory_limit_is_auto_unless_set(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert load_config(path).limits.max_table_mb == "auto"
    assert load_config(path, ["limits.max_table_mb=0"]).limits.max_table_mb == 0
    assert load_config(path, ["limits.max_table_mb=512"]).limits.max_table_mb == 512
    for bad in ("lots", "-1", "2.5"):
        message = error_of(path, [f"limits.max_table_mb={bad}"])
        assert "limits.max_table_mb" in message and "auto" in message, message


def test_a_new_job_may_not_write_its_checkpoints_where_it_restores_from(tmp_path):
    """A new job's shard map epochs start at 1 again, so its checkpoints
    would rank below the old job's on a later restore."""
    old = tmp_path / "old"
    path = write(tmp_path, MINIMAL)
    message = error_of(path, [f"checkpoints.restore_from={old}", f"checkpoints.dir={old}/"])
    assert "checkpoints.dir is checkpoints.restore_from" in message
    config = load_config(path, [f"checkpoints.restore_from={old}", "checkpoints.dir=checkpoints"])
    assert config.checkpoints.dir == "checkpoints"  # relative: in the new run's directory
