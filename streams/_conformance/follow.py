"""Reading a stream another process writes (``read_stream``): no generation raised, the messages above."""

from __future__ import annotations

import anyio

from .. import (
    CompactedHistoryError,
    PartitionError,
    PayloadTypeError,
    SequenceError,
    StreamHooks,
    StreamRef,
    UnknownStreamError,
    follow_stream,
    handle_messages,
    open_scope,
)
from .._store._hooks import FollowHooks
from ..store import AppendBatch, MessageCommit, MessageRef, StreamFinish, StreamOpen, StreamRead
from ._support import World, check, raises
from .groups import INT
from .records import NUMBERS


def _follow(hooks: StreamHooks) -> FollowHooks:
    assert isinstance(hooks, FollowHooks), f"{hooks!r} cannot read a stream it did not open (no FollowHooks)"
    return hooks


@check
async def test_a_read_of_a_stream_raises_no_generation_and_holds_what_a_reader_lacks(world: World) -> None:
    ref = StreamRef("follow", "src", "numbers")
    async with world.session() as hooks:
        follow = _follow(hooks)
        assert await follow.read_stream(StreamRead(ref, INT, ("g",))) is None  # never opened
        opened = await hooks.open(StreamOpen(ref, INT, 64, ("g", "h"), True))
        await hooks.append(AppendBatch(ref, opened.generation, 1, (b"\x01", b"\x02", b"\x03", b"\x04")))
        await hooks.commit([MessageCommit(MessageRef(ref, "g", opened.generation, 1), through=2)])
        read = await follow.read_stream(StreamRead(ref, INT, ("g",)))
        assert read is not None and not read.created
        assert (read.generation, read.appended, read.finished) == (opened.generation, 4, False)
        assert [f.acked_through for f in read.groups] == [2]
        assert [m.seq for m in read.tail] == [3, 4]  # above the group's frontier
        above = await follow.read_stream(StreamRead(ref, INT, ("g", "h"), after=3))
        assert above is not None and [m.seq for m in above.tail] == [4] and len(above.groups) == 2
        assert (await follow.read_stream(StreamRead(ref, INT, ("g",), after=4))).tail == ()  # type: ignore[union-attr]
        # the writer was not fenced: it appends at its generation still
        await hooks.append(AppendBatch(ref, opened.generation, 5, (b"\x05",)))
        desc = await hooks.describe(ref)
        assert desc is not None and (desc.generation, desc.appended) == (opened.generation, 5)


@check
async def test_a_read_of_another_type_partitioning_group_or_sequence_is_refused(world: World) -> None:
    ref = StreamRef("follow", "src", "parted#0")
    async with world.session() as hooks:
        follow = _follow(hooks)
        opened = await hooks.open(StreamOpen(ref, INT, 64, ("g",), True, partitions=2))
        await hooks.append(AppendBatch(ref, opened.generation, 1, (b"\x01", b"\x02")))
        with raises(PayloadTypeError, match="holds int messages, not str"):
            await follow.read_stream(StreamRead(ref, "str", ("g",), 2))
        with raises(PartitionError, match="is one of 2 partitions, but was read as a stream of its own"):
            await follow.read_stream(StreamRead(ref, INT, ("g",)))
        with raises(UnknownStreamError, match="has no consumer group 'nobody'"):
            await follow.read_stream(StreamRead(ref, INT, ("nobody",), 2))
        with raises(SequenceError, match="after 3: only 2 were appended"):
            await follow.read_stream(StreamRead(ref, INT, ("g",), 2, after=3))
        await hooks.finish(StreamFinish(ref, opened.generation))
        await hooks.commit([MessageCommit(MessageRef(ref, "g", opened.generation, 1), through=2)])
        with raises(CompactedHistoryError, match="compacted"):  # ended, and every group acked: compacted
            await follow.read_stream(StreamRead(ref, INT, ("g",), 2, after=0))
        read = await follow.read_stream(StreamRead(ref, INT, ("g",), 2))
        assert read is not None and read.finished and read.tail == ()


@check
async def test_a_followed_stream_is_handled_as_its_writer_appends_and_ends_with_it(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="follow") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), capacity=4, resumable=True)
        writer = stream.writer()
        seen: list[int] = []

        async def add(tx: object, value: int) -> None:
            seen.append(value)

        # a writer that never saw the follower's acks would wait forever: fail instead
        with anyio.fail_after(30):
            async with follow_stream(
                hooks, NUMBERS, scope="follow", node="src", group="g", poll_seconds=0.01
            ) as r:
                for i in range(1, 4):
                    await writer.send(i)
                await writer.flush()
                async with anyio.create_task_group() as tg:

                    async def rest() -> None:  # past its capacity: it reads the follower's acks in the store
                        for i in range(4, 21):
                            await writer.send(i)
                        await writer.finish()

                    tg.start_soon(rest)
                    result = await handle_messages(r, add)
        assert result.handled == 20 and seen == list(range(1, 21))
        read = await _follow(hooks).read_stream(StreamRead(stream.ref, INT, ("g",)))
        assert read is not None and read.finished and read.groups[0].acked_through == 20


class _Bell:
    """Wake-ups a check rings by hand (a :class:`~streams.Wakeups`)."""

    def __init__(self) -> None:
        self.rung = anyio.Event()

    def ring(self) -> None:
        self.rung.set()

    async def wait(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self.rung.wait()
        if self.rung.is_set():
            self.rung = anyio.Event()


@check
async def test_a_follower_woken_reads_at_once_not_at_its_poll(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="follow") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        writer = stream.writer()
        bell = _Bell()
        with raises(TypeError, match="wakeups must have `async def wait"):
            async with follow_stream(hooks, NUMBERS, scope="follow", node="src", group="g", wakeups=object()):  # type: ignore[arg-type]
                pass
        async with follow_stream(
            hooks, NUMBERS, scope="follow", node="src", group="g", poll_seconds=3600, wakeups=bell
        ) as reader:
            await writer.send(1)  # after the follower's first read: only a wake-up brings it before an hour
            await writer.flush()
            bell.ring()
            with anyio.fail_after(30):
                assert (await reader.receive()).value == 1
            await writer.finish()
            bell.ring()
            with anyio.fail_after(30):
                await handle_messages(reader, _ignore)


async def _ignore(tx: object, value: int) -> None:
    pass
