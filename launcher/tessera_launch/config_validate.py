"""Validating a job config: raw data (as parsed from YAML, --set overrides
applied) checked against SCHEMA and across keys, every problem collected
with where its value came from (FILE:LINE or --set ...), and the
JobConfig built from the result. Used by config.py (load_config); the
`faults` list is checked by faults.validate_faults.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Optional

from .config_schema import (_ARG_KEY_RE, _REQUIRED, CODEC_OPTION_ALIASES, LIST_KEYS, RESERVED_WORKER_FLAGS,
                            SCHEMA, ZMQ_TRANSPORTS, ConfigError, _is_float32_weight, _positive_number)
from .config_sections import _SECTION_TYPES, JobConfig, TimeoutsSection
from .config_yaml import _MarkedDict, _plain
from .faults import render_value as _render, validate_faults


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


class _Validator:
    """Validates raw config data, collecting every problem with its location."""

    def __init__(self, data: dict, source: str, overrides: list):
        self.data = data
        self.source = source
        self.overrides = overrides
        self.errors: list = []

    def where(self, path: tuple) -> str:
        """Where the value at `path` came from: the last --set that covers it,
        else FILE:LINE of the deepest key found in the file, else the --set
        that created the key, else FILE. An integer in `path` indexes a
        list (("faults", 0, "target")); an entry of a list is placed at its
        first key."""
        spath = tuple(str(p) for p in path)
        for override in reversed(self.overrides):
            if spath[: len(override.path)] == override.path:
                return f"--set {override.text}"
        line = None
        node: Any = self.data
        for part in path:
            if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                item_lines = getattr(node, "item_lines", [])
                line = item_lines[part] if part < len(item_lines) else line
                node = node[part]
                continue
            if not isinstance(node, dict) or part not in node:
                break
            line = getattr(node, "key_lines", {}).get(part, line)
            node = node[part]
        if line is None:
            for override in reversed(self.overrides):
                if override.path[: len(spath)] == spath:
                    return f"--set {override.text}"  # the override created it
        return f"{self.source}:{line}" if line else self.source

    def given(self, path: tuple) -> bool:
        """Whether the key at `path` (section, key) is in the file or set
        by an override (not a default)."""
        section = self.data.get(path[0])
        return ((isinstance(section, dict) and path[1] in section)
                or any(o.path[: len(path)] == path for o in self.overrides))

    def error(self, path: tuple, message: str) -> None:
        self.errors.append(f"{self.where(path)}: {message}")

    def unknown_keys(self, mapping: dict, known, path: tuple) -> None:
        for key in mapping:
            if key in known:
                continue
            full = ".".join(path + (str(key),))
            hint = difflib.get_close_matches(str(key), list(known), n=1)
            suggestion = f"; did you mean {'.'.join(path + (hint[0],))}?" if hint else ""
            self.error(path + (key,), f"unknown key {full}{suggestion} (known: {', '.join(known)})")

    def section(self, name: str) -> dict:
        """The section's values after checks, with defaults for missing keys."""
        raw = self.data.get(name)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.error((name,), f"{name} must be a mapping, got {_render(raw)}")
            raw = {}
        fields = SCHEMA[name]
        self.unknown_keys(raw, fields, (name,))
        values = {}
        for key, field in fields.items():
            path = (name, key)
            if key not in raw:
                if field.default is _REQUIRED:
                    self.error(path, f"{name}.{key} is required ({field.doc})")
                else:
                    values[key] = copy.deepcopy(field.default)
                continue
            value = raw[key]
            problem = field.check(value)
            if problem:
                self.error(path, f"{name}.{key} {problem}, got {_render(value)}")
            else:
                values[key] = _plain(value)
        return values

    def worker_args(self, args: dict) -> dict:
        out = dict(args)
        for key, value in args.items():
            path = ("worker", "args", key)
            if not isinstance(key, str) or not _ARG_KEY_RE.match(key):
                self.error(path, f"worker.args key {_render(key)} is not a valid flag name")
            elif key in RESERVED_WORKER_FLAGS:
                self.error(path, f"worker.args.{key} is reserved: the launcher passes --{key} itself")
            elif isinstance(value, dict) and "codec" in value:
                spec = self.codec_spec(path, value)
                if spec is not None:
                    out[key] = spec
            elif value is None or isinstance(value, (dict, list)):
                self.error(path, f"worker.args.{key} must be a string, number, boolean or a codec mapping "
                                 f"({{codec: topk, ratio: 0.01}}), got {_render(value)}")
        return out

    def codec_spec(self, path: tuple, value: dict) -> Optional[str]:
        """A codec mapping ({codec: topk, ratio: 0.01, error_feedback: true})
        as the spec string the programs take ("topk:ratio=0.01,ef=true")."""
        codec = value["codec"]
        if not isinstance(codec, str) or not codec:
            self.error(path + ("codec",), f"codec must be a codec name, got {_render(codec)}")
            return None
        options = []
        for k, v in value.items():
            if k == "codec":
                continue
            if v is None or isinstance(v, (dict, list)) or not isinstance(k, str):
                self.error(path + (str(k),), f"codec option {k} must be a string, number or boolean, got {_render(v)}")
                return None
            name = CODEC_OPTION_ALIASES.get(k, k)
            options.append(f"{name}={str(v).lower() if isinstance(v, bool) else v}")
        return codec + (":" + ",".join(options) if options else "")

    def transport_checks(self, cluster: dict, rdma: dict, shm: dict, coalesce: dict) -> None:
        """rdma.required against cluster.transport; the byte counts against
        each other."""
        transport = cluster.get("transport")
        if rdma.get("required") and transport in ZMQ_TRANSPORTS:
            self.error(("rdma", "required"),
                       f"rdma.required is true, but cluster.transport is {transport}, which never uses RDMA: "
                       "set cluster.transport to rdma or auto, or rdma.required to false")
        if "pool_bytes" in rdma and "max_pinned_bytes" in rdma and rdma["max_pinned_bytes"] < rdma["pool_bytes"]:
            self.error(("rdma", "max_pinned_bytes"),
                       f"rdma.max_pinned_bytes ({rdma['max_pinned_bytes']}) must be at least rdma.pool_bytes "
                       f"({rdma['pool_bytes']})")
        if "min_frame_bytes" in shm and "ring_bytes" in shm and shm["ring_bytes"] < 2 * shm["min_frame_bytes"]:
            self.error(("shm", "ring_bytes"),
                       f"shm.ring_bytes ({shm['ring_bytes']}) must be at least 2 * shm.min_frame_bytes "
                       f"({2 * shm['min_frame_bytes']})")
        if ("max_message_bytes" in coalesce and "max_batch_bytes" in coalesce
                and coalesce["max_batch_bytes"] < coalesce["max_message_bytes"]):
            # Blamed on max_batch_bytes, unless only max_message_bytes was given.
            blamed = "max_batch_bytes" if self.given(("coalesce", "max_batch_bytes")) else "max_message_bytes"
            self.error(("coalesce", blamed),
                       f"coalesce.max_batch_bytes ({coalesce['max_batch_bytes']}) must be at least "
                       f"coalesce.max_message_bytes ({coalesce['max_message_bytes']})")

    def server_weights(self, cluster: dict) -> None:
        """cluster.server_weights: each entry a positive number the
        coordinator can hold (a 32-bit float), one per server or none."""
        weights = cluster.get("server_weights")
        if not weights:
            return
        bad = False
        for i, w in enumerate(weights):
            if not _is_float32_weight(w):
                self.error(("cluster", "server_weights", i),
                           f"cluster.server_weights[{i}] must be a positive number (a server's weight, at most "
                           f"3.4e38), got {_render(w)}")
                bad = True
        if not bad and "servers" in cluster and len(weights) != cluster["servers"]:
            self.error(("cluster", "server_weights"),
                       f"cluster.server_weights has {len(weights)} weights for cluster.servers {cluster['servers']}: "
                       "give one per server rank, or none (all equal)")

    def cross_checks(self, cluster: dict, timeouts: dict) -> None:
        if "vshards" in cluster and "servers" in cluster and cluster["vshards"] < cluster["servers"]:
            self.error(
                ("cluster", "vshards"),
                f"cluster.vshards ({cluster['vshards']}) must be at least cluster.servers ({cluster['servers']})",
            )
        servers = cluster.get("servers", 1)
        if cluster.get("max_servers") and isinstance(servers, int) and cluster["max_servers"] < servers:
            self.error(
                ("cluster", "max_servers"),
                f"cluster.max_servers ({cluster['max_servers']}) must be 0 or at least cluster.servers ({servers})",
            )
        workers = cluster.get("workers", 1)
        if cluster.get("max_workers") and isinstance(workers, int) and cluster["max_workers"] < workers:
            self.error(
                ("cluster", "max_workers"),
                f"cluster.max_workers ({cluster['max_workers']}) must be 0 or at least cluster.workers ({workers})",
            )
        server_heartbeat = timeouts.get("server_heartbeat_seconds", TimeoutsSection.server_heartbeat_seconds)
        server_lease = timeouts.get("server_lease_seconds", TimeoutsSection.server_lease_seconds)
        if (
            "server_heartbeat_seconds" in timeouts or "server_lease_seconds" in timeouts
        ) and _positive_number(server_heartbeat) is None and _positive_number(server_lease) is None and (
            server_lease <= server_heartbeat
        ):
            self.error(
                ("timeouts", "server_lease_seconds"),
                f"timeouts.server_lease_seconds ({server_lease}) must be greater than "
                f"timeouts.server_heartbeat_seconds ({server_heartbeat})",
            )
        if (
            "lease_seconds" in timeouts
            and "heartbeat_seconds" in timeouts
            and timeouts["lease_seconds"] <= timeouts["heartbeat_seconds"]
        ):
            self.error(
                ("timeouts", "lease_seconds"),
                f"timeouts.lease_seconds ({timeouts['lease_seconds']}) must be greater than "
                f"timeouts.heartbeat_seconds ({timeouts['heartbeat_seconds']})",
            )


