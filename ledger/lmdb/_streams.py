"""``StreamHooks`` on the LMDB ledger.

The store logic lives once in :mod:`streams.store`; :mod:`ledger.lmdb._view`
supplies its :class:`~streams.store.RecordView` over an LMDB transaction,
and this module runs every hook call as one write of the group committer
(``open_message``, ``describe``, ``read_keyed`` and ``list_keyed`` only
read and run inline on a read transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from streams import GroupFrontier, StreamRef, store
from streams.store import (
    ATTR,
    SPAN,
    AppendBatch,
    GroupChange,
    KeyedEntry,
    KeyedRange,
    KeyedRead,
    MessageAttempt,
    MessageCommit,
    MessageFail,
    MessageOpen,
    StreamDescriptor,
    StreamFinish,
    StreamOpen,
    StreamOpened,
    StreamRead,
    span,
)

from ._env import LedgerEnv
from ._view import LmdbView

__all__ = ["LmdbStreamHooks"]

T = TypeVar("T")


class LmdbStreamHooks:
    """:class:`~streams.StreamHooks` on an open :class:`~ledger.LedgerEnv`.

    Every call but ``open_message``, ``describe``, ``read_keyed`` and ``list_keyed`` is one
    write of the group committer, so it is atomic and shares an fsync with every concurrent
    write. Obtain it as ``ledger.streams``.
    """

    def __init__(self, env: LedgerEnv) -> None:
        self.env = env
        names = ("streams", "messages", "groups", "attempts", "meta", "keyed", "keyed_log")
        optional = ("keyed", "keyed_log")  # an older schema's ledger, read-only
        self._dbs = {name: env.db(name) for name in names if name not in optional or env.has_db(name)}
        self._ids: dict[StreamRef, int] = {}
        self._logs = env.keyed_logs

    def bind(self, txn: Any) -> LmdbView:
        """A view of the stream records inside another hook's write transaction (a node commit's)."""
        return LmdbView(txn, self._dbs, self._ids, logs=self._logs, writer=True)

    def forget(self, refs: Iterable[StreamRef]) -> None:
        """Forget the ids of ``refs``: their streams were deleted, and a stream opened again gets a new id."""
        for ref in refs:
            stream_id = self._ids.pop(ref, None)
            if stream_id is not None:
                self._logs.forget(stream_id)

    def learn(self, view: LmdbView) -> None:
        """Keep the stream ids ``view`` assigned, once its transaction committed."""
        if view.ids:
            self._ids.update(view.ids)

    async def _write(self, op: Callable[[LmdbView], T]) -> tuple[T, int]:
        dbs, known, logs = self._dbs, self._ids, self._logs

        def run(txn: Any) -> tuple[T, int, dict[StreamRef, int]]:
            view = LmdbView(txn, dbs, known, logs=logs, writer=True)
            result = op(view)
            view.flush()
            return result, view.reads, view.ids

        result, reads, ids = await self.env.write(run)
        if ids:
            self._ids.update(ids)
        return result, reads

    async def open(self, request: StreamOpen) -> StreamOpened:
        """Open or reclaim a stream: descriptor, frontiers and unacknowledged tail only."""
        with span(
            SPAN.RECOVER,
            {
                ATTR.STREAM_SCOPE: request.ref.scope,
                ATTR.STREAM_NODE: request.ref.node,
                ATTR.STREAM_KEY: request.ref.key,
            },
        ) as current:
            opened, reads = await self._write(lambda view: store.open_stream(view, request))
            if current.is_recording():
                current.set_attributes(
                    {
                        ATTR.GENERATION: opened.generation,
                        ATTR.APPENDED: opened.appended,
                        ATTR.TAIL: len(opened.tail),
                        ATTR.CREATED: opened.created,
                        ATTR.RECORDS_READ: reads,
                    }
                )
            return opened

    async def append(self, batch: AppendBatch) -> None:
        """Save messages and their cursor in one write."""
        await self._write(lambda view: store.append(view, batch))

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        """Read the message's budget and the group's state inline; never waits on the writer."""
        return self._read(lambda view: store.open_message(view, request))

    def _read(self, fn: Callable[[LmdbView], T]) -> T:
        """``fn`` over one read transaction, inline; the stream ids it resolved are kept for the next."""
        with self.env.read() as txn:
            view = LmdbView(txn, self._dbs, self._ids, logs=self._logs)
            result = fn(view)
        if view.ids:
            self._ids.update(view.ids)
        return result

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        """Confirm a failed attempt in one write and return the next attempt."""
        attempt, _ = await self._write(lambda view: store.fail_message(view, request))
        return attempt

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        """Confirm every commit in one write: all of them or none."""
        batch = tuple(commits)
        await self._write(lambda view: store.commit(view, batch))

    async def finish(self, request: StreamFinish) -> None:
        """Confirm the writer's terminal in one write."""
        await self._write(lambda view: store.finish(view, request))

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        """Read the stream's descriptor inline; never waits on the writer, raises no generation."""
        return self._read(lambda view: store.describe(view, ref))

    async def read_stream(self, request: StreamRead) -> StreamOpened | None:
        """Read a stream and its groups' frontiers inline; never waits on the writer, raises no generation."""
        return self._read(lambda view: store.read_stream(view, request))

    async def read_keyed(self, request: KeyedRead) -> tuple[bytes | None, ...]:
        """Read keys of a group's keyed state inline; never waits on the writer."""
        return self._read(lambda view: store.read_keyed(view, request))

    async def list_keyed(self, request: KeyedRange) -> tuple[KeyedEntry, ...]:
        """List a group's keyed state in key order inline; never waits on the writer."""
        return self._read(lambda view: store.list_keyed(view, request))

    async def change_group(self, change: GroupChange) -> GroupFrontier | None:
        """Remove or move a consumer group in one write (see :class:`~streams.store.GroupChange`)."""
        moved, _ = await self._write(lambda view: store.change_group(view, change))
        return moved
