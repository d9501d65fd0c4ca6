"""Partitioned streams: one logical stream split by a key of its messages into N streams of their own.

Partition ``p`` of stream ``key`` is the stream ``key#p`` of the same scope
and writer node, with everything a stream has: its own contiguous
sequence, a frontier, budgets, state and keyed state per group, and
compaction. An append goes to its key's partition (the first 8 bytes of
the BLAKE2b digest of the key's MessagePack, modulo the partitions: the
same in every process and spread evenly whatever the keys look like), so
messages of one key keep their order and messages of different keys need
not. Each partition's
descriptor records how many partitions the stream has, and a store refuses
to open it with another number (:class:`~streams.PartitionError`).

A writer continues a resumable partitioned stream from :attr:`PartitionedWriter.position`,
the lowest cursor any partition confirmed; a message it sends again whose
partition already confirmed (or, in this process, queued) a cursor at or
past its ``send_at`` is skipped, so a resumed source appends each message
exactly once. ``send_at`` must grow from message to message, as the cursor
of a source does.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from ._errors import PartitionError, PayloadTypeError
from ._keys import Key, Stream
from ._store._records import StreamRef, partition_name
from ._stream import ManagedStream, StreamReader, StreamSnapshot, StreamWriter

__all__ = [
    "PartitionedReader",
    "PartitionedStream",
    "PartitionedWriter",
    "partition_for",
    "partition_name",
    "partitions_of",
]

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def partition_for(key: Any, partitions: int) -> int:
    """The partition of ``partitions`` that messages of partition key ``key`` go to.

    The first 8 bytes of the BLAKE2b digest of ``key``'s MessagePack, modulo
    ``partitions``: the same in every process, so a reader that has only the
    key (``python -m ledger messages --key``) finds the partition a writer chose.
    Raises :class:`TypeError` (or :class:`msgspec.EncodeError`) for a key MessagePack cannot encode.
    """
    return int.from_bytes(blake2b(_encoder.encode(key), digest_size=8).digest(), "big") % partitions


def partitions_of(stream: ManagedStream[T] | PartitionedStream[T]) -> tuple[ManagedStream[T], ...]:
    """The streams that hold ``stream``'s messages: its partitions, or the stream itself."""
    return stream.partitions if isinstance(stream, PartitionedStream) else (stream,)


class PartitionedStream(Generic[T]):
    """A stream of ``len(partitions)`` partitions. Obtain it from :meth:`StreamScope.open_partitioned`."""

    __slots__ = ("_sent", "key", "partition_key", "partitions", "ref")

    def __init__(
        self,
        key: Key[Stream[T]],
        ref: StreamRef,
        partitions: tuple[ManagedStream[T], ...],
        partition_key: Callable[[T], Any],
    ) -> None:
        self.key = key
        #: The logical stream: its partitions are ``ref`` with the key ``key#p``.
        self.ref = ref
        self.partitions = partitions
        self.partition_key = partition_key
        # the highest cursor each partition confirmed when it was opened, or was queued since: a
        # send at or below it is skipped (it is appended, or queued to be)
        self._sent: list[int] = [p.position or 0 for p in partitions]

    def __repr__(self) -> str:
        return f"PartitionedStream({self.ref}, partitions={len(self.partitions)})"

    def partition_of(self, value: T) -> int:
        """The partition ``value`` goes to: its key's digest, modulo the partitions."""
        try:
            return partition_for(self.partition_key(value), len(self.partitions))
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise PayloadTypeError(
                f"the partition key of a message of stream {self.ref} cannot be encoded ({exc}); "
                "nothing was sent"
            ) from None

    @property
    def done(self) -> bool:
        """Whether every partition's writer finished or failed."""
        return all(p.done for p in self.partitions)

    @property
    def finished(self) -> bool:
        return all(p.finished for p in self.partitions)

    @property
    def failed(self) -> bool:
        return any(p.failed for p in self.partitions)

    def snapshot(self) -> tuple[StreamSnapshot, ...]:
        """A values-free view of every partition, in order."""
        return tuple(p.snapshot() for p in self.partitions)

    def writer(self) -> PartitionedWriter[T]:
        """The writer handle: each send goes to its key's partition."""
        return PartitionedWriter(self)

    def reader(self, group: str) -> PartitionedReader[T]:
        """The readers of consumer ``group``, one per partition: give it to :func:`handle_messages`."""
        return PartitionedReader(self, group)


