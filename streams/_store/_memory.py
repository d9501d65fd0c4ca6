"""MemoryStore: the in-process reference implementation of :class:`StreamHooks`.

It proves in-process contracts only: its records live as long as the object.
Like the LMDB ledger, a call that was made is applied even if its caller is
cancelled while waiting for the answer.
Dropping every endpoint and opening them again on the same store is how the
tests model a crash. Each call applies to a private overlay of the records and
is merged only if the whole call succeeded, exactly as a store transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from anyio.lowlevel import checkpoint

from . import _operations
from ._layouts import AttemptRecord, StreamDescriptor
from ._records import (
    AppendBatch,
    GroupFrontier,
    MessageAttempt,
    MessageCommit,
    MessageFail,
    MessageOpen,
    StoredMessage,
    StreamFinish,
    StreamOpen,
    StreamOpened,
    StreamRef,
)
from ._view import AttemptKey

__all__ = ["MemoryStore"]

_DELETED = object()


class _Overlay:
    """One transaction over the store's dicts: reads fall through, writes stay until merged."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.descriptors: dict[StreamRef, StreamDescriptor] = {}
        self.groups: dict[tuple[StreamRef, str], GroupFrontier] = {}
        self.attempts: dict[AttemptKey, AttemptRecord | object] = {}
        self.messages: dict[StreamRef, dict[int, bytes]] = {}
        self.compacted: dict[StreamRef, int] = {}

    def get_descriptor(self, ref: StreamRef) -> StreamDescriptor | None:
        return self.descriptors.get(ref) or self._store._descriptors.get(ref)

    def put_descriptor(self, desc: StreamDescriptor) -> None:
        self.descriptors[desc.ref] = desc

    def get_group(self, ref: StreamRef, group: str) -> GroupFrontier | None:
        key = (ref, group)
        return self.groups.get(key) or self._store._groups.get(key)

    def put_group(self, ref: StreamRef, frontier: GroupFrontier) -> None:
        self.groups[(ref, frontier.group)] = frontier

    def get_attempt(self, key: AttemptKey) -> AttemptRecord | None:
        record = self.attempts.get(key, self._store._attempts.get(key))
        return record if isinstance(record, AttemptRecord) else None

    def put_attempt(self, key: AttemptKey, record: AttemptRecord) -> None:
        self.attempts[key] = record

    def delete_attempt(self, key: AttemptKey) -> None:
        self.attempts[key] = _DELETED

    def put_messages(self, ref: StreamRef, first_seq: int, payloads: Sequence[bytes]) -> None:
        target = self.messages.setdefault(ref, {})
        for i, payload in enumerate(payloads):
            target[first_seq + i] = payload

    def messages_after(self, ref: StreamRef, seq: int) -> Iterable[StoredMessage]:
        merged = {**self._store._messages.get(ref, {}), **self.messages.get(ref, {})}
        floor = max(seq, self.compacted.get(ref, 0))
        return [StoredMessage(s, merged[s]) for s in sorted(merged) if s > floor]

    def compact(self, ref: StreamRef, through: int) -> None:
        self.compacted[ref] = max(through, self.compacted.get(ref, 0))

    def merge(self) -> None:
        store = self._store
        store._descriptors.update(self.descriptors)
        store._groups.update(self.groups)
        for key, record in self.attempts.items():
            if isinstance(record, AttemptRecord):
                store._attempts[key] = record
            else:
                store._attempts.pop(key, None)
        for ref, messages in self.messages.items():
            store._messages.setdefault(ref, {}).update(messages)
        for ref, through in self.compacted.items():
            kept = store._messages.get(ref, {})
            for seq in [s for s in kept if s <= through]:
                del kept[seq]


class MemoryStore:
    """An in-process :class:`~streams.StreamHooks` store with the ledger's exact rules."""

    def __init__(self) -> None:
        self._descriptors: dict[StreamRef, StreamDescriptor] = {}
        self._groups: dict[tuple[StreamRef, str], GroupFrontier] = {}
        self._attempts: dict[AttemptKey, AttemptRecord] = {}
        self._messages: dict[StreamRef, dict[int, bytes]] = {}

    async def open(self, request: StreamOpen) -> StreamOpened:
        overlay = _Overlay(self)
        opened = _operations.open_stream(overlay, request)
        overlay.merge()
        await checkpoint()
        return opened

    async def append(self, batch: AppendBatch) -> None:
        overlay = _Overlay(self)
        _operations.append(overlay, batch)
        overlay.merge()
        await checkpoint()

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        attempt = _operations.open_message(_Overlay(self), request)
        await checkpoint()
        return attempt

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        overlay = _Overlay(self)
        attempt = _operations.fail_message(overlay, request)
        overlay.merge()
        await checkpoint()
        return attempt

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        overlay = _Overlay(self)
        _operations.commit(overlay, commits)
        overlay.merge()
        await checkpoint()

    async def finish(self, request: StreamFinish) -> None:
        overlay = _Overlay(self)
        _operations.finish(overlay, request)
        overlay.merge()
        await checkpoint()

    # -- inspection ------------------------------------------------------------------------

    def descriptors(self) -> Iterator[StreamDescriptor]:
        """Every stream descriptor, for inspection and tests."""
        return iter(list(self._descriptors.values()))

    def frontier(self, ref: StreamRef, group: str) -> GroupFrontier | None:
        return self._groups.get((ref, group))

    def stored_messages(self, ref: StreamRef) -> dict[int, bytes]:
        return dict(self._messages.get(ref, {}))