def validate(data: Any, source: str, overrides: list = ()) -> JobConfig:
    """Validates raw config data (as parsed from YAML, overrides applied).

    Returns the JobConfig with defaults filled in; raises ConfigError listing
    every problem found.
    """
    overrides = list(overrides)
    if data is None:
        data = _MarkedDict()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections "
            f"({', '.join(SCHEMA)}, {', '.join(LIST_KEYS)}), got {_render(data)}"
        )
    checker = _Validator(data, source, overrides)
    checker.unknown_keys(data, list(SCHEMA) + list(LIST_KEYS), ())
    sections = {name: checker.section(name) for name in SCHEMA}
    if "args" in sections["worker"]:
        sections["worker"]["args"] = checker.worker_args(sections["worker"]["args"])
    checker.cross_checks(sections["cluster"], sections["timeouts"])
    checker.server_weights(sections["cluster"])
    checker.transport_checks(sections["cluster"], sections["rdma"], sections["shm"], sections["coalesce"])
    if sections["coordinator"].get("standbys") and not sections["coordinator"].get("etcd"):
        checker.error(("coordinator", "standbys"),
                      "coordinator.standbys needs coordinator.etcd (standbys are elected through etcd)")
    checkpoints = sections["checkpoints"]
    if (checkpoints.get("restore_from") and checkpoints.get("dir") and Path(checkpoints["dir"]).is_absolute()
            and Path(checkpoints["dir"]).resolve() == Path(checkpoints["restore_from"]).resolve()):
        checker.error(("checkpoints", "dir"),
                      "checkpoints.dir is checkpoints.restore_from: give the new job a directory of its own (a new "
                      "job numbers its shard map epochs from 1 again, so a restore would take the old job's "
                      "checkpoints for newer than the new job's)")
    faults = validate_faults(data.get("faults"), sections["cluster"], checker.error)
    if checker.errors:
        raise ConfigError("\n".join(checker.errors))
    return JobConfig(
        **{name: _SECTION_TYPES[name](**values) for name, values in sections.items()},
        source=source,
        overrides=tuple(o.text for o in overrides),
        faults=tuple(faults),
    )
