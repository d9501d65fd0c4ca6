"""MemoryStore: the in-process reference implementation of :class:`StreamHooks`.

It proves in-process contracts only: its records live as long as the object.
Like the LMDB ledger, a call that was made is applied even if its caller is
cancelled while waiting for the answer.
Dropping every endpoint and opening them again on the same store is how the
tests model a crash. Each call applies to a private overlay of the records and
is merged only if the whole call succeeded, exactly as a store transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

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
from ._view import AttemptKey, CachedView

__all__ = ["MemoryStore"]


class _Overlay(CachedView):
    """One transaction over the store's dicts: reads fall through, writes stay until merged."""

    __slots__ = ("_store", "compacted", "messages")

    def __init__(self, store: MemoryStore) -> None:
        super().__init__()
        self._store = store
        self.messages: dict[StreamRef, dict[int, bytes]] = {}
        self.compacted: dict[StreamRef, int] = {}

    def _read_descriptors(self, refs: Sequence[StreamRef]) -> list[StreamDescriptor | None]:
        return [self._store._descriptors.get(ref) for ref in refs]

    def _read_groups(self, keys: Sequence[tuple[StreamRef, str]]) -> list[GroupFrontier | None]:
        return [self._store._groups.get(key) for key in keys]

    def _read_attempts(self, keys: Sequence[AttemptKey]) -> list[AttemptRecord | None]:
        return [self._store._attempts.get(key) for key in keys]

    def _write(
        self,
        descriptors: Mapping[StreamRef, StreamDescriptor],
        groups: Mapping[tuple[StreamRef, str], GroupFrontier],
        attempts: Mapping[AttemptKey, AttemptRecord | None],
    ) -> None:
        store = self._store
        store._descriptors.update(descriptors)
        store._groups.update(groups)
        for key, record in attempts.items():
            if record is None:
                store._attempts.pop(key, None)
            else:
                store._attempts[key] = record

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
        """Apply the call to the store: it succeeded as a whole."""
        self.flush()
        store = self._store
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
