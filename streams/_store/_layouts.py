"""The records a store keeps besides the hooks' own: a descriptor per stream, a budget per failed message.

Stores persist these as they are (the LMDB ledger as msgpack, see
:mod:`ledger.lmdb._layout`); the rules read and write them through a
:class:`~streams.store.RecordView`. Consumer-group frontiers are kept as the
hooks' own :class:`~streams.GroupFrontier`.
"""

from __future__ import annotations

import msgspec

from ._records import StreamRef

__all__ = ["AttemptRecord", "StreamDescriptor"]


class StreamDescriptor(msgspec.Struct, frozen=True, gc=False):
    """A stream's persistent descriptor."""

    ref: StreamRef
    type_name: str
    capacity: int
    generation: int
    groups: tuple[str, ...]
    appended: int = 0
    position: int | None = None
    finished: bool = False
    failed: bool = False
    compacted_through: int = 0  # every seq <= it was acknowledged by every group and removed
    format: int = 1
    retain: int = 0  # acknowledged messages kept for groups added later (the last ``retain`` appended)
    partitions: int = 0  # one of this many partitions of a partitioned stream; 0: not partitioned
    #: When messages were appended: flat ``(seq, unix ms)`` pairs (:mod:`streams._store._marks`);
    #: empty in a descriptor that holds none.
    marks: tuple[int, ...] = ()


class AttemptRecord(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A message's budget in one group, kept while it has confirmed failures and is not acknowledged:
    how many attempts failed, whether the budget is used up, and when and how the last one failed."""

    failures: int
    exhausted: bool
    failed_at: float = 0.0  # when the last failure was confirmed (Unix seconds)
    error_type: str = ""  # the type of the last failure's error
