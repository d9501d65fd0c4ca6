"""The execution tree: what every level of one execution shares, behind named operations.

An :class:`~streams.Execution` runs its root graph as a level, and each Sub
mount runs its child graph as another (:mod:`streams._level`). The levels
of one execution share one :class:`Tree`:

- the status of every node, and the lifecycle events a host observes;
- one failure: the first node failure of the root, or a latched reliable
  failure (:meth:`Tree.latch`: the first :class:`~streams.CheckpointError`
  stops the whole tree, and no Retry or aspect swallows it);
- the store, through :meth:`Tree.reliable`: every hook call is accepted
  only from a caller not cancelled, then shielded to its answer, and any
  failure of it latches the tree's error (:mod:`streams._outcome`);
- the node commits (:mod:`streams._node_commits`), the stream plans of the
  graph and the stream endpoints (:mod:`streams._endpoints`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from ._aliases import Alias, StreamPlan
from ._checkpoint import ExecCheckpoint
from ._endpoints import Endpoints
from ._errors import CheckpointError, CheckpointScopeFailure
from ._events import ExecutionEvent, NodeStatus
from ._keys import Key
from ._node_commits import NodeCommits
from ._outcome import accept, is_fault
from ._store._hooks import CheckpointHooks
from ._store._node_records import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointCommit,
)
from ._store._nodes import first_attempt

__all__ = ["Tree"]

T = TypeVar("T")


class Tree:
    """The shared state and services of one execution tree; see the module docstring."""

    __slots__ = (
        "_noted",
        "_on_event",
        "checkpoint",
        "endpoints",
        "epoch",
        "failure",
        "graph",
        "latched",
        "node_commits",
        "plans",
        "scope",
        "statuses",
    )

    def __init__(
        self,
        graph: str,
        checkpoint: ExecCheckpoint | None,
        plans: Mapping[Alias, StreamPlan],
        *,
        on_event: Callable[[ExecutionEvent], None] | None,
        stream_capacity: int,
        resumable_inputs: frozenset[Key[Any]],
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
    ) -> None:
        self.graph = graph  # the root graph's name, which failures and events are noted with
        self.checkpoint = checkpoint
        self.plans = plans
        self._on_event = on_event
        self.statuses: dict[tuple[str, ...], NodeStatus] = {}
        self.failure: BaseException | None = None  # what the execution raises
        self.latched: CheckpointError | None = None  # the first reliable failure
        self.scope: anyio.CancelScope | None = None  # the root's, once it runs: cancelling it stops all
        self._noted: list[BaseException] = []
        #: counts whatever may have cancelled a scope around the nodes, or let other tasks run
        #: (:meth:`disturb`): a level's finding that it is not cancelled holds while it stays
        self.epoch = 0
        self.node_commits = NodeCommits(confirm=self._commit_nodes, latch=self.latch_any)
        self.endpoints = Endpoints(
            graph=graph,
            store=None if checkpoint is None else checkpoint.hooks,
            checkpoint_scope=None if checkpoint is None else checkpoint.scope,
            capacity=stream_capacity,
            resumable_inputs=resumable_inputs,
            reliable=self.reliable,
            latch=self.latch,
            latched=lambda: self.latched,
            spawn=spawn,
        )

    @property
    def run_id(self) -> str | None:
        """The checkpoint scope of the root (the durable run); ``None`` in ordinary mode."""
        return None if self.checkpoint is None else self.checkpoint.scope

    def stream_plan(self, path: tuple[str, ...], key: Key[Any]) -> StreamPlan:
        """The plan of stream ``key`` of the level at ``path``."""
        return self.plans[(path, key.name)]

    # -- events and failures ---------------------------------------------------------------

    def disturb(self) -> None:
        """Something may have cancelled a scope around the nodes, or other tasks may have run.

        A level that found itself not cancelled (:meth:`streams._level.Level.clear`)
        takes the finding again only while nothing since disturbed it: the
        host's observer, a store call, a failure, a cancellation by the engine,
        a new step of a level's queue (:func:`streams._inline.run_all`). What
        else runs in one step is node code, and every node's own chain is
        followed by a check of its own.
        """
        self.epoch += 1

    def emit(self, event: ExecutionEvent) -> None:
        """Tell the host; what its observer raises fails the execution."""
        if self._on_event is None:
            return
        self.epoch += 1  # the host's code runs: it may cancel its scopes
        try:
            self._on_event(event)
        except Exception as exc:
            self.fail(exc, (*event.path, getattr(event, "node", "")))

    def note(self, exc: BaseException, where: tuple[str, ...]) -> None:
        """Name the node ``exc`` arose in, once (not again at each mount it passes)."""
        if not any(exc is seen for seen in self._noted):
            self._noted.append(exc)
            exc.add_note(f"in node {'/'.join(where)!r} of graph {self.graph!r}")

    def fail(self, exc: BaseException, where: tuple[str, ...]) -> None:
        """Fail the whole execution (a latched reliable failure, an observer that raised)."""
        self.epoch += 1
        if self.failure is None:
            if where:
                exc.add_note(f"in node {'/'.join(where)!r} of graph {self.graph!r}")
            self.failure = exc
        if self.scope is not None:
            self.scope.cancel()

    def latch(self, error: CheckpointError) -> CheckpointError:
        """The execution's one failure latch: the first reliable failure stops the whole tree."""
        if self.latched is None:
            self.latched = error
            self.fail(error, ())
        return self.latched

    def latch_any(self, exc: Exception) -> CheckpointError:
        """Latch ``exc`` (a failed node commit, already a latched error when it came through reliable)."""
        return self.latch(exc if isinstance(exc, CheckpointError) else CheckpointError(str(exc)))

    # -- the store ---------------------------------------------------------------------------

    async def reliable(
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
        if self.latched is not None:
            raise self.latched
        assert self.checkpoint is not None
        await accept()  # a cancelled caller starts no reliable operation
        hooks = self.checkpoint.hooks
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
            raise self.latch(CheckpointError(f"{what}: an unexpected scope failure signal ({exc})")) from exc
        except CheckpointError as exc:
            raise self.latch(exc) from None
        except BaseException as exc:
            if not is_fault(exc, shielded=True):
                raise
            raise self.latch(CheckpointError(f"{what} failed: {type(exc).__qualname__}: {exc}")) from exc
        finally:
            self.epoch += 1  # the store's code ran: it may have cancelled a scope around the caller
        return result

    async def open_attempt(
        self, parent: str, node: str, position: int, limit: int, *, checked: bool = False
    ) -> CheckpointAttempt:
        """Open (or reclaim) the attempt of a retry boundary: a node's complete chain, or an aspect's.

        ``checked``: the caller knows it is not cancelled (its level's finding
        holds, :meth:`streams._level.Level.still_clear`), so an attempt of a
        new scope is opened without asking anyio again.
        """
        request = CheckpointAttemptRequest(parent, node, position, limit)
        if self.checkpoint is not None and self.checkpoint.new_scope:
            # nothing of this run is in the store: its first attempt, as the store would answer it
            if self.latched is not None:
                raise self.latched
            if not checked:
                await accept()  # a cancelled caller opens nothing, as in reliable
            return first_attempt(request)
        return await self.reliable("open_attempt", lambda hooks: hooks.open_attempt(request))

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        """Confirm attempt ``scope``'s failure: the boundary's next attempt, or its exhaustion."""
        return await self.reliable("fail_attempt", lambda hooks: hooks.fail_attempt(scope, failure))

    async def _commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        await self.reliable("commit_nodes", lambda hooks: hooks.commit_nodes(commits))
