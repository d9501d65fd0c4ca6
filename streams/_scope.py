"""StreamScope: where managed streams of one persistent scope are opened and shared."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import anyio
import anyio.abc

from ._errors import PartitionError, ScopeInUseError, StreamStateError
from ._keys import Key, Stream, check_name
from ._partition_rules import check_partitions
from ._partitions import PartitionedStream, partition_name
from ._store._hooks import StreamHooks, check_stream_hooks
from ._store._records import StreamOpen, StreamRef
from ._stream import ManagedStream, StreamCore, core_of
from ._tracing import ATTR, EVENT, SPAN, span
from ._type_names import qualified_type_name, type_name
from ._unwrap import single_error

__all__ = ["StreamScope", "open_scope"]

T = TypeVar("T")


class StreamScope:
    """Managed streams of one persistent scope, each opened once and shared.

    A stream's identity is the scope, the writer node, the key and, per
    consumer group, the group; its generation is raised on every open. Until
    the graph engine supplies them, the caller names scope and node.
    """

    def __init__(self, hooks: StreamHooks, scope: str, task_group: anyio.abc.TaskGroup) -> None:
        check_name(scope, "a scope")
        self.hooks = hooks
        self.scope = scope
        self._tg = task_group
        self._streams: dict[StreamRef, ManagedStream[Any]] = {}
        self._opening: dict[StreamRef, anyio.Event] = {}
        self._partitioned: dict[StreamRef, PartitionedStream[Any]] = {}

    async def open_stream(
        self,
        key: Key[Stream[T]],
        *,
        node: str,
        groups: Sequence[str] = ("default",),
        capacity: int = 1024,
        resumable: bool = False,
        start: Literal["earliest", "latest"] | int = "earliest",
        retain: int | None = None,
    ) -> ManagedStream[T]:
        """Open (or recover) the stream ``key`` written by ``node``.

        ``groups`` are the consumer groups that must acknowledge each message
        before it may be compacted. ``capacity`` bounds the messages not yet
        acknowledged by every group; a writer waits while it is reached.
        ``resumable=True`` is the writer's promise that it continues from
        :attr:`StreamWriter.position` after a crash; only such a stream may be
        recovered while still active.

        ``start`` says where a group new to the stream starts: ``"earliest"``
        (its first message), ``"latest"`` (after the last one appended: only
        messages appended from now on), or the first sequence it handles.
        Groups the stream already has keep their frontiers. A start at
        messages every other group acknowledged and compaction removed is
        refused with :class:`CompactedHistoryError`, never a silent jump.

        ``retain`` keeps the last ``retain`` messages appended even once every
        group acknowledged them, so a group added later (or one an operator
        moves back) can start at them. An open that names it sets it; one that
        does not (None) keeps what the stream has (0 for a new stream).
        """
        if not key.is_stream:
            raise TypeError(f"{key!r} is not a stream key; declare it as Key(name, Stream[T])")
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if retain is not None and (not isinstance(retain, int) or isinstance(retain, bool) or retain < 0):
            raise ValueError(f"retain is a number of messages, at least 0, not {retain!r}")
        if not groups or len(set(groups)) != len(groups):
            raise ValueError("groups must be distinct, and at least one")
        if start not in ("earliest", "latest") and (
            not isinstance(start, int) or isinstance(start, bool) or start < 1
        ):
            raise ValueError(f"start is 'earliest', 'latest' or a sequence of at least 1, not {start!r}")
        check_name(node, "a node name")
        for group in groups:
            check_name(group, "a group name")
        ref = StreamRef(scope=self.scope, node=node, key=key.name)
        while (opening := self._opening.get(ref)) is not None:
            await opening.wait()  # one open per stream: a concurrent caller shares its endpoint
        existing = self._streams.get(ref)
        if existing is not None:
            if existing.key != key:
                raise StreamStateError(f"stream {ref} is already open with {existing.key!r}")
            return existing
        done = self._opening[ref] = anyio.Event()
        try:
            return await self._open(key, ref, groups, capacity, resumable, start, retain, 0)
        finally:
            del self._opening[ref]
            done.set()

    async def open_partitioned(
        self,
        key: Key[Stream[T]],
        *,
        node: str,
        partitions: int | None = None,
        partition_key: Callable[[T], Any] | None = None,
        groups: Sequence[str] = ("default",),
        capacity: int = 1024,
        resumable: bool = False,
        start: Literal["earliest", "latest"] | int = "earliest",
        retain: int | None = None,
    ) -> PartitionedStream[T]:
        """Open (or recover) stream ``key`` as ``partitions`` partitions, each message on its key's.

        ``partition_key(message)`` gives a message's key: messages of one key
        go to one partition and keep their order. Each partition is a stream
        of its own (``key#0`` to ``key#{partitions - 1}``), with the other
        arguments as :meth:`open_stream` takes them (``capacity`` and
        ``retain`` per partition). A stream keeps the number of partitions it
        was created with: another is refused with :class:`PartitionError`.
        A key that declares its partitions (``Key(name, Stream[T],
        partitions=N, partition_key=fn)``) gives both when they are omitted.
        """
        if partitions is None:
            partitions = key.partitions
        elif key.partitions is not None and key.partitions != partitions:
            raise PartitionError(f"{key!r} declares {key.partitions} partitions, not {partitions}")
        if partition_key is None:
            partition_key = key.partition_key
        count = check_partitions(partitions, partition_key)
        assert partition_key is not None  # checked
        if not key.is_stream:
            raise TypeError(f"{key!r} is not a stream key; declare it as Key(name, Stream[T])")
        check_name(node, "a node name")
        ref = StreamRef(scope=self.scope, node=node, key=key.name)
        while (opening := self._opening.get(ref)) is not None:
            await opening.wait()  # one open per stream: a concurrent caller shares its endpoint
        existing = self._partitioned.get(ref)
        if existing is not None:
            if existing.key != key or len(existing.partitions) != count:
                raise PartitionError(
                    f"stream {ref} is already open with {existing.key!r} in {len(existing.partitions)} "
                    "partitions"
                )
            return existing
        if ref in self._streams:
            raise PartitionError(f"stream {ref} is already open as a stream of its own, not partitioned")
        done = self._opening[ref] = anyio.Event()
        try:
            return await self._open_partitions(
                key, ref, count, partition_key, groups, capacity, resumable, start, retain
            )
        finally:
            del self._opening[ref]
            done.set()

    async def _open_partitions(
        self,
        key: Key[Stream[T]],
        ref: StreamRef,
        count: int,
        partition_key: Callable[[T], Any],
        groups: Sequence[str],
        capacity: int,
        resumable: bool,
        start: str | int,
        retain: int | None,
    ) -> PartitionedStream[T]:
        opened: list[ManagedStream[T]] = []
        for p in range(count):
            part: Key[Stream[T]] = Key(partition_name(key.name, p), key.type)
            part_ref = StreamRef(scope=self.scope, node=ref.node, key=part.name)
            if part_ref in self._streams:
                raise PartitionError(f"stream {part_ref} is already open as a stream of its own")
            opened.append(await self._open(part, part_ref, groups, capacity, resumable, start, retain, count))
        stream = self._partitioned[ref] = PartitionedStream(key, ref, tuple(opened), partition_key)
        return stream

    async def _open(
        self,
        key: Key[Stream[T]],
        ref: StreamRef,
        groups: Sequence[str],
        capacity: int,
        resumable: bool,
        start: str | int,
        retain: int | None,
        partitions: int,
    ) -> ManagedStream[T]:
        request = StreamOpen(
            ref=ref,
            type_name=type_name(key.item_type),
            legacy_type_name=qualified_type_name(key.item_type),
            capacity=capacity,
            groups=tuple(groups),
            resumable=resumable,
            start=start,
            retain=retain,
            partitions=partitions,
        )
        with span(SPAN.OPEN_STREAM, {ATTR.STREAM: str(ref)}) as current:
            opened = await self.hooks.open(request)
            current.set_attribute(ATTR.GENERATION, opened.generation)
            current.set_attribute(ATTR.TAIL, len(opened.tail))
            if not opened.created:
                current.add_event(EVENT.STREAM_RECOVERED)
        core = StreamCore(
            self._spawn,
            self.hooks,
            key,
            ref,
            opened,
            capacity=capacity,
            resumable=resumable,
            partitions=partitions,
        )
        stream: ManagedStream[T] = ManagedStream(core)
        self._streams[ref] = stream
        return stream

    def streams(self) -> list[ManagedStream[Any]]:
        """Every stream opened in this scope."""
        return list(self._streams.values())

    def _spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._tg.start_soon(fn)


@asynccontextmanager
async def open_scope(hooks: StreamHooks, *, scope: str) -> AsyncIterator[StreamScope]:
    """Open a :class:`StreamScope` on ``hooks``; its background appends end with the block.

    Messages sent but not yet confirmed when the block exits are confirmed
    before it returns; an error confirming them is raised from the block.
    A single error, from the block or a background append, is raised as
    itself rather than inside an exception group.
    """
    check_stream_hooks(hooks)
    check_name(scope, "a scope")
    key = (id(hooks), scope)
    if key in _OPEN:
        raise ScopeInUseError(
            f"scope {scope!r} is already open on {hooks!r} in this process: share that StreamScope "
            "(a second one would open its streams again and fence the first one's endpoints)"
        )
    _OPEN.add(key)
    opened: StreamScope | None = None
    try:
        with single_error():
            async with anyio.create_task_group() as tg:
                opened = StreamScope(hooks, scope, tg)
                yield opened
    finally:
        _OPEN.discard(key)
        for stream in opened.streams() if opened is not None else ():
            core_of(stream).close()


#: (id of the hooks, scope) of every StreamScope open in this process: one endpoint per stream.
_OPEN: set[tuple[int, str]] = set()
