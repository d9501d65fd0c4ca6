"""What a store gives the rules: its records, as seen inside one transaction."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from ._layouts import AttemptRecord, StreamDescriptor
from ._records import GroupFrontier, KeyedEntry, StoredMessage, StreamRef

__all__ = ["AttemptKey", "CachedView", "GroupKey", "RecordView"]

#: A consumer group of one stream: the owner of a frontier and of a keyed state.
GroupKey = tuple[StreamRef, str]


class AttemptKey(NamedTuple):
    """The identity of a message's budget: which message, handled by which node, under which attempt."""

    ref: StreamRef
    group: str
    seq: int
    node: str
    parent_attempt: str


class RecordView(Protocol):
    """A store's records as seen inside one transaction.

    The rules (:mod:`streams.store` operations) read and write through it;
    the store runs each hook call as one transaction and commits it only if
    the operation returned. The transaction must be isolated from every other
    call's: run calls one at a time (one writer), or at serializable
    isolation. A call that raised must leave nothing behind.
    """

    def get_descriptor(self, ref: StreamRef) -> StreamDescriptor | None: ...
    def put_descriptor(self, desc: StreamDescriptor) -> None: ...
    def get_group(self, ref: StreamRef, group: str) -> GroupFrontier | None: ...
    def put_group(self, ref: StreamRef, frontier: GroupFrontier) -> None: ...
    def delete_group(self, ref: StreamRef, group: str) -> None: ...
    def get_attempt(self, key: AttemptKey) -> AttemptRecord | None: ...
    def put_attempt(self, key: AttemptKey, record: AttemptRecord) -> None: ...
    def delete_attempt(self, key: AttemptKey) -> None: ...
    def delete_budgets(self, ref: StreamRef, group: str) -> None:
        """Delete every message budget of ``group`` on ``ref`` (of every node and parent attempt)."""
        ...

    def get_keyed(self, ref: StreamRef, group: str, keys: Sequence[bytes]) -> Sequence[bytes | None]:
        """The values of ``keys`` in the group's keyed state, one per key, None for a key it lacks."""
        ...

    def put_keyed(self, ref: StreamRef, group: str, key: bytes, value: bytes | None) -> None:
        """Set ``key`` of the group's keyed state, or delete it (``value`` None)."""
        ...

    def clear_keyed(self, ref: StreamRef, group: str) -> None:
        """Delete every key of the group's keyed state."""
        ...

    def keyed_range(
        self, ref: StreamRef, group: str, start: bytes, stop: bytes | None, limit: int
    ) -> Sequence[KeyedEntry]:
        """Up to ``limit`` keys of the group's keyed state, ``start`` to ``stop`` (excluded), by bytes."""
        ...

    def put_messages(self, ref: StreamRef, first_seq: int, payloads: Sequence[bytes]) -> None: ...
    def messages_after(self, ref: StreamRef, seq: int) -> Iterable[StoredMessage]: ...
    def compact(self, ref: StreamRef, through: int) -> None:
        """Remove every message with a sequence <= ``through``."""
        ...

    def load(
        self,
        descriptors: Iterable[StreamRef] = (),
        groups: Iterable[tuple[StreamRef, str]] = (),
        attempts: Iterable[AttemptKey] = (),
    ) -> None:
        """Read the named records ahead, in as few round trips as the store can (a hint, never needed)."""
        ...


