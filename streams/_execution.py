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

The engine's parts, each behind a small interface: this module is the
host's face (start, wait, cancel, host streams); :mod:`streams._tree` is what
the levels of one execution share (statuses, events, the failure latch, the
store's calls, node commits, stream endpoints from :mod:`streams._endpoints`);
:mod:`streams._level` runs the members of one graph; :mod:`streams._attempt`
is one member's attempt, from its inputs to its terminal status (a restored
one's in :mod:`streams._restore`); :mod:`streams._context` is what the
node's code and its aspects see (:mod:`streams._aspects`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.abc

from ._aliases import StreamPlan
from ._aspects import Aspect
from ._attempt import run_member
from ._checkpoint import ExecCheckpoint
from ._codec import codec_for
from ._context import NodeContext as NodeContext
from ._endpoints import GraphStream, stream_refs
from ._errors import (
    ExecutionCancelledError,
    GraphError,
    PayloadTypeError,
    RestorePlanError,
    SourceNotResumableError,
)
from ._events import Child as Child
from ._events import ExecutionEvent as ExecutionEvent
from ._events import ExecutionResult as ExecutionResult
from ._events import ExecutionSnapshot as ExecutionSnapshot
from ._events import ExecutionStatus
from ._events import Finished as Finished
from ._events import GraphStarted as GraphStarted
from ._events import NodeSnapshot as NodeSnapshot
from ._events import NodeStatus as NodeStatus
from ._events import Running as Running
from ._events import Waiting as Waiting
from ._graph import Graph
from ._keys import Key, NoValue, Stream, check_name
from ._level import HOST, Level, slots_for
from ._metrics import INSTRUMENTS
from ._partitions import PartitionedReader, PartitionedStream, PartitionedWriter, check_endpoint
from ._plan import RestoredNode, check_plan
from ._store._hooks import check_stream_hooks
from ._store._node_records import NodeCheckpoint
from ._store._records import StreamRef
from ._stream import ManagedStream, StreamReader, StreamWriter
from ._tracing import ATTR
from ._tree import Tree
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
        checkpoint: ExecCheckpoint | None = None,
        stream_capacity: int = 1024,
        host_readers: Mapping[Key[Any], Iterable[str]] | None = None,
        resumable_inputs: Iterable[Key[Any]] = (),
    ) -> None:
        if not isinstance(stream_capacity, int) or stream_capacity < 1:
            raise ValueError(f"stream_capacity must be at least 1, got {stream_capacity!r}")
        if checkpoint is not None and not isinstance(checkpoint, ExecCheckpoint):
            raise TypeError(f"checkpoint= takes an ExecCheckpoint(scope, hooks), got {checkpoint!r}")
        if not isinstance(graph, Graph):
            raise TypeError(f"Execution needs a Graph, got {graph!r}")
        graph.validate(checkpoint=checkpoint is not None)  # checkpoint mode: no cycle through a commit
        if checkpoint is not None and graph.has_streams():  # Key[Stream[T]] needs complete stream hooks
            check_stream_hooks(getattr(checkpoint.hooks, "streams", None))
        self.graph = graph
        self._inputs = _checked_inputs(graph, dict(inputs or {}))
        self._aspects = tuple(aspects)
        for aspect in self._aspects:
            if not callable(aspect):
                raise TypeError(f"an aspect is an async callable (ctx, proceed), got {aspect!r}")
        self._status: ExecutionStatus = "created"
        self._cancel_requested = False
        self._done = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._checkpoint = checkpoint
        self._plan: dict[str, RestoredNode] = {}
        self._records: tuple[NodeCheckpoint, ...] = ()
        self._plans = dict(graph.stream_plans())
        self._host_groups = _host_groups(graph, self._plans, dict(host_readers or {}))
        self._resumable_inputs = _resumable_inputs(graph, resumable_inputs)
        self._tree = Tree(
            graph.name,
            checkpoint,
            self._plans,
            on_event=on_event,
            stream_capacity=stream_capacity,
            resumable_inputs=self._resumable_inputs,
            spawn=self._spawn,
        )
        self._root = Level(
            self._tree,
            graph,
            (),
            self._aspects,
            slots_for(graph),
            runner=run_member,
            scope=checkpoint.scope if checkpoint else "",
            host_inlets=True,
        )
        for key, value in self._inputs.items():
            self._root.slots[key].settle(value)

    def restore_nodes(self, records: Iterable[NodeCheckpoint]) -> None:
        """Replace the recovery plan with ``records`` (confirmed nodes of the root graph), checked whole.

        Before :meth:`__aenter__` only, in checkpoint mode. On
        :class:`RestorePlanError` the previous plan stays. Restored nodes run
        nothing at start: their outputs are published and they emit Finished.
        """
        if self._checkpoint is None:
            raise RestorePlanError("restore_nodes needs checkpoint mode: Execution(..., checkpoint=...)")
        if self._status != "created":
            raise RestorePlanError("restore_nodes comes before the execution starts")
        records = tuple(records)
        self._plan = check_plan(self.graph, records, where=f"graph {self.graph.name!r}")
        self._records = records

    async def check_streams(self) -> None:
        """Before the start, in checkpoint mode: refuse to run a writer again on a stream it had begun.

        After :meth:`restore_nodes`: a writer node of the root graph that
        is not restored, did not promise to continue (``resumable=True``),
        and whose stream the store holds active would fail its open once
        the run is under way, after the nodes before it wrote. This asks the
        store first (``describe``, which changes nothing) and raises
        :class:`~streams.SourceNotResumableError` naming the node and the
        fix; a root stream input the host writes is checked against
        ``resumable_inputs`` the same way. Writers inside Sub mounts are
        checked when they open their streams.
        """
        if self._checkpoint is None:
            return
        hooks, scope = self._checkpoint.hooks.streams, self._checkpoint.scope
        for (path, name), plan in self._plans.items():
            if path or plan.path or plan.key.name != name:
                continue
            if plan.writer is not None:
                if plan.writer.resumable or plan.writer.name in self._plan:
                    continue
                ref = StreamRef(scope, plan.writer.name, name)
                who = f"node {plan.writer.name!r} of graph {self.graph.name!r}"
                fix = "declare it resumable=True (it continues from writer.position)"
            elif plan.key in self.graph.inputs:
                if plan.key in self._resumable_inputs:
                    continue
                ref, who = StreamRef(scope, HOST, name), "the host"
                fix = f"name {plan.key!r} in resumable_inputs (the host continues from writer.position)"
            else:
                continue
            for part in stream_refs(ref, plan.key):
                held = await hooks.describe(part)
                if held is not None and not (held.finished or held.failed):
                    raise SourceNotResumableError(
                        f"{who} had begun writing stream {part} (active at sequence {held.appended}) and "
                        f"would write it again from the start: {fix} to resume run {scope!r}; nothing was "
                        "written"
                    )

    def __repr__(self) -> str:
        return f"Execution({self.graph.name!r}, status={self._status!r})"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Execution:
        if self._status != "created":
            raise RuntimeError(f"{self!r} was started already; make a new Execution to run again")
        if self._checkpoint is not None:  # revalidated against the definition as it is now
            self.graph.validate(checkpoint=True)
            self._root.plan = check_plan(self.graph, self._records, where=f"graph {self.graph.name!r}")
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
        if self._tree.failure is not None:
            raise self._tree.failure
        if self._status == "cancelled":
            raise ExecutionCancelledError(f"execution of graph {self.graph.name!r} was cancelled")
        return self.result()

    def cancel(self) -> None:
        """Cancel every running node; :meth:`wait` then raises :class:`ExecutionCancelledError`."""
        self._cancel_requested = True
        self._tree.disturb()  # no level takes an earlier finding that it was not cancelled
        if self._tree.scope is not None:
            self._tree.scope.cancel()

    def result(self) -> ExecutionResult:
        """The root graph's settled keys and the nodes' statuses so far."""
        values = {key: slot.value for key, slot in self._root.slots.items() if slot.settled}
        return ExecutionResult(values, dict(self._tree.statuses))

    def snapshot(self) -> ExecutionSnapshot:
        """Statuses of the execution and of every node created so far, with no values."""
        statuses = self._tree.statuses.items()
        nodes = tuple(NodeSnapshot(where[:-1], where[-1], status) for where, status in statuses)
        return ExecutionSnapshot(self.graph.name, self._status, nodes)

    async def host_writer(self, key: Key[Stream[T]]) -> StreamWriter[T]:
        """The writer of stream input ``key`` of the root graph, which the host writes.

        Waits until the stream is open (the execution opens it when it
        starts). The same rules hold as for a writer node: every message is
        confirmed before a reader sees it, ``send_at`` positions are kept,
        and a host that continues after a restart must have promised it
        (``resumable_inputs``) and goes on from ``writer.position``. The
        host ends the stream with ``await writer.finish()`` (or ``fail()``).
        """
        self._host_input(key, partitioned=False)
        stream = await self._root_stream(key)
        assert isinstance(stream, ManagedStream)
        return stream.writer()

    async def host_partitioned_writer(self, key: Key[Stream[T]]) -> PartitionedWriter[T]:
        """The writer of partitioned stream input ``key`` of the root graph: :meth:`host_writer`'s rules,
        each message sent to its key's partition (:class:`~streams.PartitionedWriter`)."""
        self._host_input(key, partitioned=True)
        stream = await self._root_stream(key)
        assert isinstance(stream, PartitionedStream)
        return stream.writer()

    def _host_input(self, key: Key[Any], *, partitioned: bool) -> None:
        if not (key.is_stream and key in self.graph.inputs):
            raise GraphError(
                f"{key!r} is not a stream input of graph {self.graph.name!r}: only those have a host writer"
            )
        check_endpoint(key, partitioned, "host_writer", "host_partitioned_writer")

    async def host_reader(self, key: Key[Stream[T]], group: str) -> StreamReader[T]:
        """A reader of outlet ``key`` of the root graph in the host's consumer group ``group``.

        The group was given in ``host_readers`` before the start. Waits until
        the stream's writer opened it; read it with
        :func:`~streams.handle_messages` (acknowledgements confirmed in the
        store, in the host's own task and contexts) or ``receive``/``ack``.
        """
        self._host_group(key, group, partitioned=False)
        stream = await self._root_stream(key)
        assert isinstance(stream, ManagedStream)
        return stream.reader(group)

    async def host_partitioned_reader(self, key: Key[Stream[T]], group: str) -> PartitionedReader[T]:
        """The readers of partitioned outlet ``key`` in the host's group ``group``, one per partition
        (:meth:`host_reader`'s rules): give it to :func:`~streams.handle_messages`."""
        self._host_group(key, group, partitioned=True)
        stream = await self._root_stream(key)
        assert isinstance(stream, PartitionedStream)
        return stream.reader(group)

    def _host_group(self, key: Key[Any], group: str, *, partitioned: bool) -> None:
        if group not in self._host_groups.get(key, ()):
            raise GraphError(
                f"{key!r} has no host group {group!r} in this execution: name it in "
                f"Execution(host_readers={{{key!r}: [{group!r}]}})"
            )
        check_endpoint(key, partitioned, "host_reader", "host_partitioned_reader")

    async def _root_stream(self, key: Key[Any]) -> GraphStream:
        """The root's endpoint of stream ``key``, once open; the execution's failure if it ended first."""
        if self._status == "created":
            raise RuntimeError("start the execution first: `async with execution:`")
        slot = self._root.slots[key]
        if not slot.settled:
            async with anyio.create_task_group() as tg:

                async def until(event: anyio.Event) -> None:
                    await event.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(until, slot.arrived)
                tg.start_soon(until, self._done)
        if not isinstance(slot.value, (ManagedStream, PartitionedStream)):
            if self._tree.failure is not None:
                raise self._tree.failure
            raise ExecutionCancelledError(
                f"execution of graph {self.graph.name!r} ended before stream {key!r} was open"
            )
        return slot.value

    def checkpoint_inputs(self) -> dict[Key[Any], Any]:
        """The external inputs actually supplied (values as read back, ``NoValue`` for skipped ones)."""
        return dict(self._inputs)

    # -- internals -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            scope = self._tree.scope = anyio.CancelScope()
            with scope:
                if self._cancel_requested:
                    scope.cancel()
                await self._root.run()
        except Exception as exc:  # the root graph's first failure
            if self._tree.failure is None:
                self._tree.failure = exc
        finally:
            if self._tree.failure is not None:
                self._status = "failed"
            elif self._cancel_requested or any(s == "cancelled" for s in self._tree.statuses.values()):
                self._status = "cancelled"
            else:
                self._status = "completed"
            INSTRUMENTS.executions.add(1, {ATTR.GRAPH: self.graph.name, ATTR.EXECUTION_STATUS: self._status})
            self._done.set()

    def _spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fn`` (a stream's background confirmations) in the execution's task group."""
        assert self._task_group is not None
        self._task_group.start_soon(fn)

    def streams(self) -> dict[StreamRef, ManagedStream[Any]]:
        """Every stream endpoint the execution opened so far, by identity."""
        return dict(self._tree.endpoints.streams)

    @property
    def _endpoints(self) -> dict[StreamRef, GraphStream]:
        """One endpoint per stream key of the tree (a partitioned stream's over its partitions)."""
        return self._tree.endpoints.by_ref


def _checked_inputs(graph: Graph, given: dict[Key[Any], Any]) -> dict[Key[Any], Any]:
    problems = []
    for key in given:
        if not isinstance(key, Key) or key not in graph.inputs:
            problems.append(f"{key!r} is not an input of graph {graph.name!r}")
        elif key.is_stream:
            problems.append(
                f"input {key!r} of the root graph is a stream: the host writes it once the execution "
                "started (`await execution.host_writer(key)`); it takes no value"
            )
    for key in graph.inputs:
        if key not in given and not key.is_stream:
            problems.append(f"input {key!r} was not given (give NoValue to skip it)")
    if problems:
        raise GraphError(f"graph {graph.name!r}: " + "; ".join(problems), problems=tuple(problems))
    checked: dict[Key[Any], Any] = {}
    for key in graph.inputs:
        if key.is_stream:
            continue
        value = given[key]
        if value is NoValue:
            checked[key] = NoValue
            continue
        try:
            checked[key], _ = codec_for(key.type).prepare(value, what=f"input {key!r}")
        except PayloadTypeError as exc:
            raise GraphError(str(exc)) from None
    return checked


def _host_groups(
    graph: Graph, plans: dict[tuple[tuple[str, ...], str], StreamPlan], given: dict[Key[Any], Iterable[str]]
) -> dict[Key[Any], tuple[str, ...]]:
    """Check ``host_readers`` and add the host's groups to the streams' plans; every outlet has a reader.

    Before the start, as the seed's BeforeStart subscriptions: a declared
    outlet that no node reads and no host group reads is refused here.
    """
    problems: list[str] = []
    groups: dict[Key[Any], tuple[str, ...]] = {}
    refused: set[Key[Any]] = set()
    for key, names in given.items():
        if not isinstance(key, Key) or key not in graph.outlets:
            problems.append(f"host_readers names {key!r}, which is not an outlet of graph {graph.name!r}")
            continue
        chosen = tuple(names) if not isinstance(names, str) else (names,)
        plan = plans[((), key.name)]
        for group in chosen:
            check_name(group, f"a host group of {key!r}")
        twice = sorted({g for g in chosen if g in plan.groups or chosen.count(g) > 1})
        for group in twice:
            problems.append(f"group {group!r} of {key!r} is named twice (a node's group is its path)")
        if twice:
            refused.add(key)
            continue
        widened = dataclasses.replace(plan, groups=(*plan.groups, *chosen))
        for alias, other in list(plans.items()):
            if other is plan:
                plans[alias] = widened
        groups[key] = chosen
    for key in graph.outlets:
        if key in refused:  # its host groups were named twice, said above
            continue
        if key.is_stream and ((), key.name) in plans and not plans[((), key.name)].groups:
            problems.append(
                f"outlet {key!r} of graph {graph.name!r} has no reader: no node reads it and no host group "
                f"is given (Execution(host_readers={{{key!r}: ['...']}}))"
            )
    if problems:
        raise GraphError(f"graph {graph.name!r}: " + "; ".join(problems), problems=tuple(problems))
    return groups


def _resumable_inputs(graph: Graph, keys: Iterable[Key[Any]]) -> frozenset[Key[Any]]:
    """The stream inputs whose host promised to continue from ``writer.position`` after a restart."""
    chosen = frozenset(keys)
    for key in chosen:
        if not (isinstance(key, Key) and key.is_stream and key in graph.inputs):
            problem = f"resumable_inputs names {key!r}, which is not a stream input of graph {graph.name!r}"
            raise GraphError(problem, problems=(problem,))
    return chosen


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
