"""A level of the execution tree: the nodes of one graph (the root's, or a Sub mount's child) running
together.

A :class:`Level` holds its graph's keys (one :class:`~streams._context.Slot`
each) and runs every member of its graph once, each as a node attempt
(:mod:`streams._attempt`, given to the level as its ``runner``), in its own
task group: a member runs in the level's task until it first waits, and
only a member that waits gets a task (:mod:`streams._inline`). It knows
how a member ends: :meth:`Level.finish` settles what it did not set,
records its status and emits ``Finished`` once; :meth:`Level.fail` keeps the
level's first failure and cancels its other members, and :meth:`Level.run`
raises it to the mount (or the execution) once every member ended and
every record its nodes staged landed.

It is also each of its nodes' :class:`~streams._context.NodeSite`: what a
:class:`~streams.NodeContext` reads of where it runs, and the store calls
of its retry boundaries.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import anyio

from ._aliases import StreamPlan
from ._aspects import Aspect
from ._context import Slot
from ._endpoints import parts
from ._errors import CheckpointError
from ._events import Finished, GraphStarted, NodeStatus
from ._graph import Graph, Member, NodeDef, members_of
from ._inline import run_all
from ._keys import Key, NoValue
from ._metrics import INSTRUMENTS
from ._node_commits import StagedNode
from ._partitions import PartitionedStream, partitions_of
from ._plan import RestoredNode
from ._store._node_records import AttemptFailure, CheckpointAttempt
from ._store._records import StreamRef
from ._stream import ManagedStream, core_of
from ._tracing import ATTR
from ._tree import Tree

__all__ = ["HOST", "Level", "Runner", "slots_for"]

#: The node name of the streams a host writes (the root's stream inputs): ``{scope}/host/{key}``.
HOST = "host"
#: What runs one member of a level to its end (:func:`streams._attempt.run_member`).
Runner = Callable[["Level", Member], Coroutine[Any, Any, None]]


def slots_for(graph: Graph) -> dict[Key[Any], Slot]:
    """A slot for every key of ``graph``: its inputs and what its members provide."""
    keys = [*graph.inputs, *(key for member in members_of(graph) for key in member.provides)]
    return {key: Slot() for key in keys}


class Level:
    """The nodes of one graph of the tree running together; see the module docstring."""

    __slots__ = (
        "_cancel",
        "_clear",
        "_host_inlets",
        "_status_attributes",
        "ambient",
        "failure",
        "graph",
        "path",
        "plan",
        "runner",
        "scope",
        "slots",
        "tree",
    )

    def __init__(
        self,
        tree: Tree,
        graph: Graph,
        path: tuple[str, ...],
        ambient: tuple[Aspect, ...],
        slots: dict[Key[Any], Slot],
        *,
        runner: Runner,
        scope: str = "",
        plan: Mapping[str, RestoredNode] | None = None,
        host_inlets: bool = False,
    ) -> None:
        self.tree = tree
        self.graph = graph
        self.path = path
        self.ambient = ambient  # the aspects around every node of this level (the execution's)
        self.slots = slots
        self.runner = runner
        self.scope = scope  # the execution scope in checkpoint mode ("" in ordinary mode)
        self.plan = dict(plan or {})
        self.failure: BaseException | None = None
        self._host_inlets = host_inlets  # the root: it opens the stream inputs the host writes
        self._cancel: anyio.CancelScope | None = None
        self._clear = -1  # the tree's epoch when a node of this level last found it was not cancelled
        self._status_attributes: dict[str, dict[str, str]] = {}

    # -- what a node's context reads (NodeSite) -------------------------------------------------

    @property
    def run_id(self) -> str | None:
        return self.tree.run_id

    async def open_attempt(self, parent: str, node: str, position: int, limit: int) -> CheckpointAttempt:
        return await self.tree.open_attempt(parent, node, position, limit)

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        return await self.tree.fail_attempt(scope, failure)

    # -- running ------------------------------------------------------------------------------

    @property
    def stream_scope(self) -> str:
        """The scope of the streams this level's nodes write: its checkpoint scope, or its path."""
        return self.scope or "/".join(("execution", *self.path))

    def stream_plan(self, key: Key[Any]) -> StreamPlan:
        return self.tree.stream_plan(self.path, key)

    async def run(self) -> None:
        """Run every member to its end; raise the level's first failure, if any."""
        tree = self.tree
        tree.emit(GraphStarted(self.path, self.graph.name))
        try:
            async with anyio.create_task_group() as tg:
                self._cancel = tg.cancel_scope
                if self._host_inlets:
                    for key in self.graph.inputs:
                        if key.is_stream:
                            tg.start_soon(self._open_host_inlet, key)
                members = members_of(self.graph)
                for member in members:
                    tree.statuses[(*self.path, member.name)] = "waiting"
                # no task per member: one only for each member that waits (streams._inline)
                await run_all(
                    tg,
                    [functools.partial(self.runner, self, member) for member in members],
                    fresh=tree.disturb,
                )
        finally:
            if self.scope:  # the records its nodes staged land (or fail) before the level ends
                await tree.node_commits.settle()
        if self.failure is not None:  # the first failure of this graph, to its mount (or the execution)
            raise self.failure

    async def _open_host_inlet(self, key: Key[Any]) -> None:
        """Open a stream input of the root, which the host writes: its readers get it as from a writer."""
        ref = StreamRef(self.stream_scope, HOST, key.name)
        with contextlib.suppress(CheckpointError):  # latched: the execution fails with it
            self.slots[key].settle(
                await self.tree.endpoints.open(ref, self.stream_plan(key), self.scope, host=True)
            )

    def fail(self, exc: BaseException, where: tuple[str, ...]) -> None:
        """A node of this level failed: cancel its other nodes; :meth:`run` raises ``exc`` to the mount."""
        self.tree.disturb()
        if self.failure is None:
            self.tree.note(exc, where)
            self.failure = exc
        if self._cancel is not None:
            self._cancel.cancel()

    # -- what a node found of its cancellation -----------------------------------------------

    def clear(self) -> None:
        """A node of this level just found its contexts not cancelled (:func:`streams._outcome.interrupted`).

        The next member the same step of the level's queue starts takes the
        finding for its own check before its attempt opens (:meth:`still_clear`):
        it runs in the same task, inside the same scopes, and nothing but
        engine code ran between, unless the tree was disturbed
        (:meth:`streams._tree.Tree.disturb`). So a level's step checks
        anyio once per node, not twice.
        """
        self._clear = self.tree.epoch

    def still_clear(self) -> bool:
        """Whether the last finding of :meth:`clear` holds: nothing disturbed the tree since."""
        return self._clear == self.tree.epoch

    # -- how a member ends --------------------------------------------------------------------

    def status(self, member: Member) -> NodeStatus:
        return self.tree.statuses[(*self.path, member.name)]

    def set_status(self, member: Member, status: NodeStatus) -> None:
        self.tree.statuses[(*self.path, member.name)] = status

    def publish(self, member: Member, values: Mapping[Key[Any], Any]) -> None:
        for key in member.provides:
            if key in values:
                self.slots[key].settle(values[key])

    def finish(self, member: Member, status: NodeStatus, *, settle: bool = True) -> None:
        """``member`` ends with ``status``: what it did not set is skipped (``settle``), Finished once."""
        if settle:
            for key in member.provides:
                slot = self.slots[key]
                if not slot.settled and not key.is_stream:  # a stream arrives with its source
                    slot.settle(NoValue)
        self._leave(member)
        self.tree.statuses[(*self.path, member.name)] = status
        attributes = self._status_attributes.get(status)
        if attributes is None:  # made once per status and level: finish runs for every node
            attributes = self._status_attributes[status] = {
                ATTR.GRAPH: self.graph.name,
                ATTR.NODE_STATUS: status,
            }
        INSTRUMENTS.nodes.add(1, attributes)
        self.tree.emit(Finished(self.path, member.name, status))

    def cancelled(self, member: Member) -> None:
        """``member`` ends cancelled, unless it reached a terminal status already."""
        if self.status(member) in ("waiting", "running"):
            self.finish(member, "cancelled", settle=False)

    def _leave(self, member: Member) -> None:
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

    # -- the node commits' landing (streams._node_commits) ----------------------------------------

    def landed(self, staged: StagedNode) -> None:
        """``staged``'s record is confirmed: its streams end, its outputs are published, it finishes."""
        if staged.owned:
            for stream in parts(staged.owned):
                core_of(stream).confirmed_end(failed=False)
        self.publish(staged.member, staged.values)
        self.finish(staged.member, staged.reason)

    def not_confirmed(self, staged: StagedNode) -> None:
        """``staged``'s record may or may not be in the store: nothing is published, resume will tell."""
        self.finish(staged.member, "failed", settle=False)


def _leave_groups(groups: list[str]) -> Callable[[Any], None]:
    def leave(stream: Any) -> None:
        if isinstance(stream, (ManagedStream, PartitionedStream)):
            for part in partitions_of(stream):
                for group in groups:
                    core_of(part).leave(group)

    return leave
