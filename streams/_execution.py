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

import contextlib
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from ._aliases import StreamPlan
from ._aspects import Aspect, chain
from ._checkpoint import ExecCheckpoint
from ._codec import codec_for
from ._context import NodeContext, NodeSkipped, Slot, WriteSet
from ._errors import (
    CheckpointError,
    CheckpointScopeFailure,
    ConfirmedFailureError,
    ExecutionCancelledError,
    GraphError,
    OutputError,
    PayloadTypeError,
    RestorePlanError,
    SkippedInputError,
    SourceNotResumableError,
    StrayCancellationError,
    StreamClosedError,
)
from ._graph import Graph, NodeDef, SubDef
from ._keys import Key, NoValue, NoValueType, Stream, check_name
from ._metrics import INSTRUMENTS
from ._node_commits import NodeCommits, StagedNode
from ._node_spans import node_attempt
from ._outcome import accept, interrupted, is_fault
from ._partitions import (
    PartitionedReader,
    PartitionedStream,
    PartitionedWriter,
    check_endpoint,
    partitions_of,
)
from ._plan import RestoredNode, check_plan, encode_outputs
from ._store._hooks import CheckpointHooks, StreamHooks, check_stream_hooks
from ._store._layouts import StreamDescriptor
from ._store._memory import MemoryStore
from ._store._node_records import (
    COMPLETE_CHAIN,
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointCommit,
    CheckpointOutput,
    Conclusion,
    NodeCheckpoint,
    Terminal,
)
from ._store._nodes import destination_template, enclosing_scope
from ._store._records import StreamFinish, StreamOpen, StreamOpened, StreamRef
from ._stream import ManagedStream, StreamCore, StreamReader, StreamWriter
from ._tracing import ATTR
from ._type_names import qualified_type_name, type_name
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
#: The endpoint of a stream key in the tree: a stream, or a partitioned stream over its partitions.
GraphStream = ManagedStream[Any] | PartitionedStream[Any]
#: The node name of the streams a host writes (the root's stream inputs): ``{scope}/host/{key}``.
HOST = "host"
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


def _slots_for(graph: Graph) -> dict[Key[Any], Slot]:
    keys = [*graph.inputs, *(key for member in graph._members for key in member.provides)]
    return {key: Slot() for key in keys}


