"""Invariants 1, 3 and 6: append before delivery, the contiguous frontier, terminals."""

from __future__ import annotations

import re

import anyio
import msgspec

from .. import (
    CheckpointError,
    CompactedHistoryError,
    Key,
    PayloadTypeError,
    ScopeInUseError,
    SequenceError,
    SourceNotResumableError,
    StaleGenerationError,
    Stream,
    StreamFailedError,
    StreamRef,
    open_scope,
)
from .._testing import FaultyHooks, InjectedFault, PassThroughHooks
from .._type_names import qualified_type_name, type_name
from ..store import AppendBatch, MessageCommit, MessageRef, StreamFinish, StreamOpen
from ._support import World, check, raises
from .records import NUMBERS, ORDERS, Order


@check
async def test_messages_are_delivered_in_contiguous_sequence(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        writer = stream.writer()
        for i in range(10):
            await writer.send(i)
        await writer.finish()
        seen = [(m.seq, m.value) async for m in stream.reader("g")]
    assert seen == [(i + 1, i) for i in range(10)]


@check
async def test_reader_never_sees_a_message_before_its_append_is_confirmed(world: World) -> None:
    async with world.session() as hooks:
        gate = anyio.Event()
        entered = anyio.Event()

        class GatedHooks(PassThroughHooks):
            async def append(self, batch: AppendBatch) -> None:
                entered.set()
                await gate.wait()
                await self.inner.append(batch)

        gated = GatedHooks(hooks)
        async with open_scope(gated, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
            reader = stream.reader("g")
            await stream.writer().send(7)
            await entered.wait()
            assert stream.snapshot().appended == 0
            received: list[int] = []

            async def read() -> None:
                received.append((await reader.receive()).value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await anyio.wait_all_tasks_blocked()
                assert received == []
                gate.set()
            assert received == [7]


@check
async def test_failed_append_delivers_nothing_and_stops_the_scope(world: World) -> None:
    async with world.session() as hooks:
        faulty = FaultyHooks(hooks, fail={"append": 1})
        with raises(CheckpointError) as info:
            async with open_scope(faulty, scope="s") as scope:
                stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
                await stream.writer().send(1)
                await stream.writer().flush()
        assert isinstance(info.value.__cause__, InjectedFault)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        assert stream.snapshot().appended == 0


@check
async def test_wrong_payload_type_is_refused_and_nothing_is_written(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(ORDERS, node="src", groups=("g",))
        with raises(PayloadTypeError, match="orders"):
            await stream.writer().send("not an order")  # type: ignore[arg-type]
        await stream.writer().flush()
        assert stream.snapshot().appended == 0


@check
async def test_acked_through_is_the_contiguous_frontier_and_never_moves_back(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        writer = stream.writer()
        for i in range(5):
            await writer.send(i)
        await writer.flush()
        reader = stream.reader("g")
        messages = [await reader.receive() for _ in range(5)]
        await reader.ack(messages[2])
        await reader.ack(messages[1])
        assert stream.snapshot().groups[0].acked_through == 0
        await reader.ack(messages[0])
        assert stream.snapshot().groups[0].acked_through == 3
        await reader.ack(messages[4])
        assert stream.snapshot().groups[0].acked_through == 3
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        group = stream.snapshot().groups[0]
        assert (group.acked_through, group.pending) == (3, 1)
        reader = stream.reader("g")
        message = await reader.receive()
        assert message.seq == 4
        await reader.ack(message)
        assert stream.snapshot().groups[0].acked_through == 5


@check
async def test_a_recovered_tail_with_messages_acked_out_of_order_delivers_the_right_values(
    world: World,
) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        writer = stream.writer()
        for i in range(1, 6):
            await writer.send(i * 10, send_at=i)
        await writer.flush()
        reader = stream.reader("g")
        messages = [await reader.receive() for _ in range(5)]
        await reader.ack(messages[1])
        await reader.ack(messages[3])
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        writer, reader = stream.writer(), stream.reader("g")
        first = await reader.receive()
        assert (first.seq, first.value) == (1, 10)
        await reader.ack(first)  # the frontier jumps over 2, acked before the restart
        assert stream.snapshot().groups[0].acked_through == 2
        await writer.send(60, send_at=6)
        await writer.flush()
        received = [await reader.receive() for _ in range(3)]
        assert [(m.seq, m.value) for m in received] == [(3, 30), (5, 50), (6, 60)]
        for message in received:
            await reader.ack(message)
        assert stream.snapshot().groups[0].acked_through == 6


@check
async def test_acking_twice_is_refused_by_the_store(world: World) -> None:
    async with world.session() as hooks:
        ref = StreamRef("s", "src", "numbers")
        opened = await hooks.open(StreamOpen(ref, "int", 16, ("g",)))
        await hooks.append(AppendBatch(ref, opened.generation, 1, (b"\x01",)))
        ack = MessageCommit(MessageRef(ref, "g", opened.generation, 1))
        await hooks.commit([ack])
        with raises(SequenceError):
            await hooks.commit([ack])
        with raises(SequenceError):
            await hooks.append(AppendBatch(ref, opened.generation, 3, (b"\x01",)))


@check
async def test_each_group_sees_every_message(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a", "b"))
        writer = stream.writer()
        for i in range(3):
            await writer.send(i)
        await writer.finish()
        for group in ("a", "b"):
            reader = stream.reader(group)
            assert [m.value async for m in reader] == [0, 1, 2]


@check
async def test_writer_waits_at_capacity_until_a_message_is_acked(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), capacity=2)
        writer = stream.writer()
        await writer.send(1)
        await writer.send(2)
        sent = anyio.Event()

        async def third() -> None:
            await writer.send(3)
            sent.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(third)
            await anyio.wait_all_tasks_blocked()
            assert not sent.is_set()
            reader = stream.reader("g")
            await reader.ack(await reader.receive())
            await sent.wait()
        await writer.flush()
        assert stream.snapshot().appended == 3


@check
async def test_generation_is_raised_on_every_open_and_fences_older_records(world: World) -> None:
    async with world.session() as hooks:
        ref = StreamRef("s", "src", "numbers")
        first = await hooks.open(StreamOpen(ref, "int", 16, ("g",), resumable=True))
        await hooks.append(AppendBatch(ref, first.generation, 1, (b"\x01", b"\x02")))
        second = await hooks.open(StreamOpen(ref, "int", 16, ("g",), resumable=True))
        assert second.generation == first.generation + 1
        with raises(StaleGenerationError):
            await hooks.commit([MessageCommit(MessageRef(ref, "g", first.generation, 1))])
        with raises(StaleGenerationError):
            await hooks.append(AppendBatch(ref, first.generation, 3, (b"\x03",)))
    async with world.session() as hooks:
        third = await hooks.open(StreamOpen(ref, "int", 16, ("g",), resumable=True))
        assert third.generation == second.generation + 1
        assert third.groups[0].acked_through == 0
        assert [m.seq for m in third.tail] == [1, 2]


@check
async def test_a_stream_named_by_its_types_module_in_an_older_release_reopens_for_the_same_type(
    world: World,
) -> None:
    ref = StreamRef("s", "src", "orders")
    older = qualified_type_name(Order)  # named with its module: streams._conformance.records.Order
    async with world.session() as hooks:
        opened = await hooks.open(StreamOpen(ref, older, 16, ("g",), resumable=True))
        await hooks.append(AppendBatch(ref, opened.generation, 1, (msgspec.msgpack.encode(Order(1, 5)),)))
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(ORDERS, node="src", groups=("g",), resumable=True)
        await stream.writer().send(Order(2, 7), send_at=2)
        await stream.writer().finish()
        assert [m.value async for m in stream.reader("g")] == [Order(1, 5), Order(2, 7)]
        held = await hooks.describe(ref)
        assert held is not None and held.type_name == older  # kept as written, named by module
        with raises(SourceNotResumableError, match="holds streams._conformance.records.Order messages"):
            await hooks.open(StreamOpen(ref, type_name(int), 16, ("g",), legacy_type_name="int"))


@check
async def test_a_stream_reopened_with_a_type_whose_fields_changed_is_refused_naming_the_field(
    world: World,
) -> None:
    ref = StreamRef("s", "src", "orders")
    noted = msgspec.defstruct("Order", [("id", int), ("amount", int), ("note", str, "")], frozen=True)
    async with world.session() as hooks:
        await hooks.open(
            StreamOpen(ref, type_name(Order), 16, ("g",), legacy_type_name=qualified_type_name(Order))
        )
        with raises(SourceNotResumableError, match=re.escape("(type Order: field 'note' is new)")) as refused:
            await hooks.open(
                StreamOpen(
                    ref, type_name(noted), 16, ("g",), True, legacy_type_name=qualified_type_name(noted)
                )
            )
    assert (
        "holds Order{id: int, amount: int} messages, but was reopened as Order{id: int, amount: int, "
        in str(refused.value)
    )


@check
async def test_finished_stream_stays_finished_and_replays_its_tail(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        writer = stream.writer()
        for i in range(4):
            await writer.send(i)
        await writer.finish()
        reader = stream.reader("g")
        await reader.ack(await reader.receive())
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        assert stream.snapshot().finished
        assert [m.value async for m in stream.reader("g")] == [1, 2, 3]
        await stream.wait_done()


@check
async def test_active_stream_resumes_only_with_a_continuation_promise(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        for i in range(1, 4):
            await stream.writer().send(i * 10, send_at=i)
        await stream.writer().flush()
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        with raises(SourceNotResumableError, match="resumable"):
            await scope.open_stream(NUMBERS, node="src", groups=("g",))
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        writer = stream.writer()
        assert writer.position == 3
        for i in range((writer.position or 0) + 1, 6):
            await writer.send(i * 10, send_at=i)
        await writer.finish()
        assert [m.value async for m in stream.reader("g")] == [10, 20, 30, 40, 50]


@check
async def test_a_second_scope_of_the_same_name_on_the_same_hooks_is_refused(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        with raises(ScopeInUseError, match="scope 's' is already open"):
            async with open_scope(hooks, scope="s"):
                pass
        async with open_scope(hooks, scope="other"):  # another scope is another set of streams
            pass
        await stream.writer().send(1)  # the first scope's endpoint was not fenced
        await stream.writer().flush()
        assert stream.generation == 1
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:  # closed: open again
        assert (await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)).generation == 2


@check
async def test_an_active_stream_that_sent_nothing_yet_also_needs_the_promise(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await scope.open_stream(NUMBERS, node="src", groups=("g",))  # opened: its writer may have begun
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        with raises(SourceNotResumableError, match="still active at sequence 0"):
            await scope.open_stream(NUMBERS, node="src", groups=("g",))
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        assert stream.position is None and not stream.done


@check
async def test_failed_writer_propagates_failure_to_readers_not_eof(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await stream.writer().send(1)
        await stream.writer().fail()
        reader = stream.reader("g")
        assert (await reader.receive()).value == 1
        with raises(StreamFailedError):
            await reader.receive()
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        assert stream.snapshot().failed


@check
async def test_snapshot_carries_no_values(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(ORDERS, node="src", groups=("g",))
        await stream.writer().send(Order(1, 123456789))
        await stream.writer().flush()
        snapshot = stream.snapshot()
        assert "123456789" not in repr(snapshot)
        assert snapshot.appended == 1


@check
async def test_opening_the_same_stream_twice_shares_one_endpoint(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        a = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        b = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        assert a is b
        assert a.snapshot().generation == 1
        other = Key("numbers", Stream[str])
        with raises(Exception, match="already open"):
            await scope.open_stream(other, node="src", groups=("g",))


async def _acked_by_one_group(world: World, scope_name: str, n: int) -> None:
    """Finished stream ``src/numbers`` of ``scope_name``: ``n`` messages, all acknowledged by group ``a``.

    Once every group acknowledged a finished stream's messages, the store compacts them away.
    """
    async with world.session() as hooks, open_scope(hooks, scope=scope_name) as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",))
        for i in range(1, n + 1):
            await stream.writer().send(i)
        await stream.writer().finish()
        reader = stream.reader("a")
        for _ in range(n):
            await reader.ack(await reader.receive())


@check
async def test_a_group_added_where_compaction_removed_messages_is_refused_and_nothing_changes(
    world: World,
) -> None:
    await _acked_by_one_group(world, "late", 5)
    async with world.session() as hooks:
        ref = StreamRef("late", "src", "numbers")
        for start in ("earliest", 3):
            with raises(CompactedHistoryError, match="messages 1 to 5 were acknowledged by every group"):
                await hooks.open(StreamOpen(ref, type_name(int), 1024, ("a", "b"), True, start=start))
        opened = await hooks.open(StreamOpen(ref, type_name(int), 1024, ("a",), True))
        assert opened.generation == 2 and opened.finished  # the refused opens raised nothing
        assert [g.group for g in opened.groups] == ["a"]


async def _five_unread(world: World, scope_name: str) -> None:
    """Active stream ``src/numbers`` of ``scope_name``: messages 1 to 5, which group ``a`` has not read."""
    async with world.session() as hooks, open_scope(hooks, scope=scope_name) as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        for i in range(1, 6):
            await stream.writer().send(i)
        await stream.writer().flush()


@check
async def test_a_group_added_at_latest_handles_only_what_is_appended_after(world: World) -> None:
    await _five_unread(world, "latest")
    async with world.session() as hooks, open_scope(hooks, scope="latest") as scope:
        groups = ("a", "b")
        stream = await scope.open_stream(NUMBERS, node="src", groups=groups, resumable=True, start="latest")
        assert {g.group: g.acked_through for g in stream.snapshot().groups} == {"a": 0, "b": 5}
        await stream.writer().send(6)
        await stream.writer().finish()
        assert [m.value async for m in stream.reader("b")] == [6]


@check
async def test_a_group_added_at_a_sequence_starts_there_and_the_others_keep_their_frontiers(
    world: World,
) -> None:
    await _five_unread(world, "at")
    async with world.session() as hooks, open_scope(hooks, scope="at") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a", "b"), resumable=True, start=4)
        assert {g.group: g.acked_through for g in stream.snapshot().groups} == {"a": 0, "b": 3}
        await stream.writer().finish()
        assert [m.value async for m in stream.reader("b")] == [4, 5]
        ref = StreamRef("at", "src", "numbers")
        with raises(SequenceError, match="only 5 messages were appended"):
            await hooks.open(StreamOpen(ref, type_name(int), 1024, ("a", "c"), True, start=7))
        with raises(ValueError, match="start is 'earliest', 'latest' or a sequence"):
            await scope.open_stream(Key("other", Stream[int]), node="src", start=0)


@check
async def test_describe_reads_a_stream_as_confirmed_and_raises_no_generation(world: World) -> None:
    ref, failing, other = (
        StreamRef("s", "src", "numbers"),
        StreamRef("s", "bad", "numbers"),
        StreamRef("t", "src", "numbers"),
    )
    async with world.session() as hooks:
        assert await hooks.describe(ref) is None  # never opened
        opened = await hooks.open(StreamOpen(ref, type_name(int), 8, ("g",)))
        await hooks.append(AppendBatch(ref, opened.generation, 1, (b"\x01", b"\x02"), position=2))
        first = await hooks.describe(ref)
        assert first is not None and first == await hooks.describe(ref)  # a read changes nothing
        assert (first.ref, first.type_name, first.groups) == (ref, type_name(int), ("g",))
        assert (first.generation, first.appended, first.position) == (opened.generation, 2, 2)
        assert not (first.finished or first.failed)
        assert await hooks.describe(other) is None  # the same node and key in another scope
        reopened = await hooks.open(StreamOpen(ref, type_name(int), 8, ("g",), resumable=True))
        assert reopened.generation == first.generation + 1  # describing it raised nothing
        await hooks.finish(StreamFinish(ref, reopened.generation))
        bad = await hooks.open(StreamOpen(failing, type_name(int), 8, ("g",)))
        await hooks.finish(StreamFinish(failing, bad.generation, failed=True))
    async with world.session() as hooks:  # after a restart: as confirmed
        finished, failed = await hooks.describe(ref), await hooks.describe(failing)
        assert finished is not None and (finished.generation, finished.finished, finished.failed) == (
            reopened.generation,
            True,
            False,
        )
        assert failed is not None and (failed.finished, failed.failed, failed.appended) == (False, True, 0)
