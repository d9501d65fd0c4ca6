"""Executions: running a graph's nodes as their inputs arrive, with immediate Set and Skip.

An :class:`Execution` runs a validated :class:`~streams.Graph` on its inputs.
Each node waits for the keys it requires, then runs its aspect chain and
function with a :class:`NodeContext`; ``ctx.set(key, value)`` and
``ctx.skip(key)`` publish at once, so a node downstream starts as soon as
everything it requires has arrived. When a node returns, the keys it provides
but did not set are skipped. A node whose required keys were all skipped is
skipped without running; a node that calls ``ctx.skip_node()`` is skipped
with what it set. The first node to fail cancels the rest, and
:meth:`Execution.wait` raises its error.

A Sub mount runs a child execution of its graph: inlets feed the child's
inputs as the wired keys arrive (a child node waits only for its own), fixed
values are there from the start, and outlets publish the child's keys in the
parent as the child sets them.

This is ordinary mode: nothing is confirmed anywhere, and a retried node
cannot set again a key its failed attempt already published.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import anyio
import anyio.abc

from ._aspects import Aspect, chain
from ._codec import codec_for
from ._errors import ExecutionCancelledError, GraphError, OutputError, PayloadTypeError, SkippedInputError
from ._graph import Graph, NodeDef, SubDef
from ._keys import Key, NoValue, NoValueType
from ._unwrap import single_error

__all__ = [
    "Child",
    "Execution",
    "ExecutionEvent",
    "ExecutionResult",
    "ExecutionSnapshot",
    "Finished",
    "GraphStarted",
    "NodeContext",
    "NodeSnapshot",
    "NodeStatus",
    "Running",
    "Waiting",
    "run_graph",
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


class _NodeSkipped(BaseException):
    """``ctx.skip_node()``: a normal skip, not a failure, so no aspect retries or catches it as one."""


_UNSET: Final = object()


class _Slot:
    """One key of one graph level: settled once, with a value or ``NoValue``."""

    __slots__ = ("arrived", "listeners", "value")

    def __init__(self) -> None:
        self.arrived = anyio.Event()
        self.value: Any = _UNSET
        self.listeners: list[Callable[[Any], None]] = []

    @property
    def settled(self) -> bool:
        return self.value is not _UNSET

    def settle(self, value: Any) -> None:
        self.value = value
        self.arrived.set()
        for listener in self.listeners:
            listener(value)

    def on_settle(self, listener: Callable[[Any], None]) -> None:
        if self.settled:
            listener(self.value)
        else:
            self.listeners.append(listener)


class NodeContext:
    """What a node's function and aspects see: its inputs, and Set/Skip for what it provides."""

    __slots__ = ("_level", "_member")

    def __init__(self, level: _Level, member: NodeDef | SubDef) -> None:
        self._level = level
        self._member = member

    @property
    def node(self) -> str:
        return self._member.name

    @property
    def path(self) -> tuple[str, ...]:
        """The mount names from the root execution to this node's graph."""
        return self._level.path

    def __repr__(self) -> str:
        return f"NodeContext({'/'.join((*self.path, self.node))})"

    def __getitem__(self, key: Key[T]) -> T:
        """The value of a required key; :class:`SkippedInputError` if it was skipped."""
        value = self.get(key)
        if value is NoValue:
            raise SkippedInputError(f"node {self.node!r}: input {key!r} was skipped")
        return value  # type: ignore[return-value]

    def get(self, key: Key[T]) -> T | NoValueType:
        """The value of a required key, or ``NoValue`` if it was skipped."""
        if key not in self._member.requires:
            raise KeyError(f"node {self.node!r} does not require {key!r}")
        slot = self._level.slots[key]
        if not slot.settled:  # a Sub mount reads its inlets live; a node never gets here
            raise KeyError(f"node {self.node!r}: {key!r} has not arrived yet")
        value: T | NoValueType = slot.value
        return value

    def set(self, key: Key[T], value: T) -> None:
        """Publish ``value`` for ``key`` (read back as its type; downstream sees the copy)."""
        slot = self._writable(key, "set")
        copy, _ = codec_for(key.type).prepare(value, what=f"{key!r} of node {self.node!r}")
        slot.settle(copy)

    def skip(self, key: Key[Any]) -> None:
        """Publish ``key`` as skipped: nodes requiring it see ``NoValue``."""
        self._writable(key, "skip").settle(NoValue)

    def skip_node(self) -> None:
        """End the node here as skipped (not failed): what it did not set is skipped."""
        raise _NodeSkipped

    def _writable(self, key: Key[Any], what: str) -> _Slot:
        if key not in self._member.provides:
            raise OutputError(f"node {self.node!r} cannot {what} {key!r}: it does not provide it")
        slot = self._level.slots[key]
        if slot.settled:
            raise OutputError(
                f"node {self.node!r} cannot {what} {key!r}: it was already published (in ordinary mode "
                "a key is published when set, and a retried attempt cannot set it again)"
            )
        return slot