class _Level:
    """The nodes of one graph of the tree (the root's, or a Sub mount's child) running together."""

    def __init__(
        self,
        execution: Execution,
        graph: Graph,
        path: tuple[str, ...],
        ambient: tuple[Aspect, ...],
        slots: dict[Key[Any], Slot],
        *,
        scope: str = "",
        plan: Mapping[str, RestoredNode] | None = None,
    ) -> None:
        self.execution = execution
        self.graph = graph
        self.path = path
        self.ambient = ambient
        self.slots = slots
        self.scope = scope  # the execution scope in checkpoint mode ("" in ordinary mode)
        self.plan = dict(plan or {})
        self.failure: BaseException | None = None
        self._cancel: anyio.CancelScope | None = None
        self._status_attributes: dict[str, dict[str, str]] = {}

    @property
    def stream_scope(self) -> str:
        """The scope of the streams this level's nodes write: its checkpoint scope, or its path."""
        return self.scope or "/".join(("execution", *self.path))

    def fail(self, exc: BaseException, where: tuple[str, ...]) -> None:
        """A node of this level failed: cancel its other nodes; :meth:`run` raises ``exc`` to the mount."""
        if self.failure is None:
            noted = self.execution._noted
            if not any(exc is seen for seen in noted):  # named where it arose, not again at each mount
                noted.append(exc)
                exc.add_note(f"in node {'/'.join(where)!r} of graph {self.execution.graph.name!r}")
            self.failure = exc
        if self._cancel is not None:
            self._cancel.cancel()

    async def run(self) -> None:
        self.execution._emit(GraphStarted(self.path, self.graph.name))
        try:
            async with anyio.create_task_group() as tg:
                self._cancel = tg.cancel_scope
                if self is self.execution._root:
                    for key in self.graph.inputs:
                        if key.is_stream:
                            tg.start_soon(self._open_host_inlet, key)
                for member in self.graph._members:
                    self.execution._status_of[(*self.path, member.name)] = "waiting"
                    tg.start_soon(self._member, member)
        finally:
            if self.scope:  # the records its nodes staged land (or fail) before the level ends
                await self.execution._node_commits.settle()
        if self.failure is not None:  # the first failure of this graph, to its mount (or the execution)
            raise self.failure

    async def _open_host_inlet(self, key: Key[Any]) -> None:
        """Open a stream input of the root, which the host writes: its readers get it as from a writer."""
        ref = StreamRef(self.stream_scope, HOST, key.name)
        with contextlib.suppress(CheckpointError):  # latched: the execution fails with it
            self.slots[key].settle(
                await self.execution._endpoint(ref, self.stream_plan(key), self.scope, host=True)
            )

    async def _member(self, member: NodeDef | SubDef) -> None:
        execution, where = self.execution, (*self.path, member.name)
        restored = self.plan.get(member.name)
        if restored is not None:  # no body, no aspects, no commit: its outputs, and Finished once
            try:
                await self._reopen_streams(member, restored)  # endpoint, Done, tail: before Finished
            except CheckpointError:
                self._finish(member, "failed", settle=False)
                return
            self._publish(member, {k: v for k, v in restored.outputs.items() if not k.is_stream})
            self._finish(member, restored.reason)
            return
        execution._emit(Waiting(self.path, member.name))
        if isinstance(member, NodeDef):
            for key in member.requires:
                await self.slots[key].arrived.wait()
        attempt = ""
        if self.scope:
            try:
                opened = await self.open_attempt(self.scope, member.name, COMPLETE_CHAIN, 1)
            except CheckpointError:
                self._finish(member, "failed", settle=False)
                return
            if opened.exhausted:
                self._finish(member, "failed", settle=False)
                self.fail(_confirmed_failure(member, self.scope), where)
                return
            attempt = opened.scope
        try:
            owned = await self._open_streams(member)
        except CheckpointError:
            self._finish(member, "failed", settle=False)
            return
        inputs = member.requires if isinstance(member, NodeDef) else ()
        if inputs and all(self.slots[k].value is NoValue for k in inputs):  # skipped without running
            try:
                await self._conclude(member, attempt, "skipped", {}, owned)
            except anyio.get_cancelled_exc_class():
                self._cancelled(member)
                raise
            return
        execution._status_of[where] = "running"
        execution._emit(Running(self.path, member.name))
        started = time.time()
        writes = WriteSet() if self.scope else None
        if writes is not None and isinstance(member, NodeDef):
            _restore_values(writes, member, self.slots, "/".join((*self.path, member.name)), attempt)
        ctx = NodeContext(self, member, writes=writes, scope=attempt)
        if isinstance(member, NodeDef):
            fn = member.fn

            async def body() -> None:
                with node_attempt(ctx, self.graph.name):
                    try:
                        await fn(ctx)
                    except anyio.get_cancelled_exc_class() as exc:
                        await anyio.lowlevel.checkpoint_if_cancelled()  # really cancelled: raised again here
                        raise StrayCancellationError(
                            f"node {'/'.join(where)!r} raised a cancellation while its execution was not "
                            "cancelled: a failure of the node, not an interruption"
                        ) from exc

        else:

            async def body() -> None:
                with node_attempt(ctx, self.graph.name):
                    await self._run_sub(member, ctx)

        aspects = (*self.ambient, *member.aspects)
        try:
            await chain(aspects, ctx, body)()
        except NodeSkipped:
            reason: Conclusion = "skipped"
        except anyio.get_cancelled_exc_class():
            self._finish(member, "cancelled", settle=False)  # its attempt stays active for recovery
            raise
        except Exception as exc:
            if interrupted():  # raised after a cancellation reached it: an interruption, not a failure
                await self._interrupted(member)
                return
            confirmed = not attempt
            if attempt and execution._latched is None:  # a real failure: confirmed, and final
                failure = AttemptFailure.of(exc, index=0, started_at=started)
                with contextlib.suppress(CheckpointError):
                    await self.fail_attempt(attempt, failure)
                    confirmed = True
            if confirmed and execution._latched is None:
                await _fail_streams(owned)  # readers get the writer's failure after the tail
            self._finish(member, "failed", settle=False)
            self.fail(exc, where)
            return
        else:
            reason = "completed"
        if self.scope and interrupted():  # returned or skipped after a cancellation reached it: no record
            # (ordinary mode confirms nothing and published what the node set at once: it completed)
            await self._interrupted(member)
            return
        try:
            await self._conclude(
                member, attempt, reason, writes.staged if writes is not None else {}, owned, started
            )
        except anyio.get_cancelled_exc_class():  # waiting for its streams' confirmations or sources
            self._cancelled(member)
            raise

    async def _interrupted(self, member: NodeDef | SubDef) -> None:
        """``member``'s chain ended after a cancellation reached it: it confirms nothing and spends no
        budget, whatever its code did; its attempt stays active for recovery."""
        self._cancelled(member)
        await accept()  # the cancellation goes on

    def _cancelled(self, member: NodeDef | SubDef) -> None:
        """``member`` ends cancelled, unless it reached a terminal status already."""
        if self.execution._status_of[(*self.path, member.name)] in ("waiting", "running"):
            self._finish(member, "cancelled", settle=False)

    async def _conclude(
        self,
        member: NodeDef | SubDef,
        attempt: str,
        reason: Conclusion,
        staged: Mapping[Key[Any], tuple[Any, bytes | None]],
        owned: Mapping[Key[Any], GraphStream],
        started: float | None = None,
    ) -> None:
        """Ordinary mode: the node is done. Checkpoint mode: stage its record for the node commits.

        In checkpoint mode the node's outputs are published key by key in
        :meth:`landed`, once its record is confirmed (:mod:`streams._node_commits`).
        The streams the node writes end with it: every message it sent is
        confirmed first, and in checkpoint mode their successful ends are
        confirmed in the node's own record.
        """
        if not attempt:
            try:
                for stream in _parts(owned):
                    await stream._core.end(failed=False)
            except Exception as exc:
                self._finish(member, "failed", settle=False)
                self.fail(exc, (*self.path, member.name))
                return
            self._finish(member, reason)
            return
        try:
            for stream in _parts(owned):
                await stream._core.flush()
        except CheckpointError:
            self._finish(member, "failed", settle=False)
            return
        refs: dict[Key[Any], tuple[StreamRef, Terminal]] = {
            key: (_ref(stream), "finished")
            for key, stream in owned.items()  # ends with this record
        }
        for key in member.provides:  # a Sub's record names the source of each stream it exposes
            if key.is_stream and key not in refs:
                await self.slots[key].arrived.wait()  # opened by its source, which may still be running
                source: GraphStream = self.slots[key].value
                refs[key] = (_ref(source), _terminal(source))
        if (owned or any(key.is_stream for key in member.provides)) and interrupted():
            await self._interrupted(member)  # cancelled while its streams settled: no record is staged
            return
        payloads = {key: payload for key, (_, payload) in staged.items()}
        record = NodeCheckpoint(member.name, reason, encode_outputs(member.provides, payloads, refs))
        ends = tuple(
            StreamFinish(s._core.ref, s._core.generation, failed=False)
            for s in _parts(owned)
            if not s._core.done
        )
        commit = CheckpointCommit(self.scope, attempt, record, ends, started_at=started, ended_at=time.time())
        values = {key: value for key, (value, _) in staged.items()}
        try:
            if self.execution._latched is not None:
                raise self.execution._latched
            await self.execution._node_commits.stage(StagedNode(self, member, commit, owned, values, reason))
        except CheckpointError:
            self._finish(member, "failed", settle=False)

    def landed(self, staged: StagedNode) -> None:
        """``staged``'s record is confirmed: its streams end, its outputs are published, it finishes."""
        for stream in _parts(staged.owned):
            stream._core.confirmed_end(failed=False)
        self._publish(staged.member, staged.values)
        self._finish(staged.member, staged.reason)

    def not_confirmed(self, staged: StagedNode) -> None:
        """``staged``'s record may or may not be in the store: nothing is published, resume will tell."""
        self._finish(staged.member, "failed", settle=False)

    async def _open_streams(self, member: NodeDef | SubDef) -> dict[Key[Any], GraphStream]:
        """Open the streams ``member`` writes and hand their endpoints to the readers."""
        if not isinstance(member, NodeDef) or not member.streams:
            return {}
        owned: dict[Key[Any], GraphStream] = {}
        for key in member.streams:
            ref = StreamRef(self.stream_scope, member.name, key.name)
            owned[key] = await self.execution._endpoint(ref, self.stream_plan(key), self.scope)
            self.slots[key].settle(owned[key])
        return owned

    async def _reopen_streams(self, member: NodeDef | SubDef, restored: RestoredNode) -> None:
        """A restored node's streams: reopened (never written again) so readers get endpoint, Done and tail.

        A writer's record names its own stream; a Sub's names the source of
        each stream it exposes, which must be the stream the tree's wiring
        leads to, and is verified against the store before it is used
        (:meth:`_verify_alias`).
        """
        for key in member.provides:
            if not key.is_stream:
                continue
            reference: CheckpointOutput = restored.outputs[key]
            ref, plan = reference.stream, self.stream_plan(key)
            assert ref is not None  # check_plan saw to it
            own = StreamRef(self.stream_scope, member.name, key.name) if isinstance(member, NodeDef) else None
            if (own is not None and ref != own) or (
                plan.writer is None or ref.node != plan.writer.name or ref.key != plan.key.name
            ):
                raise self.execution._latch(
                    CheckpointError(
                        f"the record of {'/'.join((*self.path, member.name))!r} names stream {ref}, which is "
                        "not the stream its wiring leads to"
                    )
                )
            held = None if own is not None else await self._verify_alias(member, reference, plan)
            if held is not None and reference.terminal == "failed":  # no Open, no messages
                self.slots[key].settle(self.execution._failed_endpoint(ref, plan, held))
                continue
            stream = await self.execution._endpoint(ref, plan, self.scope)
            if reference.terminal == "finished" and not all(p._core.finished for p in partitions_of(stream)):
                raise self.execution._latch(
                    CheckpointError(
                        f"stream {ref} was recorded finished by {'/'.join((*self.path, member.name))!r} but "
                        "reopened unfinished: a known terminal never regresses"
                    )
                )
            self.slots[key].settle(stream)

    async def _verify_alias(
        self, member: NodeDef | SubDef, reference: CheckpointOutput, plan: StreamPlan
    ) -> tuple[StreamDescriptor, ...]:
        """The descriptors of the stream a restored Sub's record names, once verified; else a latched error.

        One descriptor, or one per partition of a partitioned stream (each
        partition is verified as a stream would be).

        Its scope must be one the wiring leads to: the scope of the level
        its writer lives in, a child scope (of some attempt of each mount in
        between, :func:`~streams.store.enclosing_scope`) of the level this
        level and the writer's have in common. The store must hold it
        (asked with ``describe``, which raises no generation: a failed
        source is never opened), with the item type of the wiring's key, a
        generation no older than an endpoint of it in this tree, and the
        terminal the record knew: a recorded failure is a failure in the
        store, a recorded finish a finish.
        """
        ref, where = reference.stream, "/".join((*self.path, member.name))
        assert ref is not None and plan.writer is not None  # checked by the caller
        recorded = reference.terminal or "unfinished"

        def refused(what: str) -> CheckpointError:
            return self.execution._latch(
                CheckpointError(f"the record of {where!r} names stream {ref} (recorded {recorded}), {what}")
            )

        common = 0
        while common < min(len(self.path), len(plan.path)) and self.path[common] == plan.path[common]:
            common += 1
        above, mounts = _level_scope(self.scope, self.path[common:]), plan.path[common:]
        if above is None or _level_scope(ref.scope, mounts) != above:
            expected = (
                f"a child scope of {above!r} through Sub {'/'.join(mounts)!r}" if mounts else repr(above)
            )
            raise refused(
                f"but scope {ref.scope!r} is not one the wiring leads to: its writer {plan.writer.name!r} "
                f"is in {'/'.join(plan.path) or 'the root graph'!r}, whose scope is {expected}"
                if above is not None
                else f"but this level's scope {self.scope!r} is not a child scope the store's rules give"
            )
        hooks = self.execution._stream_hooks()
        key = plan.key
        found: list[StreamDescriptor] = []
        for part in _stream_refs(ref, key):

            def describe(_: CheckpointHooks, part: StreamRef = part) -> Awaitable[StreamDescriptor | None]:
                return hooks.describe(part)

            held = await self.execution._reliable("describe", describe)
            which = "which" if part == ref else f"whose partition {part}"
            if held is None:
                raise refused(f"{which} the store never had")
            if held.type_name not in (type_name(key.item_type), qualified_type_name(key.item_type)):
                raise refused(f"{which} holds {held.type_name} messages, not the {key!r} of its wiring")
            if held.partitions != (key.partitions or 0):
                raise refused(f"{which} the store holds as a partition of {held.partitions}, not as {key!r}")
            endpoint = self.execution._streams.get(part)
            if endpoint is not None and held.generation < endpoint._core.generation:
                raise refused(
                    f"{which} the store holds at generation {held.generation}, older than the "
                    f"{endpoint._core.generation} this execution has it open at"
                )
            state = "failed" if held.failed else "finished" if held.finished else "active"
            if (reference.terminal == "failed" and not held.failed) or (
                reference.terminal == "finished" and not held.finished
            ):
                raise refused(
                    f"{which} the store holds {state} (generation {held.generation}): a failed reference "
                    "must be its source's confirmed failure, and a known terminal never regresses"
                )
            found.append(held)
        return tuple(found)

    def stream_plan(self, key: Key[Any]) -> StreamPlan:
        return self.execution._plans[(self.path, key.name)]

    def _publish(self, member: NodeDef | SubDef, values: Mapping[Key[Any], Any]) -> None:
        for key in member.provides:
            if key in values:
                self.slots[key].settle(values[key])

    async def open_attempt(self, parent: str, node: str, position: int, limit: int) -> CheckpointAttempt:
        request = CheckpointAttemptRequest(parent, node, position, limit)
        return await self.execution._reliable("open_attempt", lambda hooks: hooks.open_attempt(request))

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        return await self.execution._reliable(
            "fail_attempt", lambda hooks: hooks.fail_attempt(scope, failure)
        )

    def _finish(self, member: NodeDef | SubDef, status: NodeStatus, *, settle: bool = True) -> None:
        if settle:
            for key in member.provides:
                slot = self.slots[key]
                if not slot.settled and not key.is_stream:  # a stream arrives with its source
                    slot.settle(NoValue)
        self._leave(member)
        self.execution._status_of[(*self.path, member.name)] = status
        attributes = self._status_attributes.get(status)
        if attributes is None:  # made once per status and level: _finish runs for every node
            attributes = self._status_attributes[status] = {
                ATTR.GRAPH: self.graph.name,
                ATTR.NODE_STATUS: status,
            }
        INSTRUMENTS.nodes.add(1, attributes)
        self.execution._emit(Finished(self.path, member.name, status))

    def _leave(self, member: NodeDef | SubDef) -> None:
        """A concluded reader (or a whole mount) no longer holds back the writers of what it read."""
        if isinstance(member, NodeDef):
            readings = [
                (key, ["/".join((*self.path, member.name))]) for key in member.requires if key.is_stream
            ]
        else:
            inner = (*self.path, member.name)
            readings = [
                (parent, self.stream_plan(parent).groups_under(inner))
                for _, parent in member.inlets
                if parent.is_stream
            ]
        for key, groups in readings:
            self.slots[key].on_settle(_leave_groups(groups))

    async def _run_sub(self, mount: SubDef, ctx: NodeContext) -> None:
        path = (*self.path, mount.name)
        for _, parent_key in mount.outlets:
            writer_inside = (
                self.stream_plan(parent_key).path[: len(path)] == path if parent_key.is_stream else False
            )
            if writer_inside and self.slots[parent_key].settled:
                raise OutputError(
                    f"Sub {'/'.join(path)!r} runs again after a failed attempt, but the stream "
                    f"{parent_key!r} its child writes was already handed to readers outside it, who would "
                    "keep reading the failed attempt's stream: retry the writer inside the Sub, not the Sub"
                )
        self.execution._emit(Child(self.path, mount.name))
        scope, plan = "", dict[str, RestoredNode]()
        if self.scope:
            scope, plan = await self._open_child(mount, ctx._scopes[-1], path)
        slots = _slots_for(mount.graph)
        for key, value in mount.fixed:
            slots[key].settle(value)
        for child_key, parent_key in mount.inlets:
            self.slots[parent_key].on_settle(_feed(slots[child_key]))
        for child_key, parent_key in mount.outlets:
            if parent_key.is_stream:  # live: the endpoint, as soon as its source opened it
                slots[child_key].on_settle(_feed(self.slots[parent_key]))
            else:
                slots[child_key].on_settle(_expose(ctx, parent_key))
        ambient = () if mount.without_aspects else self.ambient
        await _Level(self.execution, mount.graph, path, ambient, slots, scope=scope, plan=plan).run()

    async def _open_child(
        self, mount: SubDef, parent: str, path: tuple[str, ...]
    ) -> tuple[str, dict[str, RestoredNode]]:
        topology = mount.graph.topology()
        child = CheckpointChild(
            parent,
            mount.name,
            mount.graph.name,
            mount.graph.version,
            topology.fingerprint,
            _fixed_fingerprint(mount),
            tuple(sorted((c.name, p.name) for c, p in mount.inlets)),
            topology.legacy_fingerprint,
        )
        try:
            opened = await self.execution._reliable(
                "open_child", lambda hooks: hooks.open_child(child), scope_failure=parent
            )
        except CheckpointScopeFailure:
            raise ConfirmedFailureError(
                f"Sub {'/'.join(path)!r}: its child failed for good under attempt {parent!r} (confirmed)"
            ) from None
        try:
            plan = check_plan(mount.graph, opened.nodes, where=f"Sub {'/'.join(path)!r}")
        except RestorePlanError as exc:
            raise self.execution._latch(
                CheckpointError(f"open_child returned an invalid plan: {exc}")
            ) from exc
        return opened.scope, plan


