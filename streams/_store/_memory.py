"""MemoryStore: the in-process reference implementation of :class:`StreamHooks` and the node hooks.

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

from . import _nodes, _operations
from ._layouts import AttemptRecord, StreamDescriptor
from ._node_records import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    NodeCheckpoint,
)
from ._nodes import NodeAttemptRecord, ScopeRecord
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
    StoredMessage,
    StreamFinish,
    StreamOpen,
    StreamOpened,
    StreamRead,
    StreamRef,
)
from ._view import AttemptKey, CachedView, GroupKey

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

    def _read_keyed(self, ref: StreamRef, group: str, keys: Sequence[bytes]) -> list[bytes | None]:
        stored = self._store._keyed.get((ref, group))
        return [None] * len(keys) if stored is None else [stored.get(key) for key in keys]

    def _clear_keyed(self, groups: Sequence[GroupKey]) -> None:
        for owner in groups:
            self._store._keyed.pop(owner, None)

    def _write_keyed(self, writes: Mapping[GroupKey, Mapping[bytes, bytes | None]]) -> None:
        for owner, keys in writes.items():
            stored = self._store._keyed.setdefault(owner, {})
            for key, value in keys.items():
                if value is None:
                    stored.pop(key, None)
                else:
                    stored[key] = value

    def keyed_range(
        self, ref: StreamRef, group: str, start: bytes, stop: bytes | None, limit: int
    ) -> list[KeyedEntry]:
        stored = self._store._keyed.get((ref, group), {})
        keys = sorted(k for k in stored if k >= start and (stop is None or k < stop))
        return [KeyedEntry(key, stored[key]) for key in keys[:limit]]

    def _delete_budgets(self, groups: Sequence[tuple[StreamRef, str]]) -> None:
        attempts = self._store._attempts
        for key in [k for k in attempts if (k.ref, k.group) in groups]:
            del attempts[key]

    def _write(
        self,
        descriptors: Mapping[StreamRef, StreamDescriptor],
        groups: Mapping[tuple[StreamRef, str], GroupFrontier | None],
        attempts: Mapping[AttemptKey, AttemptRecord | None],
    ) -> None:
        store = self._store
        store._descriptors.update(descriptors)
        for pair, frontier in groups.items():
            if frontier is None:
                store._groups.pop(pair, None)
            else:
                store._groups[pair] = frontier
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


class _NodeOverlay:
    """One node-hook transaction over the store's dicts: writes are kept until merged."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.attempts: dict[tuple[str, str, int], NodeAttemptRecord] = {}
        self.scopes: dict[str, ScopeRecord] = {}
        self.nodes_written: dict[tuple[str, str], NodeCheckpoint] = {}

    def get_attempt(self, parent: str, node: str, position: int) -> NodeAttemptRecord | None:
        key = (parent, node, position)
        return self.attempts.get(key) or self._store._node_attempts.get(key)

    def put_attempt(self, record: NodeAttemptRecord) -> None:
        self.attempts[(record.parent, record.node, record.position)] = record

    def get_scope(self, scope: str) -> ScopeRecord | None:
        return self.scopes.get(scope) or self._store._scopes.get(scope)

    def put_scope(self, scope: str, record: ScopeRecord) -> None:
        self.scopes[scope] = record

    def nodes(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        return tuple(self._store._nodes.get(scope, {}).values())

    def get_node(self, scope: str, node: str) -> NodeCheckpoint | None:
        return self.nodes_written.get((scope, node)) or self._store._nodes.get(scope, {}).get(node)

    def put_node(self, scope: str, checkpoint: NodeCheckpoint) -> None:
        self.nodes_written[(scope, checkpoint.node)] = checkpoint

    def merge(self) -> None:
        store = self._store
        store._node_attempts.update(self.attempts)
        store._scopes.update(self.scopes)
        for (scope, node), record in self.nodes_written.items():
            store._nodes.setdefault(scope, {})[node] = record


class MemoryStore:
    """An in-process store of streams and node checkpoints with the ledger's exact rules.

    It is its own :class:`~streams.StreamHooks` (``store.streams is store``),
    a :class:`~streams.store.CheckpointHooks`, a :class:`~streams.store.GroupHooks`
    and a :class:`~streams.store.KeyedHooks`.
    """

    def __init__(self) -> None:
        self._descriptors: dict[StreamRef, StreamDescriptor] = {}
        self._groups: dict[tuple[StreamRef, str], GroupFrontier] = {}
        self._attempts: dict[AttemptKey, AttemptRecord] = {}
        self._messages: dict[StreamRef, dict[int, bytes]] = {}
        self._keyed: dict[GroupKey, dict[bytes, bytes]] = {}
        self._node_attempts: dict[tuple[str, str, int], NodeAttemptRecord] = {}
        self._scopes: dict[str, ScopeRecord] = {}
        self._nodes: dict[str, dict[str, NodeCheckpoint]] = {}

    @property
    def streams(self) -> MemoryStore:
        return self

    # -- node hooks ------------------------------------------------------------------------

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        overlay = _NodeOverlay(self)
        attempt = _nodes.open_attempt(overlay, request)
        overlay.merge()
        await checkpoint()
        return attempt

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        overlay = _NodeOverlay(self)
        attempt = _nodes.fail_attempt(overlay, scope, failure)
        overlay.merge()
        await checkpoint()
        return attempt

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        overlay = _NodeOverlay(self)
        opened = _nodes.open_child(overlay, child)
        overlay.merge()
        await checkpoint()
        return opened

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        overlay, streams = _NodeOverlay(self), _Overlay(self)
        for commit in commits:
            _nodes.commit_node(overlay, commit)
            for finish in commit.streams:  # the node's streams end in the same transaction as its record
                _operations.finish(streams, finish)
        overlay.merge()
        streams.merge()
        await checkpoint()

    async def node_records(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        """The confirmed nodes of execution scope ``scope`` (a run's root scope, say), for a restore plan."""
        return tuple(self._nodes.get(scope, {}).values())

    async def scope_failed(self, scope: str) -> bool:
        """Whether a final failure was confirmed in execution scope ``scope``."""
        record = self._scopes.get(scope)
        return record is not None and record.failed

    # -- stream hooks ----------------------------------------------------------------------

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

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        desc = _operations.describe(_Overlay(self), ref)
        await checkpoint()
        return desc

    async def read_stream(self, request: StreamRead) -> StreamOpened | None:
        opened = _operations.read_stream(_Overlay(self), request)
        await checkpoint()
        return opened

    async def change_group(self, change: GroupChange) -> GroupFrontier | None:
        overlay = _Overlay(self)
        moved = _operations.change_group(overlay, change)
        overlay.merge()
        await checkpoint()
        return moved

    async def read_keyed(self, request: KeyedRead) -> tuple[bytes | None, ...]:
        values = _operations.read_keyed(_Overlay(self), request)
        await checkpoint()
        return values

    async def list_keyed(self, request: KeyedRange) -> tuple[KeyedEntry, ...]:
        entries = _operations.list_keyed(_Overlay(self), request)
        await checkpoint()
        return entries

    # -- inspection ------------------------------------------------------------------------

    def descriptors(self) -> Iterator[StreamDescriptor]:
        """Every stream descriptor, for inspection and tests."""
        return iter(list(self._descriptors.values()))

    def frontier(self, ref: StreamRef, group: str) -> GroupFrontier | None:
        return self._groups.get((ref, group))

    def stored_messages(self, ref: StreamRef) -> dict[int, bytes]:
        return dict(self._messages.get(ref, {}))