def _slots_for(graph: Graph) -> dict[Key[Any], _Slot]:
    keys = [*graph.inputs, *(key for member in graph.members for key in member.provides)]
    return {key: _Slot() for key in keys}


class _Level:
    """The nodes of one graph of the tree (the root's, or a Sub mount's child) running together."""

    def __init__(
        self,
        execution: Execution,
        graph: Graph,
        path: tuple[str, ...],
        ambient: tuple[Aspect, ...],
        slots: dict[Key[Any], _Slot],
    ) -> None:
        self.execution = execution
        self.graph = graph
        self.path = path
        self.ambient = ambient
        self.slots = slots

    async def run(self) -> None:
        self.execution._emit(GraphStarted(self.path, self.graph.name))
        async with anyio.create_task_group() as tg:
            for member in self.graph.members:
                self.execution._status_of[(*self.path, member.name)] = "waiting"
                tg.start_soon(self._member, member)

    async def _member(self, member: NodeDef | SubDef) -> None:
        execution, where = self.execution, (*self.path, member.name)
        execution._emit(Waiting(self.path, member.name))
        if isinstance(member, NodeDef):
            for key in member.requires:
                await self.slots[key].arrived.wait()
            if member.requires and all(self.slots[k].value is NoValue for k in member.requires):
                self._finish(member, "skipped")
                return
        execution._status_of[where] = "running"
        execution._emit(Running(self.path, member.name))
        ctx = NodeContext(self, member)
        if isinstance(member, NodeDef):
            fn = member.fn

            async def body() -> None:
                await fn(ctx)

        else:

            async def body() -> None:
                await self._run_sub(member, ctx)

        aspects = (*self.ambient, *member.aspects)
        try:
            await chain(aspects, ctx, body)()
        except _NodeSkipped:
            self._finish(member, "skipped")
        except anyio.get_cancelled_exc_class():
            self._finish(member, "cancelled", settle=False)
            raise
        except Exception as exc:
            self._finish(member, "failed", settle=False)
            execution._fail(exc, where)
        else:
            self._finish(member, "completed")

    def _finish(self, member: NodeDef | SubDef, status: NodeStatus, *, settle: bool = True) -> None:
        if settle:
            for key in member.provides:
                slot = self.slots[key]
                if not slot.settled:
                    slot.settle(NoValue)
        self.execution._status_of[(*self.path, member.name)] = status
        self.execution._emit(Finished(self.path, member.name, status))

    async def _run_sub(self, mount: SubDef, ctx: NodeContext) -> None:
        self.execution._emit(Child(self.path, mount.name))
        slots = _slots_for(mount.graph)
        for key, value in mount.fixed:
            slots[key].settle(value)
        for child_key, parent_key in mount.inlets:
            self.slots[parent_key].on_settle(_feed(slots[child_key]))
        for child_key, parent_key in mount.outlets:
            slots[child_key].on_settle(_expose(ctx, parent_key))
        ambient = () if mount.without_aspects else self.ambient
        await _Level(self.execution, mount.graph, (*self.path, mount.name), ambient, slots).run()


def _feed(slot: _Slot) -> Callable[[Any], None]:
    def feed(value: Any) -> None:
        if not slot.settled:
            slot.settle(value)

    return feed


def _expose(ctx: NodeContext, key: Key[Any]) -> Callable[[Any], None]:
    def expose(value: Any) -> None:
        if value is NoValue:
            ctx.skip(key)
        else:
            ctx._writable(key, "set").settle(value)  # already read back in the child

    return expose


