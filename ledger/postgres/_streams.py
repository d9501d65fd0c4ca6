"""``StreamHooks``, ``GroupHooks`` and ``KeyedHooks`` on a PostgreSQL ledger: each call one transaction."""

from __future__ import annotations

from collections.abc import Sequence

from streams import GroupFrontier, StreamRef, store
from streams.store import (
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
)

from ._store import Calls

__all__ = ["PgStreamHooks"]


class PgStreamHooks:
    """:class:`~streams.StreamHooks` on a PostgreSQL ledger; obtain it as ``ledger.streams``.

    It is a :class:`~streams.store.GroupHooks` and a
    :class:`~streams.store.KeyedHooks` too: the keyed reads run as
    :meth:`describe` does, in the next transaction, and write nothing.
    """

    def __init__(self, connection: Calls) -> None:
        self._connection = connection

    async def open(self, request: StreamOpen) -> StreamOpened:
        return await self._connection.call(lambda view: store.open_stream(view, request))

    async def append(self, batch: AppendBatch) -> None:
        await self._connection.call(lambda view: store.append(view, batch))

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        return await self._connection.call(lambda view: store.open_message(view, request))

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        return await self._connection.call(lambda view: store.fail_message(view, request))

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        batch = tuple(commits)
        await self._connection.call(lambda view: store.commit(view, batch))

    async def finish(self, request: StreamFinish) -> None:
        await self._connection.call(lambda view: store.finish(view, request))

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        return await self._connection.call(lambda view: store.describe(view, ref), idempotent=True)

    async def read_stream(self, request: StreamRead) -> StreamOpened | None:
        return await self._connection.call(lambda view: store.read_stream(view, request), idempotent=True)

    async def change_group(self, change: GroupChange) -> GroupFrontier | None:
        return await self._connection.call(lambda view: store.change_group(view, change))

    async def read_keyed(self, request: KeyedRead) -> tuple[bytes | None, ...]:
        return await self._connection.call(lambda view: store.read_keyed(view, request), idempotent=True)

    async def list_keyed(self, request: KeyedRange) -> tuple[KeyedEntry, ...]:
        return await self._connection.call(lambda view: store.list_keyed(view, request), idempotent=True)