class PartitionedWriter(Generic[T]):
    """The send end of a partitioned stream: each message goes to its key's partition."""

    __slots__ = ("_stream", "_writers")

    def __init__(self, stream: PartitionedStream[T]) -> None:
        self._stream = stream
        self._writers: tuple[StreamWriter[T], ...] = tuple(p.writer() for p in stream.partitions)

    @property
    def stream(self) -> PartitionedStream[T]:
        return self._stream

    @property
    def position(self) -> int | None:
        """Where a resumed source continues: the lowest ``send_at`` cursor a partition confirmed.

        None while some partition confirmed none. Messages sent again from
        there that a partition already confirmed (or queued) are skipped.
        """
        positions = [p.position for p in self._stream.partitions]
        return None if any(p is None for p in positions) else min(p for p in positions if p is not None)

    @property
    def done(self) -> bool:
        return self._stream.done

    async def send(self, value: T, *, send_at: int | None = None) -> None:
        """Queue ``value`` on its key's partition (:meth:`StreamWriter.send`); a checkpoint.

        With ``send_at`` at or below the cursor its partition confirmed or
        queued, the message was sent before: it is skipped.
        """
        partition = self._stream.partition_of(value)
        sent = self._stream._sent
        if send_at is not None and send_at <= sent[partition]:
            await anyio.lowlevel.checkpoint()
            return
        await self._writers[partition].send(value, send_at=send_at)
        if send_at is not None:
            sent[partition] = send_at

    def send_nowait(self, value: T, *, send_at: int | None = None) -> None:
        """Queue ``value`` on its key's partition without yielding (:meth:`StreamWriter.send_nowait`)."""
        partition = self._stream.partition_of(value)
        sent = self._stream._sent
        if send_at is not None and send_at <= sent[partition]:
            return
        self._writers[partition].send_nowait(value, send_at=send_at)
        if send_at is not None:
            sent[partition] = send_at

    async def flush(self) -> None:
        """Wait until every message sent so far, to every partition, is confirmed."""
        for writer in self._writers:
            await writer.flush()

    async def finish(self) -> None:
        """Confirm every partition's successful end."""
        for writer in self._writers:
            await writer.finish()

    async def fail(self) -> None:
        """Confirm every partition's failure."""
        for writer in self._writers:
            await writer.fail()


class PartitionedReader(Generic[T]):
    """A consumer group of a partitioned stream: a :class:`StreamReader` per partition."""

    __slots__ = ("group", "partitions", "stream")

    def __init__(self, stream: PartitionedStream[T], group: str) -> None:
        self.stream = stream
        self.group = group
        self.partitions: tuple[StreamReader[T], ...] = tuple(p.reader(group) for p in stream.partitions)

    def __repr__(self) -> str:
        return f"PartitionedReader({self.stream.ref}, group={self.group!r})"


def check_endpoint(key: Key[Any], partitioned: bool, plain: str, split: str) -> None:
    """Refuse a plain endpoint (asked by ``plain``) of a partitioned stream key, or a partitioned one
    (asked by ``split``) of a key without partitions, with :class:`PartitionError`."""
    if key.partitions is not None and not partitioned:
        raise PartitionError(
            f"{key!r} is a partitioned stream: its endpoints are given by {split}, not {plain}"
        )
    if key.partitions is None and partitioned:
        raise PartitionError(
            f"{key!r} is not a partitioned stream: its endpoints are given by {plain}, not {split}"
        )