class _ReadOnlyStreamHooks:
    """The hooks of a local failed endpoint: every call is refused (none should be made)."""

    async def _refuse(self, *_: object) -> Any:
        raise StreamClosedError("a restored alias of a failed stream is read-only: it takes no call")

    open = append = open_message = fail_message = commit = finish = describe = _refuse
    # a keyed handler of the failed source gets the source's failure, never a missing store: the
    # endpoint has keyed state (none), and refuses its reads as it refuses everything
    read_keyed = list_keyed = _refuse


_READ_ONLY: Any = _ReadOnlyStreamHooks()


def _restore_values(
    writes: WriteSet, member: NodeDef, slots: Mapping[Key[Any], Slot], group: str, attempt: str
) -> None:
    """The seed's ``CheckpointAttempt.values``: what messages confirmed under this very attempt set.

    A reader's complete attempt, reclaimed after a crash, gets back the
    ordinary results its handlers' confirmed messages set, into its write
    set before its chain runs: published only with the node's commit. Only
    results committed under this attempt count (not a Retry's nested
    attempts, not a failed attempt's), and no key gets a value without one.
    """
    provided = {key.name: key for key in member.provides if not key.is_stream}
    for key in member.requires:
        stream = slots[key].value if key.is_stream else None
        if not isinstance(stream, ManagedStream):
            continue
        frontier = stream._core.group(group)
        if frontier.attempt != attempt:
            continue
        for name, payload in frontier.results.items():
            out = provided.get(name)
            if out is not None:
                writes.staged[out] = (codec_for(out.type).decode(payload, what=f"result {name!r}"), payload)


