# SPDX-License-Identifier: GPL-2.0-or-later
"""YAML read with the line of every key and value, and the checker that collects every
problem as ``file:line: what``: whoever fixes the plan is looking at the file."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import hostlist
import yaml

from gpushare.admin.plan.model import PlanError


class YamlMap(dict):
    """A YAML mapping that remembers its own line and each key's line."""

    line = 0
    lines: dict[Any, int]


class YamlSeq(list):
    line = 0
    lines: list[int]


_MAX_DEPTH = 50


def _convert(node: yaml.Node, loader: yaml.SafeLoader, path: str, depth: int = 0) -> Any:
    line = node.start_mark.line + 1
    if depth > _MAX_DEPTH:
        raise PlanError([f"{path}:{line}: the plan nests deeper than {_MAX_DEPTH} levels"])
    if isinstance(node, yaml.MappingNode):
        result = YamlMap()
        result.line, result.lines = line, {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise PlanError([f"{path}:{key_line}: a key must be a plain word, not a list "
                                 "or mapping"])
            key = _scalar(key_node, loader, path)
            if key in result:
                raise PlanError([f"{path}:{key_line}: key {key!r} given twice (first at line "
                                 f"{result.lines[key]}); keep one"])
            result[key] = _convert(value_node, loader, path, depth + 1)
            result.lines[key] = key_line
        return result
    if isinstance(node, yaml.SequenceNode):
        seq = YamlSeq(_convert(item, loader, path, depth + 1) for item in node.value)
        seq.line, seq.lines = line, [item.start_mark.line + 1 for item in node.value]
        return seq
    return _scalar(node, loader, path)


def _scalar(node: yaml.Node, loader: yaml.SafeLoader, path: str) -> Any:
    try:
        value = loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as err:
        line = node.start_mark.line + 1
        raise PlanError([f"{path}:{line}: cannot read the value {node.value!r}: "
                         f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"]
                        ) from None
    if isinstance(value, (list, dict)):  # only reachable through odd tags
        raise PlanError([f"{path}:{node.start_mark.line + 1}: expected a plain value"])
    return value


def load_yaml(text: str, path: str) -> Any:
    loader: Optional[yaml.SafeLoader] = None
    try:
        loader = yaml.SafeLoader(text)
        root = loader.get_single_node()
        if root is None:
            raise PlanError([f"{path}:1: the plan is empty; start with 'version: 1'"])
        return _convert(root, loader, path)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise PlanError([f"{path}:{line}: not valid YAML: {err.problem or err.context}"]
                        ) from None
    except yaml.reader.ReaderError as err:
        line = text[:max(err.position, 0)].count("\n") + 1
        raise PlanError([f"{path}:{line}: not valid YAML text: character {err.character!r} "
                         "is not allowed"]) from None
    except yaml.YAMLError as err:
        raise PlanError([f"{path}:1: not valid YAML: {err}"]) from None
    except RecursionError:
        raise PlanError([f"{path}:1: the plan nests too deeply"]) from None
    finally:
        if loader is not None:
            loader.dispose()


class Checker:
    """Collects problems so that one run of the parser reports all of them."""

    def __init__(self, path: str):
        self.path = path
        self.problems: list[str] = []

    def error(self, line: int, message: str) -> None:
        self.problems.append(f"{self.path}:{line}: {message}")

    def mapping(self, value: Any, line: int, what: str, allowed: Iterable[str],
                required: Iterable[str] = ()) -> Optional[YamlMap]:
        if not isinstance(value, YamlMap):
            self.error(line, f"{what} must be a mapping of keys to values, not "
                       f"{kind_of(value)}")
            return None
        allowed = tuple(allowed)
        for key in value:
            if key not in allowed:
                self.error(value.lines[key], f"{what}: unknown key {key!r}; accepted: "
                           + ", ".join(allowed))
        for key in required:
            if key not in value:
                self.error(value.line, f"{what}: missing key {key!r}")
        return value

    def integer(self, value: Any, line: int, what: str, low: int, high: int) -> Optional[int]:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(line, f"{what} must be a whole number, not {kind_of(value)}")
            return None
        if not low <= value <= high:
            self.error(line, f"{what} must be between {low} and {high}, not {value}")
            return None
        return value

    def string(self, value: Any, line: int, what: str) -> Optional[str]:
        if not isinstance(value, str) or not value.strip():
            self.error(line, f"{what} must be a non-empty string, not {kind_of(value)}")
            return None
        return value.strip()

    def choice(self, value: Any, line: int, what: str, choices: Iterable[str]) -> Optional[str]:
        choices = tuple(choices)
        if not isinstance(value, str) or value not in choices:
            self.error(line, f"{what} must be one of {', '.join(choices)}, not {value!r}")
            return None
        return value

    def hostlist(self, value: Any, line: int, what: str) -> Optional[tuple[str, ...]]:
        if isinstance(value, YamlSeq) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        text = self.string(value, line, what)
        if text is None:
            return None
        try:
            nodes = hostlist.expand_hostlist(text)
        except (hostlist.BadHostlist, ValueError, TypeError) as err:
            self.error(line, f"{what}: bad hostlist {text!r} ({err}); write e.g. n[001-016]")
            return None
        if len(set(nodes)) != len(nodes):
            self.error(line, f"{what}: hostlist {text!r} names a node twice")
        return tuple(nodes)


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def line_of(parent: Any, key: Any) -> int:
    if isinstance(parent, YamlMap):
        return parent.lines.get(key, parent.line)
    if isinstance(parent, YamlSeq) and isinstance(key, int) and key < len(parent.lines):
        return parent.lines[key]
    return getattr(parent, "line", 1)

