"""The storage protocol of managed streams."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ._layouts import StreamDescriptor
from ._node_records import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
)
from ._records import (
    AppendBatch,
    GroupChange,
    GroupFrontier,
    KeyedEntry,
    KeyedRange,
    KeyedRead,
    MessageAttempt,
    MessageCommit,
    MessageFail,
    MessageOpen,
    StreamFinish,
    StreamOpen,
    StreamOpened,
    StreamRead,
    StreamRef,
)

__all__ = [
    "STREAM_HOOKS",
    "CheckpointHooks",
    "FollowHooks",
    "GroupHooks",
    "KeyedHooks",
    "StreamHooks",
    "check_stream_hooks",
]

#: The calls a complete set of stream hooks has; checked before any stream is opened on it.
STREAM_HOOKS = ("open", "append", "open_message", "fail_message", "commit", "finish", "describe")


def check_stream_hooks(hooks: object) -> None:
    """Refuse stream hooks that lack a call with :class:`TypeError`, before any call is made."""
    missing = [name for name in STREAM_HOOKS if not callable(getattr(hooks, name, None))]
    if missing:
        raise TypeError(f"stream hooks {hooks!r} lack {', '.join(missing)}: a store implements all seven")


@runtime_checkable
class StreamHooks(Protocol):
    """What a store confirms for managed streams. Every call is one atomic record.

    The engine calls these concurrently from many tasks; a store must be safe
    for that, and run each call isolated from every other: one call at a
    time (one writer), or each in a serializable transaction. A call that
    raises has confirmed nothing, unless the outcome was lost (the process
    died inside it): recovery then reads the ledger, never assumes failure.
    Errors a store raises for records that do not fit its ledger are
    :class:`~streams.CheckpointError` subclasses. :mod:`streams.store` has
    the rules every store applies, written once.
    """

    async def open(self, request: StreamOpen) -> StreamOpened:
        """Open or reclaim the descriptor, tail, frontiers and cursor; raise the generation.

        Known terminals never regress. Reopening an active stream requires
        ``request.resumable``, else :class:`~streams.SourceNotResumableError`.
        """
        ...

    async def append(self, batch: AppendBatch) -> None:
        """Save messages with their cursor before any reader can receive them.

        ``batch.first_seq`` must be the next sequence number.
        """
        ...

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        """Return the message's persistent attempt index and the group's committed state."""
        ...

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        """Confirm a real failed attempt; return the next attempt (maybe exhausted)."""
        ...

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        """Confirm each message's ack, state, results, outputs and stop, in order.

        The batch is all or nothing: if any record does not fit, none is
        confirmed and the error names the first that did not.
        """
        ...

    async def finish(self, request: StreamFinish) -> None:
        """Confirm the writer's terminal result."""
        ...

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        """The stream's descriptor as confirmed, or None if the store never had the stream.

        A read: it raises no generation and changes nothing. The engine
        verifies with it a stream reference it must not open (a restored
        alias of a failed source is never opened).
        """
        ...


@runtime_checkable
class GroupHooks(Protocol):
    """What a store implements so an operator can remove or move consumer groups.

    Optional beside :class:`StreamHooks`; :func:`streams.store.change_group`
    is the rule, written once. :func:`streams.remove_group` and
    :func:`streams.move_group` call it.
    """

    async def change_group(self, change: GroupChange) -> GroupFrontier | None:
        """Apply ``change`` in one transaction; return the moved frontier (None for a removal)."""
        ...


@runtime_checkable
class KeyedHooks(Protocol):
    """What a store implements so handlers can keep state per key (``handle_messages(..., keyed=...)``).

    A commit's :attr:`~streams.store.MessageCommit.keyed` writes are applied by
    :func:`streams.store.commit` with the message's ack; these two calls read
    them back. :func:`streams.store.read_keyed` and
    :func:`streams.store.list_keyed` are the rules, written once. Both only read.
    """

    async def read_keyed(self, request: KeyedRead) -> tuple[bytes | None, ...]:
        """The group's values of ``request.keys`` as its parent attempt sees them, one per key."""
        ...

    async def list_keyed(self, request: KeyedRange) -> tuple[KeyedEntry, ...]:
        """The group's confirmed keys in ``request``'s range, in byte order (an operator's listing)."""
        ...


@runtime_checkable
class FollowHooks(Protocol):
    """What a store implements so a process that did not open a stream can read it as it grows.

    Optional beside :class:`StreamHooks`; :func:`streams.store.read_stream`
    is the rule, written once. A group member in another process than the
    stream's writer reads it with this (:func:`streams.follow_stream`): no
    generation is raised, so the writer is not fenced by its readers.
    """

    async def read_stream(self, request: StreamRead) -> StreamOpened | None:
        """The stream as confirmed, the groups' frontiers, the messages above ``request.after``."""
        ...


@runtime_checkable
class CheckpointHooks(Protocol):
    """What a store implements for node checkpoints; every call is one atomic store transaction.

    Calls may be concurrent and must be concurrency-safe. ``streams`` is the
    store's :class:`StreamHooks`. Errors other than the two signals below
    are reliable failures: the execution stops with :class:`CheckpointError`.
    """

    @property
    def streams(self) -> StreamHooks: ...

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        """Open the boundary's attempt, or reclaim the active one (same scope and index)."""
        ...

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        """Confirm a real failure of attempt ``scope``; returns the next attempt (maybe exhausted).

        ``failure`` says what failed and when, for the boundary's record
        (:attr:`NodeAttemptRecord.failures`); the rules do not depend on it.
        """
        ...

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        """The child scope of a Sub mount under its parent attempt, and that scope's confirmed nodes."""
        ...

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        """Confirm each node's complete record (terminal status, every output, its streams' ends).

        Like the stream hooks' ``commit``, one call confirms a batch (the
        records of nodes that concluded together) in one transaction, all
        or nothing: if any commit is refused, none is confirmed and the
        error names the first refused.
        """
        ...