class Execution:
    """One run of ``graph`` on ``inputs``; see the module docstring.

    ``inputs`` gives every input the graph declares a value (or ``NoValue``
    to skip it). ``aspects`` wrap every node of the tree, outermost, except
    inside Sub mounts made ``without_aspects``. ``on_event`` is called on the
    event loop with each :data:`ExecutionEvent`; what it raises fails the
    execution. Start it with ``async with``, then ``await wait()``; leaving
    the block cancels what is still running. :func:`run_graph` does both.
    """

    def __init__(
        self,
        graph: Graph,
        inputs: Mapping[Key[Any], Any] | None = None,
        *,
        aspects: Iterable[Aspect] = (),
        on_event: Callable[[ExecutionEvent], None] | None = None,
    ) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"Execution needs a Graph, got {graph!r}")
        graph.validate()
        self.graph = graph
        self._inputs = _checked_inputs(graph, dict(inputs or {}))
        self._aspects = tuple(aspects)
        for aspect in self._aspects:
            if not callable(aspect):
                raise TypeError(f"an aspect is an async callable (ctx, proceed), got {aspect!r}")
        self._on_event = on_event
        self._status: ExecutionStatus = "created"
        self._status_of: dict[tuple[str, ...], NodeStatus] = {}
        self._failure: BaseException | None = None
        self._cancel_requested = False
        self._scope: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._root = _Level(self, graph, (), self._aspects, _slots_for(graph))
        for key, value in self._inputs.items():
            self._root.slots[key].settle(value)

    def __repr__(self) -> str:
        return f"Execution({self.graph.name!r}, status={self._status!r})"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Execution:
        if self._status != "created":
            raise RuntimeError(f"{self!r} was started already; make a new Execution to run again")
        self._status = "running"
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._run)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if not self._done.is_set():
            self.cancel()
        assert self._task_group is not None
        with single_error():  # the block's own exception goes on as it is, never inside a group
            await self._task_group.__aexit__(None, None, None)
        return None

    async def wait(self) -> ExecutionResult:
        """Wait until every node finished; the result, or the first node's error, or a cancellation."""
        if self._status == "created":
            raise RuntimeError("start the execution first: `async with execution:`")
        await self._done.wait()
        if self._failure is not None:
            raise self._failure
        if self._status == "cancelled":
            raise ExecutionCancelledError(f"execution of graph {self.graph.name!r} was cancelled")
        return self.result()

    def cancel(self) -> None:
        """Cancel every running node; :meth:`wait` then raises :class:`ExecutionCancelledError`."""
        self._cancel_requested = True
        if self._scope is not None:
            self._scope.cancel()

    def result(self) -> ExecutionResult:
        """The root graph's settled keys and the nodes' statuses so far."""
        values = {key: slot.value for key, slot in self._root.slots.items() if slot.settled}
        return ExecutionResult(values, dict(self._status_of))

    def snapshot(self) -> ExecutionSnapshot:
        """Statuses of the execution and of every node created so far, with no values."""
        statuses = self._status_of.items()
        nodes = tuple(NodeSnapshot(where[:-1], where[-1], status) for where, status in statuses)
        return ExecutionSnapshot(self.graph.name, self._status, nodes)

    def checkpoint_inputs(self) -> dict[Key[Any], Any]:
        """The external inputs actually supplied (values as read back, ``NoValue`` for skipped ones)."""
        return dict(self._inputs)

    # -- internals -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            with anyio.CancelScope() as self._scope:
                if self._cancel_requested:
                    self._scope.cancel()
                await self._root.run()
        finally:
            if self._failure is not None:
                self._status = "failed"
            elif self._cancel_requested or any(s == "cancelled" for s in self._status_of.values()):
                self._status = "cancelled"
            else:
                self._status = "completed"
            self._done.set()

    def _fail(self, exc: BaseException, where: tuple[str, ...]) -> None:
        if self._failure is None:
            exc.add_note(f"in node {'/'.join(where)!r} of graph {self.graph.name!r}")
            self._failure = exc
        if self._scope is not None:
            self._scope.cancel()

    def _emit(self, event: ExecutionEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception as exc:
            self._fail(exc, (*event.path, getattr(event, "node", "")))


def _checked_inputs(graph: Graph, given: dict[Key[Any], Any]) -> dict[Key[Any], Any]:
    problems = []
    for key in given:
        if not isinstance(key, Key) or key not in graph.inputs:
            problems.append(f"{key!r} is not an input of graph {graph.name!r}")
    for key in graph.inputs:
        if key not in given:
            problems.append(f"input {key!r} was not given (give NoValue to skip it)")
    if problems:
        raise GraphError(f"graph {graph.name!r}: " + "; ".join(problems), problems=tuple(problems))
    checked: dict[Key[Any], Any] = {}
    for key in graph.inputs:
        value = given[key]
        if value is NoValue:
            checked[key] = NoValue
            continue
        try:
            checked[key], _ = codec_for(key.type).prepare(value, what=f"input {key!r}")
        except PayloadTypeError as exc:
            raise GraphError(str(exc)) from None
    return checked


async def run_graph(
    graph: Graph,
    inputs: Mapping[Key[Any], Any] | None = None,
    *,
    aspects: Iterable[Aspect] = (),
    on_event: Callable[[ExecutionEvent], None] | None = None,
) -> ExecutionResult:
    """Run ``graph`` on ``inputs`` to the end: ``Execution`` started and waited for."""
    async with Execution(graph, inputs, aspects=aspects, on_event=on_event) as execution:
        return await execution.wait()
