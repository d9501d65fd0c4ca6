"""The streams of a graph tree: each one's writer, its aliases across Sub wiring, and its readers' groups.

A stream key of one graph level and the keys Sub wiring joins it to (an
inlet forwards it into a child, an outlet exposes a child's key in the
parent) are aliases of one stream. Each stream has one writer node and as
many consumer groups as nodes that read it under any alias, each named by
the reader's path from the root (``shipping/packing/pack``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._keys import Key

if TYPE_CHECKING:
    from ._graph import Graph, NodeDef

__all__ = ["StreamPlan", "stream_plans"]

Alias = tuple[tuple[str, ...], str]  # (the path of a graph level, a stream key's name there)


@dataclass(frozen=True)
class StreamPlan:
    """One stream of the tree: where its writer is, and every group that reads it."""

    path: tuple[str, ...]  # the writer's graph level
    writer: NodeDef | None  # None: no node writes it (a root input, refused by Execution)
    key: Key[Any]  # the writer's key
    groups: tuple[str, ...]

    def groups_under(self, path: tuple[str, ...]) -> list[str]:
        """The groups of the readers inside the mount at ``path``."""
        prefix = "/".join(path) + "/"
        return [group for group in self.groups if group.startswith(prefix)]


def stream_plans(root: Graph) -> dict[Alias, StreamPlan]:
    """Every alias of every stream of the tree, mapped to the stream's plan."""
    from ._graph import NodeDef

    parent: dict[Alias, Alias] = {}

    def find(alias: Alias) -> Alias:
        while parent.setdefault(alias, alias) != alias:
            parent[alias] = parent[parent[alias]]
            alias = parent[alias]
        return alias

    writers: dict[Alias, tuple[tuple[str, ...], NodeDef, Key[Any]]] = {}
    readers: dict[Alias, list[str]] = {}
    keys: dict[Alias, Key[Any]] = {}
    for path, graph in _levels(root, ()):
        for key in graph.inputs:
            if key.is_stream:
                keys[(path, key.name)] = key
                find((path, key.name))
        for member in graph._members:
            if isinstance(member, NodeDef):
                for key in member.requires:
                    if key.is_stream:
                        readers.setdefault((path, key.name), []).append("/".join((*path, member.name)))
                        keys[(path, key.name)] = key
                        find((path, key.name))
                for key in member.streams:
                    writers[(path, key.name)] = (path, member, key)
                    keys[(path, key.name)] = key
                    find((path, key.name))
                continue
            inner = (*path, member.name)
            for child, outer in (*member.inlets, *member.outlets):
                if child.is_stream and outer.is_stream:
                    keys.setdefault((path, outer.name), outer)
                    keys.setdefault((inner, child.name), child)
                    parent[find((inner, child.name))] = find((path, outer.name))
    members: dict[Alias, list[Alias]] = {}
    for alias in list(parent):
        members.setdefault(find(alias), []).append(alias)
    plans: dict[Alias, StreamPlan] = {}
    for aliases in members.values():
        written = [writers[a] for a in aliases if a in writers]
        groups = tuple(group for a in sorted(aliases) for group in readers.get(a, ()))
        if written:
            path, writer, key = written[0]
            plan = StreamPlan(path, writer, key, groups)
        else:
            first = min(aliases)
            plan = StreamPlan(first[0], None, keys[first], groups)
        for alias in aliases:
            plans[alias] = plan
    return plans


def _levels(graph: Graph, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Graph]]:
    from ._graph import SubDef

    yield path, graph
    for member in graph._members:
        if isinstance(member, SubDef):
            yield from _levels(member.graph, (*path, member.name))