def _level_scope(scope: str, mounts: Sequence[str]) -> str | None:
    """The scope of the level ``len(mounts)`` Sub layers above a level of ``scope`` (None: not a child's).

    ``mounts`` are the mounts between them, outermost first.
    """
    for mount in reversed(mounts):
        enclosing = enclosing_scope(scope, mount)
        if enclosing is None:
            return None
        scope = enclosing
    return scope


def _leave_groups(groups: list[str]) -> Callable[[Any], None]:
    def leave(stream: Any) -> None:
        if isinstance(stream, (ManagedStream, PartitionedStream)):
            for part in partitions_of(stream):
                for group in groups:
                    part._core.leave(group)

    return leave


async def _fail_streams(owned: Mapping[Key[Any], GraphStream]) -> None:
    """Confirm a failed writer's streams as failed (a failure to do so is latched by the stream).

    Their readers are told once every end is confirmed, all at once: the
    writer's failure reaches its level before a reader's failure to read
    (a partitioned stream's partitions end one by one in the store).
    """
    ended: list[ManagedStream[Any]] = []
    try:
        for stream in _parts(owned):
            with contextlib.suppress(CheckpointError):
                if await stream._core.confirm_end(failed=True):
                    ended.append(stream)
    finally:
        for stream in ended:
            stream._core.confirmed_end(failed=True)


