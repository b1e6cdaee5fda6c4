"""Reading a config file's YAML: a strict loader that remembers the line of
every key and list item (so that a problem names FILE:LINE) and refuses a
key given twice. Used by config.py (load_config, --set overrides) and
config_validate.py (the line numbers); plan.py reads model files with
_read_yaml.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from .config_schema import ConfigError


# --------------------------------------------------------------------------
# YAML loading that remembers line numbers and rejects duplicate keys
# --------------------------------------------------------------------------


class _MarkedDict(dict):
    """A mapping read from YAML that remembers the (1-based) line of each key."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_lines: dict = {}

    def __deepcopy__(self, memo):
        clone = _MarkedDict({k: copy.deepcopy(v, memo) for k, v in self.items()})
        clone.key_lines = dict(self.key_lines)
        return clone


class _MarkedList(list):
    """A list read from YAML that remembers the (1-based) line of each item."""

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list = []

    def __deepcopy__(self, memo):
        clone = _MarkedList(copy.deepcopy(v, memo) for v in self)
        clone.item_lines = list(self.item_lines)
        return clone


def _plain(value: Any) -> Any:
    """`value` with every _MarkedDict and _MarkedList made a plain dict and
    list (the resolved config holds plain data, which yaml.safe_dump writes)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mappings are _MarkedDicts and that refuses a key given
    twice in one mapping (plain PyYAML silently keeps the last one)."""


def _construct_marked_mapping(loader: _StrictLoader, node: yaml.MappingNode):
    result = _MarkedDict()
    yield result
    explicit = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
    seen: dict = {}
    for key_node in explicit:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r} (first given on line {seen[key]})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1


def _construct_marked_sequence(loader: _StrictLoader, node: yaml.SequenceNode):
    result = _MarkedList()
    yield result
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.item_lines.append(item.start_mark.line + 1)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_marked_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:seq", _construct_marked_sequence)


def _read_yaml(path: Path) -> Any:
    """Parses the file; raises ConfigError naming the file (and line) on failure."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = e.problem or e.context or "invalid YAML"
        kind = "invalid YAML" if isinstance(e, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{where}: {kind}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: YAML error: {e}") from None
