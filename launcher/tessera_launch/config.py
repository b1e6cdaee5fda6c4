"""Loading, overriding and validating Tessera job configs.

A job config is a YAML file with four sections: `job`, `cluster`, `timeouts`
and `worker`, optional sections of their own for the transports (`rdma`,
`shm`, `coalesce`) and the rest (`metrics`, `checkpoints`, ...), one
optional section per back-end that needs settings of its own: `mpirun`,
`slurm`, `ssh`, `kubernetes`, and an optional list of process faults,
`faults` (faults.py; configs/README.md documents every key). `load_config`
reads one, applies `--set key.path=value` overrides, fills in defaults and
validates strictly. Every problem raises ConfigError; its message names
where the bad value came from (`FILE:LINE`, `FILE`, or `--set ...`) and the
key path, e.g.

    configs/x.yaml:9: cluster.servers must be a positive integer, got "two"

All problems found are reported together, one per line. Nothing here starts a
process or writes a file.

The config is split along its seams, one module each: config_schema.py (the
keys, their checks and defaults, ConfigError), config_sections.py (the
resolved config: JobConfig and its sections), config_yaml.py (the YAML
loader that keeps line numbers), config_validate.py (validation). This
module loads a file and applies --set overrides (load_config), and is where
the rest of the launcher imports all of them from: every name of those
modules that other modules or tests use is importable from here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from .config_schema import (BACKEND_SECTIONS, CODEC_OPTION_ALIASES, DEFAULT_ROW_PIECE_BYTES, LIST_KEYS, MAX_BYTES,
                            MAX_DELAY_US, MIN_RING_BYTES, RESERVED_WORKER_FLAGS, SCHEMA, TRANSPORTS,
                            WORKER_LOSS_POLICIES, ZMQ_TRANSPORTS, ConfigError, Field, all_key_paths)
from .config_sections import (AuditSection, CheckpointsSection, ClusterSection, CoalesceSection, CoordinatorSection,
                              DiskSection, JobConfig, JobSection, KubernetesSection, LimitsSection,
                              MessageFaultsSection, MetricsSection, MpirunSection, RdmaSection, RebalanceSection,
                              SecuritySection, ShmSection, SlurmSection, SshSection, TimeoutsSection,
                              TransferSection, WorkerSection)
from .config_validate import validate
from .config_yaml import _MarkedDict, _read_yaml

__all__ = [
    # this module's own
    "Override", "parse_override", "load_config",
    # config_schema.py
    "BACKEND_SECTIONS", "CODEC_OPTION_ALIASES", "DEFAULT_ROW_PIECE_BYTES", "LIST_KEYS", "MAX_BYTES", "MAX_DELAY_US",
    "MIN_RING_BYTES", "RESERVED_WORKER_FLAGS", "SCHEMA", "TRANSPORTS", "WORKER_LOSS_POLICIES", "ZMQ_TRANSPORTS",
    "ConfigError", "Field", "all_key_paths",
    # config_sections.py
    "AuditSection", "CheckpointsSection", "ClusterSection", "CoalesceSection", "CoordinatorSection",
    "DiskSection", "JobConfig", "JobSection", "KubernetesSection", "LimitsSection", "MessageFaultsSection",
    "MetricsSection", "MpirunSection", "RdmaSection", "RebalanceSection", "SecuritySection", "ShmSection",
    "SlurmSection", "SshSection", "TimeoutsSection", "TransferSection", "WorkerSection",
    # config_validate.py, config_yaml.py
    "validate", "_read_yaml",
]


# --------------------------------------------------------------------------
# --set overrides
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Override:
    """One `--set key.path=value`: the path and the value, parsed as YAML."""

    path: tuple
    value: Any
    text: str


def parse_override(text: str) -> Override:
    """Parses "a.b.c=value". The value is read as a YAML scalar (so `3` is an
    integer and `ipc` a string); text YAML cannot parse is taken as a string.
    Raises ConfigError on a malformed argument."""
    key, sep, raw_value = text.partition("=")
    path = tuple(key.strip().split("."))
    if not sep or not key.strip() or any(not part for part in path):
        raise ConfigError(f"--set {text}: expected KEY.PATH=VALUE, e.g. cluster.servers=4")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError:
        value = raw_value
    return Override(path, value, text)


def _list_index(node: list, part: str) -> Optional[int]:
    """`part` as an index of the list `node` ("0" is the first), or None."""
    return int(part) if part.isdigit() and int(part) < len(node) else None


def _apply_override(data: dict, override: Override) -> None:
    """Sets the value at the override's path, making mappings on the way;
    a part that is a number indexes an existing list (faults.0.at_seconds)."""
    node = data
    for depth, part in enumerate(override.path[:-1]):
        prefix = ".".join(override.path[: depth + 1])
        if isinstance(node, list):
            index = _list_index(node, part)
            if index is None:
                raise ConfigError(f"--set {override.text}: {prefix}: the list has {len(node)} entries "
                                  f"(0 to {len(node) - 1})")
            child = node[index]
        else:
            child = node.get(part)
            if child is None:
                child = node[part] = _MarkedDict()
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"--set {override.text}: {prefix} is not a mapping")
        node = child
    last = override.path[-1]
    if isinstance(node, list):
        index = _list_index(node, last)
        if index is None:
            raise ConfigError(f"--set {override.text}: {'.'.join(override.path)}: the list has {len(node)} "
                              f"entries (0 to {len(node) - 1})")
        node[index] = override.value
    else:
        node[last] = override.value


def load_config(path, overrides=()) -> JobConfig:
    """Reads the YAML file at `path`, applies `overrides` (strings of the form
    "key.path=value", in order; later ones win) and validates the result.

    Raises ConfigError (message naming the file, line and key path) on any
    problem: unreadable file, YAML syntax error, duplicate or unknown key,
    wrong type, out-of-range value, malformed override.
    """
    source = str(path)
    data = _read_yaml(Path(path))
    parsed = [parse_override(text) for text in overrides]
    if data is None:
        data = _MarkedDict()
    if parsed and isinstance(data, dict):
        data = copy.deepcopy(data)
        for override in parsed:
            _apply_override(data, override)
    return validate(data, source, parsed)