def _stream_refs(ref: StreamRef, key: Key[Any]) -> tuple[StreamRef, ...]:
    """The streams that hold stream ``ref`` of ``key`` in the store: itself, or each of its partitions."""
    return (ref,) if key.partitions is None else tuple(ref.partition(p) for p in range(key.partitions))


def _part_key(key: Key[Any], part: StreamRef) -> Key[Any]:
    """The key of one stream of ``key``'s: ``key`` itself, or a partition's (``key#p``, no partitions)."""
    return key if key.partitions is None else Key(part.key, key.type)


def _endpoint_of(key: Key[Any], ref: StreamRef, parts: Sequence[ManagedStream[Any]]) -> GraphStream:
    """The tree's endpoint of ``key`` over the streams of :func:`_stream_refs`, in order."""
    if key.partitions is None:
        return parts[0]
    assert key.partition_key is not None  # a partitioned key has its function
    return PartitionedStream(key, ref, tuple(parts), key.partition_key)


def _parts(owned: Mapping[Key[Any], GraphStream]) -> Iterator[ManagedStream[Any]]:
    """The streams of the endpoints ``owned``: each partition of a partitioned one."""
    for stream in owned.values():
        yield from partitions_of(stream)


def _ref(stream: GraphStream) -> StreamRef:
    """What a node record names: the stream, or a partitioned stream's own ref (its partitions follow)."""
    return stream.ref if isinstance(stream, PartitionedStream) else stream._core.ref


