"""What a store gives the rules: its records, as seen inside one transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from ._layouts import AttemptRecord, StreamDescriptor
from ._records import GroupFrontier, StoredMessage, StreamRef

__all__ = ["AttemptKey", "RecordView"]


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
    def get_attempt(self, key: AttemptKey) -> AttemptRecord | None: ...
    def put_attempt(self, key: AttemptKey, record: AttemptRecord) -> None: ...
    def delete_attempt(self, key: AttemptKey) -> None: ...
    def put_messages(self, ref: StreamRef, first_seq: int, payloads: Sequence[bytes]) -> None: ...
    def messages_after(self, ref: StreamRef, seq: int) -> Iterable[StoredMessage]: ...
    def compact(self, ref: StreamRef, through: int) -> None:
        """Remove every message with a sequence <= ``through``."""
        ...
