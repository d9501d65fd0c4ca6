"""The ledger rules every store applies, kept apart from how a store keeps its records.

:class:`~streams.MemoryStore` and the LMDB ledger hold the same records (a
descriptor per stream, a frontier per group, an attempt count per failed
message) and change them only through these functions, so both enforce the
invariants identically: contiguous sequences, generation fencing, a frontier
that never moves back, budgets that only advance on confirmed failures, and
terminals that do not regress.
"""

from __future__ import annotations

import bisect

import msgspec

from .._errors import (
    PartitionError,
    SequenceError,
    SourceNotResumableError,
    StaleGenerationError,
    StreamFinishedError,
)
from .._type_names import type_differences
from ._layouts import StreamDescriptor
from ._records import GroupFrontier, StreamOpen, StreamRead

__all__ = [
    "FrontierDraft",
    "Subject",
    "check_appendable",
    "check_generation",
    "is_acked",
    "partitioned",
    "reopen",
    "same_type",
    "type_change",
]


def same_type(current: StreamDescriptor, request: StreamOpen | StreamRead) -> bool:
    """Whether the stream holds the messages ``request`` names.

    A descriptor names its message type by its shape (``type_name``) or
    with its module (``legacy_type_name``). Either is the same type.
    """
    return current.type_name in (request.type_name, request.legacy_type_name)


def type_change(held: str, asked: str) -> str:
    """What differs inside the two type names, for a refusal: `` (type Order: field 'note' is new)``."""
    found = type_differences(held, asked)
    return f" ({'; '.join(found)})" if found else ""


def reopen(current: StreamDescriptor | None, request: StreamOpen) -> StreamDescriptor:
    """The descriptor after an open: new at generation 1, or reclaimed one generation up."""
    if current is None:
        return StreamDescriptor(
            ref=request.ref,
            type_name=request.type_name,
            capacity=request.capacity,
            generation=1,
            groups=request.groups,
            retain=request.retain or 0,
            partitions=request.partitions,
        )
    if current.partitions != request.partitions:
        raise PartitionError(
            f"stream {request.ref} is {partitioned(current.partitions)}, but was opened as "
            f"{partitioned(request.partitions)}; a stream keeps its partitions: use a new key or scope"
        )
    if not same_type(current, request):
        raise SourceNotResumableError(
            f"stream {request.ref} holds {current.type_name} messages, but was reopened as "
            f"{request.type_name}{type_change(current.type_name, request.type_name)}; use a new key or scope"
        )
    active = not (current.finished or current.failed)
    if active and not request.resumable:  # also when it sent nothing yet: its writer may have begun
        raise SourceNotResumableError(
            f"stream {request.ref} is still active at sequence {current.appended}; "
            "only a writer opened with resumable=True (continuing from its position) may resume it"
        )
    groups = current.groups + tuple(g for g in request.groups if g not in current.groups)
    return msgspec.structs.replace(
        current,
        generation=current.generation + 1,
        groups=groups,
        capacity=request.capacity,
        retain=current.retain if request.retain is None else request.retain,
    )


def partitioned(partitions: int) -> str:
    """How an error names a stream's partitioning."""
    return f"one of {partitions} partitions" if partitions else "a stream of its own"


class Subject:
    """What an error message is about, formatted only if an error is raised.

    The checks run for every message of a commit batch on the ledger's writer
    thread; formatting their subjects eagerly cost a third of its time.
    """

    __slots__ = ("_action", "_message")

    def __init__(self, action: str, message: object) -> None:
        self._action = action
        self._message = message

    def __str__(self) -> str:
        return f"{self._action} {self._message}"


def check_generation(desc: StreamDescriptor, generation: int, what: object) -> None:
    if generation != desc.generation:
        raise StaleGenerationError(
            f"{what} on stream {desc.ref} carries generation {generation}, "
            f"but the ledger is at generation {desc.generation}; it was fenced off"
        )


