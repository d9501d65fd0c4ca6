"""What a host can see of an execution: lifecycle events, snapshots, the result; never a value but the
result's.

Each node of the tree goes through ``Waiting``, ``Running`` (unless it is
skipped without running or restored) and one ``Finished`` with its terminal
:data:`NodeStatus`; a level (the root graph, or a Sub mount's child) starts
with ``GraphStarted``, and a Sub mount announces its child with ``Child``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ._errors import SkippedInputError
from ._keys import Key, NoValue, NoValueType

__all__ = [
    "Child",
    "ExecutionEvent",
    "ExecutionResult",
    "ExecutionSnapshot",
    "ExecutionStatus",
    "Finished",
    "GraphStarted",
    "NodeSnapshot",
    "NodeStatus",
    "Running",
    "Waiting",
]

T = TypeVar("T")
NodeStatus = Literal["waiting", "running", "completed", "skipped", "failed", "cancelled"]
ExecutionStatus = Literal["created", "running", "completed", "failed", "cancelled"]


# -- lifecycle events (what a host can observe; never values) ----------------------------------


@dataclass(frozen=True)
class GraphStarted:
    """An execution (the root, or the child of a Sub mount at ``path``) started its nodes."""

    path: tuple[str, ...]
    graph: str


@dataclass(frozen=True)
class Waiting:
    """Node ``node`` of the graph at ``path`` waits for the keys it requires."""

    path: tuple[str, ...]
    node: str


@dataclass(frozen=True)
class Running:
    """Node ``node`` has its inputs and runs its aspect chain and function."""

    path: tuple[str, ...]
    node: str


@dataclass(frozen=True)
class Child:
    """Sub mount ``node`` created its child execution (at ``path + (node,)``)."""

    path: tuple[str, ...]
    node: str


@dataclass(frozen=True)
class Finished:
    """Node ``node`` reached its terminal status; emitted once per node."""

    path: tuple[str, ...]
    node: str
    status: NodeStatus


ExecutionEvent = GraphStarted | Waiting | Running | Child | Finished


@dataclass(frozen=True)
class NodeSnapshot:
    path: tuple[str, ...]
    node: str
    status: NodeStatus


@dataclass(frozen=True)
class ExecutionSnapshot:
    """Where an execution stands: statuses only, no values; not a recovery plan."""

    graph: str
    status: ExecutionStatus
    nodes: tuple[NodeSnapshot, ...]


@dataclass(frozen=True)
class ExecutionResult:
    """The keys of the root graph (its inputs and what its nodes provided) and every node's status."""

    values: Mapping[Key[Any], Any]
    statuses: Mapping[tuple[str, ...], NodeStatus]

    def __getitem__(self, key: Key[T]) -> T:
        value = self.get(key)
        if value is NoValue:
            raise SkippedInputError(f"{key!r} was skipped")
        return value  # type: ignore[return-value]

    def get(self, key: Key[T]) -> T | NoValueType:
        """The key's value, or ``NoValue`` if it was skipped; ``KeyError`` if the graph has no such key."""
        if key not in self.values:
            raise KeyError(f"the graph has no key {key!r}")
        value: T | NoValueType = self.values[key]
        return value
