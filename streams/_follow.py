"""Following a stream another process writes: a reader of one group, fed by reading the store.

A :class:`~streams.StreamScope` opens a stream, which raises its generation
and so fences whoever had it open: right for a writer taking its stream
over, wrong for a consumer in another process than the writer. A followed
stream is read instead (:func:`streams.store.read_stream`): the group's
frontier and the confirmed messages above it, then the messages confirmed
since, each time its ``wakeups`` say the stream may have changed (a store
that tells its followers of commits: the PostgreSQL ledger's notifications),
and at least every ``poll_seconds`` (a wake-up lost is then a read late,
never a message lost). Its reader is an ordinary
:class:`~streams.StreamReader`, so ``handle_messages`` handles it as any
other, with its commits (acks, state, keyed state, budgets) confirmed in
the store as they always are. Only confirmed messages are ever handed out.

The generation the follower read is the one its commits carry. If the
writer reopens the stream meanwhile (it restarted), those commits would
be refused; the follower raises :class:`StaleGenerationError` as soon as
it sees the new generation, and following the stream again picks up from
what the group confirmed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio
import msgspec

from ._errors import StaleGenerationError, UnknownStreamError
from ._keys import Key, Stream, check_name
from ._partitions import partition_name
from ._store._hooks import FollowHooks, StreamHooks, check_stream_hooks
from ._store._records import StreamOpened, StreamRead, StreamRef
from ._stream import ManagedStream, StreamCore, StreamReader
from ._type_names import qualified_type_name, type_name
from ._unwrap import single_error

__all__ = ["Wakeups", "follow_stream"]

T = TypeVar("T")

#: How long a caught-up follower waits before it reads the store again (seconds).
DEFAULT_POLL_SECONDS = 0.2


@runtime_checkable
class Wakeups(Protocol):
    """Where a follower learns that its stream may have changed, so it reads it without polling.

    ``wait(seconds)`` returns once something was committed to the stream
    since the last ``wait`` returned (or since the source was made, before
    the follower's first read), or once ``seconds`` passed, whichever
    is first. A source may wake its follower when nothing changed (it then
    reads nothing new); a wake-up it loses costs the follower at most
    ``seconds``, as it reads the stream then anyway. ``wait`` is a
    checkpoint.
    """

    async def wait(self, seconds: float) -> None: ...


@asynccontextmanager
async def follow_stream(
    hooks: StreamHooks,
    key: Key[Stream[T]],
    *,
    scope: str,
    node: str,
    group: str,
    partition: tuple[int, int] | None = None,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    reads: FollowHooks | None = None,
    wakeups: Wakeups | None = None,
) -> AsyncIterator[StreamReader[T]]:
    """A reader of ``group`` on stream ``key`` of ``scope`` (written by ``node``, in any process).

    ``partition=(p, n)`` follows partition ``p`` of a stream opened with
    ``open_partitioned(..., partitions=n)``. The store must be a
    :class:`~streams.store.FollowHooks`; the stream and the group must
    exist (:class:`UnknownStreamError` otherwise), of this type and
    partitioning. The reader ends (``anyio.EndOfStream``, or the end of
    ``handle_messages``) once the writer's end is confirmed and the group
    handled every message; until then it waits for more.

    ``reads`` is where the stream is read, if not ``hooks`` (which confirm
    the reader's commits): a store's connection that reads beside them.

    A caught-up reader reads the store again every ``poll_seconds``, or as
    soon as ``wakeups`` (a :class:`Wakeups`, made before this call) say its
    stream may have changed: ``poll_seconds`` is then only the bound on how
    late a lost wake-up makes it.
    """
    check_stream_hooks(hooks)
    source: object = hooks if reads is None else reads
    if not isinstance(source, FollowHooks):
        raise TypeError(f"{type(source).__qualname__} cannot read streams it did not open (no FollowHooks)")
    reads = source
    if not key.is_stream:
        raise TypeError(f"{key!r} is not a stream key; declare it as Key(name, Stream[T])")
    if poll_seconds <= 0:
        raise ValueError("poll_seconds must be positive")
    if wakeups is not None and not isinstance(wakeups, Wakeups):
        raise TypeError(f"wakeups must have `async def wait(seconds)`, not {type(wakeups).__qualname__}")
    check_name(scope, "a scope")
    check_name(node, "a node name")
    check_name(group, "a group name")
    name, partitions = key.name, 0
    if partition is not None:
        index, partitions = partition
        if not 0 <= index < partitions:
            raise ValueError(f"partition {index} is not one of {partitions} partitions")
        name = partition_name(key.name, index)
    part: Key[Stream[T]] = Key(name, key.type)
    ref = StreamRef(scope=scope, node=node, key=name)
    request = StreamRead(
        ref,
        type_name(key.item_type),
        (group,),
        partitions,
        legacy_type_name=qualified_type_name(key.item_type),
    )
    opened = await reads.read_stream(request)
    if opened is None:
        raise UnknownStreamError(f"stream {ref} was never opened in this store: there is nothing to follow")
    with single_error():
        async with anyio.create_task_group() as tg:

            def spawn(fn: Any) -> None:
                tg.start_soon(fn)

            # a reader's endpoint: its capacity is never reached, as it sends nothing
            core: StreamCore[T] = StreamCore(spawn, hooks, part, ref, opened, capacity=1, resumable=True)
            stream: ManagedStream[T] = ManagedStream(core)
            tg.start_soon(_poll, reads, core, request, poll_seconds, wakeups)
            try:
                yield stream.reader(group)
            finally:
                tg.cancel_scope.cancel()
                core.close()


async def _poll(
    hooks: FollowHooks, core: StreamCore[Any], request: StreamRead, seconds: float, wakeups: Wakeups | None
) -> None:
    """Hand the reader what the store confirmed since, until the writer's end is confirmed."""
    while not core.done:
        if wakeups is None:
            await anyio.sleep(seconds)
        else:  # a wake-up, or the poll's bound: a lost one makes the read late, never skipped
            await wakeups.wait(seconds)
        latest = await hooks.read_stream(_after(request, core.confirmed))
        if latest is None:
            raise UnknownStreamError(f"stream {request.ref} is no longer in the store")
        _land(core, latest)


def _after(request: StreamRead, seq: int) -> StreamRead:
    return msgspec.structs.replace(request, after=seq)


def _land(core: StreamCore[Any], latest: StreamOpened) -> None:
    if latest.generation != core.generation:
        raise StaleGenerationError(
            f"stream {core.ref} was reopened by its writer (generation {core.generation} to "
            f"{latest.generation}); this reader's commits would be refused: follow it again"
        )
    if latest.tail:
        what = core.what
        values = [core.codec.decode(m.payload, what=f"message {m.seq} of {what}") for m in latest.tail]
        core.position = latest.position
        core.publish(latest.tail[0].seq, values)
    if latest.finished or latest.failed:
        core.confirmed_end(failed=latest.failed)