class CachedView(abc.ABC):
    """The shared base of record views: every record read or written is cached; reads come in batches.

    A store subclasses it and supplies, for its own transaction, batched raw
    reads (:meth:`_read_descriptors`, :meth:`_read_groups`,
    :meth:`_read_attempts`, :meth:`_read_keyed`, one answer per key, None
    when absent), the raw writes :meth:`_write` and :meth:`_write_keyed`
    make once when the call ends (after :meth:`_delete_budgets` and
    :meth:`_clear_keyed`, for the groups an operator removed or moved or
    that a new parent attempt took over), and the message methods and
    :meth:`keyed_range` of :class:`RecordView`. The operations call :meth:`load` first,
    with every record the call will touch that its request names, so a
    store across a network pays one or two round trips a call; whatever is
    read later (a retried message's budget, a stream's other groups before
    compaction) is read one key at a time. Changed descriptors, frontiers
    and budgets are written once each, by :meth:`flush`.
    """

    __slots__ = (
        "_attempts",
        "_cleared_keyed",
        "_descriptors",
        "_dirty_attempts",
        "_dirty_descriptors",
        "_dirty_groups",
        "_dropped_budgets",
        "_groups",
        "_keyed",
    )

    def __init__(self) -> None:
        self._descriptors: dict[StreamRef, StreamDescriptor | None] = {}
        self._groups: dict[tuple[StreamRef, str], GroupFrontier | None] = {}
        self._attempts: dict[AttemptKey, AttemptRecord | None] = {}
        self._dirty_descriptors: dict[StreamRef, None] = {}
        self._dirty_groups: dict[tuple[StreamRef, str], None] = {}
        self._dirty_attempts: dict[AttemptKey, None] = {}
        self._dropped_budgets: dict[tuple[StreamRef, str], None] = {}
        #: Keyed writes not yet made, per group (None deletes); and the groups whose stored keys go first.
        self._keyed: dict[GroupKey, dict[bytes, bytes | None]] = {}
        self._cleared_keyed: dict[GroupKey, None] = {}

    # -- what a store supplies ---------------------------------------------------------------

    @abc.abstractmethod
    def _read_descriptors(self, refs: Sequence[StreamRef]) -> Sequence[StreamDescriptor | None]:
        """One answer per key, in order; None for a record the store does not hold."""

    @abc.abstractmethod
    def _read_groups(self, keys: Sequence[tuple[StreamRef, str]]) -> Sequence[GroupFrontier | None]:
        """One answer per key, in order; None for a record the store does not hold."""

    @abc.abstractmethod
    def _read_attempts(self, keys: Sequence[AttemptKey]) -> Sequence[AttemptRecord | None]:
        """One answer per key, in order; None for a record the store does not hold."""

    @abc.abstractmethod
    def _read_keyed(self, ref: StreamRef, group: str, keys: Sequence[bytes]) -> Sequence[bytes | None]:
        """The stored values of ``keys`` in the group's keyed state, in order; None for a key it lacks."""

    @abc.abstractmethod
    def _clear_keyed(self, groups: Sequence[GroupKey]) -> None:
        """Delete every stored key of each group's keyed state."""

    @abc.abstractmethod
    def _write_keyed(self, writes: Mapping[GroupKey, Mapping[bytes, bytes | None]]) -> None:
        """Set each key of each group's keyed state; a key mapped to None is deleted."""

    @abc.abstractmethod
    def _delete_budgets(self, groups: Sequence[tuple[StreamRef, str]]) -> None:
        """Delete every stored message budget of each group (of every node and parent attempt)."""

    @abc.abstractmethod
    def _write(
        self,
        descriptors: Mapping[StreamRef, StreamDescriptor],
        groups: Mapping[tuple[StreamRef, str], GroupFrontier | None],
        attempts: Mapping[AttemptKey, AttemptRecord | None],
    ) -> None:
        """Write what the call changed; a frontier or budget mapped to None is deleted."""

    # -- batches -----------------------------------------------------------------------------

    def load(
        self,
        descriptors: Iterable[StreamRef] = (),
        groups: Iterable[tuple[StreamRef, str]] = (),
        attempts: Iterable[AttemptKey] = (),
    ) -> None:
        """Read every named record not read yet, one batch per kind."""
        refs = [ref for ref in dict.fromkeys(descriptors) if ref not in self._descriptors]
        if refs:
            self._descriptors.update(zip(refs, self._read_descriptors(refs), strict=True))
        pairs = [key for key in dict.fromkeys(groups) if key not in self._groups]
        if pairs:
            self._groups.update(zip(pairs, self._read_groups(pairs), strict=True))
        keys = [
            key
            for key in dict.fromkeys(attempts)
            if key not in self._attempts and (key.ref, key.group) not in self._dropped_budgets
        ]
        if keys:
            self._attempts.update(zip(keys, self._read_attempts(keys), strict=True))

    def flush(self) -> None:
        """Delete dropped groups' budgets and keyed states, then write each changed record once."""
        if self._dropped_budgets:
            dropped = list(self._dropped_budgets)
            self._dropped_budgets.clear()
            self._delete_budgets(dropped)
        if self._cleared_keyed:
            cleared = list(self._cleared_keyed)
            self._cleared_keyed.clear()
            self._clear_keyed(cleared)
        if self._keyed:
            keyed, self._keyed = self._keyed, {}
            self._write_keyed(keyed)
        if not (self._dirty_descriptors or self._dirty_groups or self._dirty_attempts):
            return
        descriptors = {ref: self._descriptors[ref] for ref in self._dirty_descriptors}
        groups = {key: self._groups[key] for key in self._dirty_groups}
        attempts = {key: self._attempts[key] for key in self._dirty_attempts}
        self._dirty_descriptors.clear()
        self._dirty_groups.clear()
        self._dirty_attempts.clear()
        self._write(descriptors, groups, attempts)  # type: ignore[arg-type]  # dirty means written

    # -- RecordView ----------------------------------------------------------------------------

    def get_descriptor(self, ref: StreamRef) -> StreamDescriptor | None:
        try:
            return self._descriptors[ref]
        except KeyError:
            desc = self._descriptors[ref] = self._read_descriptors((ref,))[0]
            return desc

    def put_descriptor(self, desc: StreamDescriptor) -> None:
        self._descriptors[desc.ref] = desc
        self._dirty_descriptors[desc.ref] = None

    def get_group(self, ref: StreamRef, group: str) -> GroupFrontier | None:
        key = (ref, group)
        try:
            return self._groups[key]
        except KeyError:
            frontier = self._groups[key] = self._read_groups((key,))[0]
            return frontier

    def put_group(self, ref: StreamRef, frontier: GroupFrontier) -> None:
        key = (ref, frontier.group)
        self._groups[key] = frontier
        self._dirty_groups[key] = None

    def delete_group(self, ref: StreamRef, group: str) -> None:
        key = (ref, group)
        self._groups[key] = None
        self._dirty_groups[key] = None

    def get_attempt(self, key: AttemptKey) -> AttemptRecord | None:
        try:
            return self._attempts[key]
        except KeyError:
            dropped = self._dropped_budgets and (key.ref, key.group) in self._dropped_budgets
            record = self._attempts[key] = None if dropped else self._read_attempts((key,))[0]
            return record

    def put_attempt(self, key: AttemptKey, record: AttemptRecord) -> None:
        self._attempts[key] = record
        self._dirty_attempts[key] = None

    def delete_attempt(self, key: AttemptKey) -> None:
        self._attempts[key] = None
        self._dirty_attempts[key] = None

    def get_keyed(self, ref: StreamRef, group: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Its own writes first; nothing stored once this call cleared the group."""
        owner = (ref, group)
        written = self._keyed.get(owner)
        if owner in self._cleared_keyed:
            return [None if written is None else written.get(key) for key in keys]
        if not written:
            return list(self._read_keyed(ref, group, keys))
        missing = [key for key in keys if key not in written]
        stored = dict(zip(missing, self._read_keyed(ref, group, missing), strict=True)) if missing else {}
        return [written[key] if key in written else stored[key] for key in keys]

    def put_keyed(self, ref: StreamRef, group: str, key: bytes, value: bytes | None) -> None:
        owner = (ref, group)
        written = self._keyed.get(owner)
        if written is None:
            written = self._keyed[owner] = {}
        written[key] = value

    def clear_keyed(self, ref: StreamRef, group: str) -> None:
        """Forget the group's keyed state: writes made in this call now, stored keys when it ends (first)."""
        owner = (ref, group)
        self._keyed.pop(owner, None)
        self._cleared_keyed[owner] = None

    def delete_budgets(self, ref: StreamRef, group: str) -> None:
        """Forget the group's budgets: cached ones now, stored ones when the call ends (first)."""
        for key in [k for k in self._attempts if k.ref == ref and k.group == group]:
            del self._attempts[key]
            self._dirty_attempts.pop(key, None)
        self._dropped_budgets[(ref, group)] = None
