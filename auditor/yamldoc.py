"""YAML documents with line numbers, so every policy and settings error can say ``file:line``.

PyYAML's composer already knows where every node starts; we construct plain Python values from
the node tree ourselves (safe types only) and keep a map from each value's path (``("spec",
"escalation", 0, "cooldown")``) to its 1-based line. No second YAML library is needed.

Bounded: the operator re-reads files that anyone with write access to a ConfigMap can change, and
a 342-byte "billion laughs" document (aliases of aliases) expands to billions of values. Every
value built counts against :data:`MAX_VALUES`, aliases included, and a file over
:data:`MAX_BYTES` is refused before parsing; both say where. PyYAML composes nodes
recursively, so 600 ``[`` (1.2 kB, within both bounds) exhausted Python's stack with a
``RecursionError``; a document nested deeper than :data:`MAX_DEPTH` is refused at the level
past the bound (issue 35).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[Any, ...]


@dataclass
class Located:
    """One YAML document: its value, where it came from, and the line of every path in it."""

    value: Any
    source: str
    line: int
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int:
        """The line of ``path``, or of its nearest ancestor that has one (unknown keys, bad items)."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.line


class YamlError(ValueError):
    """A document that is not valid YAML (or uses unsafe tags); ``line`` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


#: The largest policy or settings file read (the chart's examples are under 10 kB).
MAX_BYTES = 1 << 20
#: The most values one document may expand to, aliases counted at every use (a policy has ~100).
MAX_VALUES = 100_000
#: The deepest nesting of collections in a document (a policy nests ~6 levels): PyYAML's
#: composer recurses a few frames per level, so a few hundred levels would exhaust the stack.
MAX_DEPTH = 64


class _Loader(yaml.SafeLoader):
    """The safe loader with its composer's recursion bounded by :data:`MAX_DEPTH`."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlError(f"nested deeper than {MAX_DEPTH} levels; refused", mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Budget:
    """Values left to build in one document."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.limit = limit

    def spend(self, node: yaml.Node) -> None:
        self.left -= 1
        if self.left < 0:
            raise YamlError(
                f"the document expands to more than {self.limit:,} values (aliases repeated inside aliases?); refused",
                node.start_mark.line + 1,
            )


def _build(node: yaml.Node, path: Path, lines: dict[Path, int], loader: yaml.SafeLoader, budget: _Budget) -> Any:
    budget.spend(node)
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves YAML merge keys (<<)
        out: dict[Any, Any] = {}
        for k_node, v_node in node.value:
            key = _build(k_node, path + ("<key>",), {}, loader, budget)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise YamlError("mapping keys must be scalars", k_node.start_mark.line + 1)
            if key in out:
                raise YamlError(f"duplicate key {key!r}", k_node.start_mark.line + 1)
            lines[path + (key,)] = k_node.start_mark.line + 1
            out[key] = _build(v_node, path + (key,), lines, loader, budget)
            lines[path + (key,)] = k_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, path + (i,), lines, loader, budget) for i, item in enumerate(node.value)]
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise YamlError(str(exc.problem or exc), node.start_mark.line + 1) from exc


def load_documents(text: str, source: str, *, max_values: int = MAX_VALUES) -> list[Located]:
    """Parse every document in ``text``; raise :class:`YamlError` with the line of a syntax error,
    a duplicate key, an unsafe tag, a document nested deeper than :data:`MAX_DEPTH` or one that
    expands past ``max_values``."""
    if len(text) > MAX_BYTES:
        raise YamlError(f"{len(text):,} characters, more than the {MAX_BYTES:,} a file may have; refused", 1)
    loader = _Loader(text)
    docs: list[Located] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[Path, int] = {}
            value = _build(node, (), lines, loader, _Budget(max_values))
            docs.append(Located(value, source, node.start_mark.line + 1, lines))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YamlError(str(exc.problem or exc), (mark.line + 1) if mark else 1) from exc
    except yaml.YAMLError as exc:
        raise YamlError(str(exc), 1) from exc
    finally:
        loader.dispose()
    return docs