def _terminal(stream: GraphStream) -> Terminal:
    """A source's terminal as a Sub's record names it: failed if a partition failed, finished if all did."""
    parts = partitions_of(stream)
    if any(p._core.failed for p in parts):
        return "failed"
    return "finished" if all(p._core.finished for p in parts) else ""


def _feed(slot: Slot) -> Callable[[Any], None]:
    def feed(value: Any) -> None:
        if not slot.settled:
            slot.settle(value)

    return feed


def _expose(ctx: NodeContext, key: Key[Any]) -> Callable[[Any], None]:
    def expose(value: Any) -> None:
        ctx._writable(key, "set")
        payload = None if value is NoValue else codec_for(key.type).encode(value)  # read back in the child
        ctx._put(key, value, payload)

    return expose


def _fixed_fingerprint(mount: SubDef) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(mount.fixed, key=lambda item: item[0].name):
        digest.update(key.name.encode() + b"\0" + codec_for(key.type).encode(value) + b"\0")
    return digest.hexdigest()


def _confirmed_failure(member: NodeDef | SubDef, scope: str) -> ConfirmedFailureError:
    return ConfirmedFailureError(
        f"node {member.name!r} failed for good in scope {scope!r} in an earlier attempt (confirmed); "
        "its budget is not refilled: a new run of this work needs a new run id"
    )


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
        self._on_event = on_event
        self._status: ExecutionStatus = "created"
        self._status_of: dict[tuple[str, ...], NodeStatus] = {}
        self._failure: BaseException | None = None
        self._cancel_requested = False
        self._scope: anyio.CancelScope | None = None
        self._done = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._checkpoint = checkpoint
        self._latched: CheckpointError | None = None
        self._noted: list[BaseException] = []
        self._plan: dict[str, RestoredNode] = {}
        self._records: tuple[NodeCheckpoint, ...] = ()
        self._stream_capacity = stream_capacity
        self._streams: dict[StreamRef, ManagedStream[Any]] = {}  # every stream of the tree, partitions too
        self._endpoints: dict[StreamRef, GraphStream] = {}  # one endpoint per stream key of the tree
        self._opening: dict[StreamRef, anyio.Event] = {}
        self._plans = dict(graph.stream_plans())
        self._host_groups = _host_groups(graph, self._plans, dict(host_readers or {}))
        self._resumable_inputs = _resumable_inputs(graph, resumable_inputs)
        self._ordinary_streams: MemoryStore | None = None
        self._node_commits = NodeCommits(confirm=self._commit_nodes, latch=self._latch_any)
        self._root = _Level(
            self, graph, (), self._aspects, _slots_for(graph), scope=checkpoint.scope if checkpoint else ""
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
            for part in _stream_refs(ref, plan.key):
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
            if self._failure is not None:
                raise self._failure
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
            with anyio.CancelScope() as self._scope:
                if self._cancel_requested:
                    self._scope.cancel()
                await self._root.run()
        except Exception as exc:  # the root graph's first failure
            if self._failure is None:
                self._failure = exc
        finally:
            if self._failure is not None:
                self._status = "failed"
            elif self._cancel_requested or any(s == "cancelled" for s in self._status_of.values()):
                self._status = "cancelled"
            else:
                self._status = "completed"
            INSTRUMENTS.executions.add(1, {ATTR.GRAPH: self.graph.name, ATTR.EXECUTION_STATUS: self._status})
            self._done.set()

    def _fail(self, exc: BaseException, where: tuple[str, ...]) -> None:
        """Fail the whole execution (a latched reliable failure, an observer that raised)."""
        if self._failure is None:
            if where:
                exc.add_note(f"in node {'/'.join(where)!r} of graph {self.graph.name!r}")
            self._failure = exc
        if self._scope is not None:
            self._scope.cancel()

    async def _reliable(
        self,
        what: str,
        call: Callable[[CheckpointHooks], Awaitable[T]],
        *,
        scope_failure: str | None = None,
    ) -> T:
        """One hook call, accepted only from a caller not cancelled, then shielded to its answer.

        Any failure of the call latches a :class:`CheckpointError` for the
        tree (:mod:`streams._outcome`), a cancellation exception the store
        raised included.

        Only ``open_child`` may signal a confirmed business failure, with a
        :class:`CheckpointScopeFailure` of exactly that type for exactly the
        requested parent attempt (``scope_failure``); it is raised as it is.
        """
        if self._latched is not None:
            raise self._latched
        assert self._checkpoint is not None
        await accept()  # a cancelled caller starts no reliable operation
        hooks = self._checkpoint.hooks
        try:
            with anyio.CancelScope(shield=True):
                result = await call(hooks)
        except CheckpointScopeFailure as exc:
            if (
                scope_failure is not None
                and type(exc) is CheckpointScopeFailure
                and exc.scope == scope_failure
            ):
                raise
            raise self._latch(CheckpointError(f"{what}: an unexpected scope failure signal ({exc})")) from exc
        except CheckpointError as exc:
            raise self._latch(exc) from None
        except BaseException as exc:
            if not is_fault(exc, shielded=True):
                raise
            raise self._latch(CheckpointError(f"{what} failed: {type(exc).__qualname__}: {exc}")) from exc
        return result

    def _stream_hooks(self) -> StreamHooks:
        """Where the tree's streams are confirmed: the store's stream hooks, or in memory in ordinary mode."""
        if self._checkpoint is not None:
            return self._checkpoint.hooks.streams
        if self._ordinary_streams is None:
            self._ordinary_streams = MemoryStore()
        return self._ordinary_streams

    async def _endpoint(
        self, ref: StreamRef, plan: StreamPlan, scope: str, *, host: bool = False
    ) -> GraphStream:
        """The one endpoint of stream ``ref`` in the tree: opened by the first alias to need it, then shared.

        ``scope`` is the checkpoint scope of the level asking ("" in ordinary
        mode). The stream is opened with its writer's promise and every
        group of the tree that reads it, the host's included. ``host``: the
        host writes it (a stream input of the root), with the promise given
        in ``resumable_inputs``, and ends it itself. A partitioned stream's
        key opens each partition (``key#p``, :func:`~streams.partition_name`)
        as a stream of its own, in order, and is one endpoint over them.
        """
        while (opening := self._opening.get(ref)) is not None:
            await opening.wait()
        existing = self._endpoints.get(ref)
        if existing is not None:
            if (existing.key.item_type, existing.key.partitions) != (plan.key.item_type, plan.key.partitions):
                raise self._latch(
                    CheckpointError(f"stream {ref} is open with {existing.key!r}, not {plan.key!r}")
                )
            return existing
        done = self._opening[ref] = anyio.Event()
        try:
            resumable = (
                plan.key in self._resumable_inputs
                if host
                else plan.writer is not None and plan.writer.resumable
            )
            key = plan.key
            writer = None if host or plan.writer is None else "/".join((*plan.path, plan.writer.name))
            parts = [
                await self._open_one(
                    _part_key(key, part), part, plan.groups, scope, resumable, writer, key.partitions or 0
                )
                for part in _stream_refs(ref, key)
            ]
            stream = self._endpoints[ref] = _endpoint_of(key, ref, parts)
            return stream
        finally:
            del self._opening[ref]
            done.set()

    async def _open_one(
        self,
        key: Key[Any],
        ref: StreamRef,
        groups: tuple[str, ...],
        scope: str,
        resumable: bool,
        writer: str | None,
        partitions: int,
    ) -> ManagedStream[Any]:
        """Open stream ``ref`` (a partition of a stream of ``partitions``, or 0: one of its own) for
        ``writer``, the node's path (None: the host), which a store's refusal to reopen it names."""
        request = StreamOpen(
            ref=ref,
            type_name=type_name(key.item_type),
            legacy_type_name=qualified_type_name(key.item_type),
            capacity=self._stream_capacity,
            groups=groups,
            resumable=resumable,
            partitions=partitions,
        )
        hooks = self._stream_hooks()

        async def open_stream(_: object = None) -> StreamOpened:
            try:
                return await hooks.open(request)
            except SourceNotResumableError as exc:
                who = "the host" if writer is None else f"node {writer!r}"
                raise SourceNotResumableError(f"{who}: {exc}") from None

        opened = await (self._reliable("open", open_stream) if scope else open_stream())
        core: StreamCore[Any] = StreamCore(
            self._spawn,
            hooks,
            key,
            ref,
            opened,
            capacity=self._stream_capacity,
            resumable=resumable,
            on_latch=self._latch,
            node_owned=writer is not None,
            partitions=partitions,
            template=self._template(ref),
            graph=self.graph.name,
        )
        stream: ManagedStream[Any] = ManagedStream(core)
        self._streams[ref] = stream
        return stream

    def _template(self, ref: StreamRef) -> str | None:
        """What the metrics of stream ``ref`` name it by: in checkpoint mode, without the run's id."""
        return None if self._checkpoint is None else destination_template(ref, self._checkpoint.scope)

    def _failed_endpoint(
        self, ref: StreamRef, plan: StreamPlan, held: Sequence[StreamDescriptor]
    ) -> GraphStream:
        """A local, read-only endpoint of a source whose failure a restored Sub alias recorded.

        The store confirmed the failure of every stream in ``held`` (the
        source, or each of its partitions, see :meth:`_Level._verify_alias`).
        No Open is made and it holds no message: receiving raises
        :class:`StreamFailedError`, and sending or acknowledging is refused
        (its hooks are never called). An endpoint the tree opened for the
        same stream is shared instead.
        """
        existing = self._endpoints.get(ref)
        if existing is not None:
            return existing
        key = plan.key
        parts: list[ManagedStream[Any]] = []
        for descriptor in held:
            part_ref = descriptor.ref
            opened = StreamOpened.empty(part_ref, plan.groups, generation=descriptor.generation, failed=True)
            core: StreamCore[Any] = StreamCore(
                self._spawn,
                _READ_ONLY,
                _part_key(key, part_ref),
                part_ref,
                opened,
                capacity=1,
                resumable=False,
                node_owned=True,
                template=self._template(part_ref),
                graph=self.graph.name,
            )
            parts.append(ManagedStream(core))
            self._streams[part_ref] = parts[-1]
        stream = self._endpoints[ref] = _endpoint_of(key, ref, parts)
        return stream

    def _spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a stream's background confirmations in the execution's task group.

        A confirmation that failed latched the tree's failure, which
        :meth:`wait` raises: it does not escape the task group a second time.
        """
        assert self._task_group is not None
        self._task_group.start_soon(self._confirming, fn)

    async def _confirming(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await fn()
        except CheckpointError as exc:
            if self._latched is None:
                raise self._latch(exc) from None

    def streams(self) -> dict[StreamRef, ManagedStream[Any]]:
        """Every stream endpoint the execution opened so far, by identity."""
        return dict(self._streams)

    async def _commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        await self._reliable("commit_nodes", lambda hooks: hooks.commit_nodes(commits))

    def _latch_any(self, exc: Exception) -> CheckpointError:
        """Latch ``exc`` (a failed node commit, already a latched error when it came through _reliable)."""
        return self._latch(exc if isinstance(exc, CheckpointError) else CheckpointError(str(exc)))

    def _latch(self, error: CheckpointError) -> CheckpointError:
        """The execution's one failure latch: the first reliable failure stops the whole tree."""
        if self._latched is None:
            self._latched = error
            self._fail(error, ())
        return self._latched

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
