"""Node commits: the records of concluded nodes, confirmed through the confirmation pipeline.

In checkpoint mode a node that concluded stages its complete record here and
its task ends; nothing of it is published yet. The execution tree's one
:class:`~streams._pipeline.ConfirmPipeline` confirms what is staged with
``hooks.commit_nodes``: the records of nodes that concluded while the
previous batch was in the store leave together, in one store transaction,
all or nothing, provided their nodes' context variables are equal
(:func:`~streams._in_context.same_context`); the call runs in those variables,
copied from each node's task when it staged its record, whichever node's task
leads the confirmations. Records of nodes whose variables differ (a tenant
set to another value) leave in calls of their own, one per context, the
oldest record's first. When a batch lands, each node's streams end, its outputs are
published key by key and it finishes, in the order the nodes concluded. If
a batch fails, its outcome is unknown: the execution's latch trips, every
node not confirmed finishes failed without publishing, and resume reads the
ledger to learn what was confirmed.

A level (a graph of the tree) waits for every record its nodes staged with
:meth:`NodeCommits.settle` before it returns, so a Sub mount reads its
child's outlets, and concludes, only after the child's records landed.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ._errors import CheckpointError
from ._in_context import same_context
from ._pipeline import ConfirmPipeline
from ._store._node_records import CheckpointCommit, Conclusion

if TYPE_CHECKING:
    from ._graph import NodeDef, SubDef
    from ._keys import Key
    from ._partitions import PartitionedStream
    from ._stream import ManagedStream

__all__ = ["NodeCommits", "StagedNode"]


class _Landing(Protocol):
    """What a staged node's level does once its record landed, or will never land."""

    def landed(self, staged: StagedNode) -> None: ...

    def not_confirmed(self, staged: StagedNode) -> None: ...


class StagedNode:
    """A concluded node waiting for its record: what to confirm, and what to publish after."""

    __slots__ = ("commit", "context", "level", "member", "owned", "reason", "values")

    def __init__(
        self,
        level: _Landing,
        member: NodeDef | SubDef,
        commit: CheckpointCommit,
        owned: Mapping[Key[Any], ManagedStream[Any] | PartitionedStream[Any]],
        values: Mapping[Key[Any], Any],
        reason: Conclusion,
    ) -> None:
        self.level = level
        self.member = member
        self.commit = commit
        self.owned = owned  # the streams it wrote, which end with its record
        self.values = values  # its outputs as they read back, published once confirmed
        self.reason = reason
        #: the node's context variables as it concluded: its record's store call runs in them
        self.context = contextvars.copy_context()


class NodeCommits:
    """The node records of one execution tree on their way to the store; see the module docstring."""

    __slots__ = ("_confirm", "_latch", "_staged", "pipeline")

    def __init__(
        self,
        *,
        confirm: Callable[[Sequence[CheckpointCommit]], Awaitable[None]],
        latch: Callable[[Exception], CheckpointError],
    ) -> None:
        self._confirm = confirm  # one store call for a batch (the execution's reliable commit_nodes)
        self._latch = latch
        self._staged: list[StagedNode] = []
        self.pipeline: ConfirmPipeline[list[StagedNode]] = ConfirmPipeline(
            cut=self._cut,
            confirm=self._confirm_batch,
            land=self._land,
            fail=self._fail,
            context=_first_context,
            units=len,
        )

    async def stage(self, node: StagedNode) -> None:
        """Stage ``node``'s record; raises the tree's failure instead once a batch failed.

        If no batch is in the store, the caller (the node's task) confirms it
        at once, with whatever other nodes stage meanwhile (each batch in its
        own nodes' context variables, never the caller's unless they are equal).
        """
        if self.pipeline.failure is not None:
            raise self.pipeline.failure
        self._staged.append(node)
        await self.pipeline.stage_and_lead()

    async def settle(self) -> None:
        """Wait, shielded, until every record staged so far landed or failed (failures are the nodes')."""
        with anyio.CancelScope(shield=True), contextlib.suppress(CheckpointError):
            await self.pipeline.drain()

    def _cut(self) -> list[StagedNode]:
        """The oldest staged record and every other one staged in the same context variables."""
        staged, self._staged = self._staged, []
        if not staged:
            return staged
        first = staged[0].context
        batch: list[StagedNode] = []
        for node in staged:
            (batch if same_context(first, node.context) else self._staged).append(node)
        return batch

    async def _confirm_batch(self, batch: list[StagedNode]) -> None:
        await self._confirm([node.commit for node in batch])

    def _land(self, batch: list[StagedNode]) -> None:
        for node in batch:
            node.level.landed(node)

    def _fail(self, batch: list[StagedNode], exc: Exception) -> CheckpointError:
        error = self._latch(exc)
        unconfirmed, self._staged = [*batch, *self._staged], []  # those staged after it are never sent
        for node in unconfirmed:
            node.level.not_confirmed(node)
        return error


def _first_context(batch: list[StagedNode]) -> contextvars.Context:
    """Where a batch's ``commit_nodes`` runs: its records' context (they are equal), the oldest's copy."""
    return batch[0].context
