"""The streams of a graph tree: each one's writer, its aliases across Sub wiring, and its readers' groups.

A stream key of one graph level and the keys Sub wiring joins it to (an
inlet forwards it into a child, an outlet exposes a child's key in the
parent) are aliases of one stream. Each stream has one writer node and as
many consumer groups as nodes that read it under any alias, each named by
the reader's path from the root (``shipping/packing/pack``). The graph
computes them (:meth:`~streams.Graph.stream_plans`); this module holds
what a plan is, and imports no graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ._keys import Key

__all__ = ["Alias", "StreamPlan", "Writer"]

Alias = tuple[tuple[str, ...], str]  # (the path of a graph level, a stream key's name there)


class Writer(Protocol):
    """What a plan knows of a stream's writer node (a :class:`~streams._graph.NodeDef`)."""

    @property
    def name(self) -> str: ...

    @property
    def resumable(self) -> bool: ...


@dataclass(frozen=True)
class StreamPlan:
    """One stream of the tree: where its writer is, and every group that reads it."""

    path: tuple[str, ...]  # the writer's graph level
    writer: Writer | None  # None: no node writes it (a root input, refused by Execution)
    key: Key[Any]  # the writer's key
    groups: tuple[str, ...]

    def groups_under(self, path: tuple[str, ...]) -> list[str]:
        """The groups of the readers inside the mount at ``path``."""
        prefix = "/".join(path) + "/"
        return [group for group in self.groups if group.startswith(prefix)]