def check_appendable(desc: StreamDescriptor, generation: int, first_seq: int, what: object) -> None:
    check_generation(desc, generation, what)
    if desc.finished or desc.failed:
        raise StreamFinishedError(f"{what} on stream {desc.ref}, which is already terminal")
    if first_seq != desc.appended + 1:
        raise SequenceError(
            f"{what} on stream {desc.ref} starts at sequence {first_seq}, "
            f"but the next sequence is {desc.appended + 1}"
        )


def is_acked(frontier: GroupFrontier, seq: int) -> bool:
    if seq <= frontier.acked_through:
        return True
    i = bisect.bisect_left(frontier.acked_above, seq)
    return i < len(frontier.acked_above) and frontier.acked_above[i] == seq


class FrontierDraft:
    """A consumer group's frontier being changed: mutable, turned back into a record at the end.

    The store applies a whole commit batch to one draft per group and writes
    the record once; the engine keeps one per group as its in-memory view.
    """

    __slots__ = (
        "acked_above",
        "acked_through",
        "active_at",
        "attempt",
        "dead_lettered",
        "exhausted",
        "failing",
        "name",
        "results",
        "state",
        "stopped",
    )

    def __init__(self, frontier: GroupFrontier) -> None:
        self.name = frontier.group
        self.acked_through = frontier.acked_through
        self.acked_above: list[int] = list(frontier.acked_above)
        self.state = frontier.state
        self.results: dict[str, bytes] = dict(frontier.results)
        self.stopped = frontier.stopped
        self.exhausted: set[int] = set(frontier.exhausted)
        self.failing: set[int] = set(frontier.failing)
        self.attempt = frontier.attempt
        self.dead_lettered = frontier.dead_lettered
        self.active_at = frontier.active_at

    def own(self, attempt: str) -> None:
        """State and results belong to parent attempt ``attempt`` from now on: another's are dropped.

        A parent attempt that failed leaves its acknowledgements (its messages
        were confirmed, their outputs published) but never its state or results.
        """
        if attempt != self.attempt:
            self.attempt = attempt
            self.state = None
            self.results = {}

    def is_acked(self, seq: int) -> bool:
        if seq <= self.acked_through:
            return True
        above = self.acked_above
        if not above:
            return False
        i = bisect.bisect_left(above, seq)
        return i < len(above) and above[i] == seq

    def ack(self, seq: int) -> None:
        """Acknowledge ``seq``: the frontier advances over every contiguous ack; it never moves back."""
        if seq != self.acked_through + 1:
            if not self.is_acked(seq):
                bisect.insort(self.acked_above, seq)
            return
        through = seq
        above = self.acked_above
        if above:
            i = 0
            while i < len(above) and above[i] == through + 1:
                through += 1
                i += 1
            del above[:i]
        self.acked_through = through

    def record(self) -> GroupFrontier:
        return GroupFrontier(
            group=self.name,
            acked_through=self.acked_through,
            acked_above=tuple(self.acked_above),
            state=self.state,
            results=dict(self.results),
            stopped=self.stopped,
            exhausted=tuple(sorted(self.exhausted)),
            failing=tuple(sorted(self.failing)),
            attempt=self.attempt,
            dead_lettered=self.dead_lettered,
            active_at=self.active_at,
        )


def state_for(frontier: GroupFrontier, attempt: str) -> bytes | None:
    """The group's committed state as parent attempt ``attempt`` sees it: none of another attempt's."""
    return frontier.state if frontier.attempt == attempt else None


def min_frontier(frontiers: list[GroupFrontier], appended: int) -> int:
    """The largest sequence every group still reading has acknowledged (what may be compacted).

    A stopped group reads no more: it holds back neither compaction nor the
    tail a recovery loads. With no group reading, everything appended may go.
    """
    return min((f.acked_through for f in frontiers if not f.stopped), default=appended)


def pending(desc: StreamDescriptor, frontier: GroupFrontier) -> int:
    """Messages appended but not yet acknowledged by the group."""
    return desc.appended - frontier.acked_through - len(frontier.acked_above)
