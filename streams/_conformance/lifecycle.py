"""Endpoints under cancellation, early exits, concurrent opens and stopped groups."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.lowlevel

from .. import (
    CheckpointError,
    GroupBusyError,
    Key,
    ManagedStream,
    MessageTx,
    PayloadTypeError,
    Stream,
    StreamStateError,
    handle_messages,
    open_scope,
)
from .._stream import core_of
from .._testing import FaultyHooks, PassThroughHooks
from ..store import MessageCommit
from ._support import World, cases, check, raises
from .records import NUMBERS

OUT = Key("out", Stream[int])


async def _send_finished(stream: ManagedStream[int], n: int) -> None:
    """Send 1..n to ``stream`` and finish it."""
    writer = stream.writer()
    for i in range(1, n + 1):
        await writer.send(i)
    await writer.finish()


@check
async def test_a_shielded_finish_after_a_cancelled_append_completes(world: World) -> None:
    async with world.session() as hooks:
        with anyio.CancelScope() as outer:
            async with open_scope(hooks, scope="s") as scope:
                writer = (await scope.open_stream(NUMBERS, node="src", groups=("g",))).writer()
                try:
                    await writer.send(1)
                    await anyio.lowlevel.checkpoint()
                    outer.cancel()
                    await anyio.sleep(1)
                finally:
                    with anyio.CancelScope(shield=True), anyio.fail_after(10):
                        await writer.finish()
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        assert (stream.snapshot().finished, stream.snapshot().appended) == (True, 1)


@check
async def test_a_handler_error_commits_what_was_staged_and_leaves_the_output_writable(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        out = await scope.open_stream(OUT, node="h", groups=("o",))
        await _send_finished(numbers, 5)

        async def h(tx: MessageTx[None], value: int) -> None:
            tx.send(out.writer(), "bad" if value == 3 else value)  # type: ignore[misc]

        with raises(PayloadTypeError):
            await handle_messages(numbers.reader("g"), h)
        assert numbers.snapshot().groups[0].acked_through == 2
        with anyio.fail_after(10):
            await out.writer().fail()
        assert out.snapshot().appended == 2


@check
async def test_a_failed_commit_latches_the_failure_and_the_output_does_not_hang(world: World) -> None:
    async with world.session() as hooks:
        faulty = FaultyHooks(hooks, fail={"commit": 1})
        with raises(CheckpointError):
            async with open_scope(faulty, scope="s") as scope:
                numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
                out = await scope.open_stream(OUT, node="h", groups=("o",))
                await numbers.writer().send(1)
                await numbers.writer().finish()

                async def h(tx: MessageTx[None], value: int) -> None:
                    tx.send(out.writer(), value)

                try:
                    await handle_messages(numbers.reader("g"), h)
                finally:
                    with anyio.fail_after(10), raises(CheckpointError):
                        await out.writer().fail()


@check
async def test_a_cancelled_handler_leaves_the_endpoint_agreeing_with_the_ledger(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        out = await scope.open_stream(OUT, node="h", groups=("o",))
        await _send_finished(numbers, 200)
        seen: list[int] = []

        with anyio.CancelScope() as first_call:

            async def h(tx: MessageTx[int], value: int) -> None:
                seen.append(value)
                tx.set_state(tx.state + value)
                tx.send(out.writer(), value)
                if len(seen) == 50:  # cancelled inside message 50: it is not confirmed
                    first_call.cancel()
                    await anyio.lowlevel.checkpoint()

            await handle_messages(numbers.reader("g"), h, initial_state=0)
        assert first_call.cancelled_caught
        # What the first call finished, and only that, is confirmed: messages 1 to 49.
        (group,) = numbers.snapshot().groups
        assert group.acked_through == 49
        assert out.snapshot().appended == 49

        result = await handle_messages(numbers.reader("g"), h, initial_state=0)
        assert result.handled == 151  # 50 again, then the rest
        assert result.state == sum(range(1, 201))
        assert out.snapshot().appended == 200
        await out.writer().finish()
        assert [m.value async for m in out.reader("o")] == list(range(1, 201))


@check
async def test_concurrent_opens_of_a_stream_share_one_endpoint_and_one_generation(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        opened = []

        async def open_one() -> None:
            opened.append(await scope.open_stream(NUMBERS, node="src", groups=("g",)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(open_one)
            tg.start_soon(open_one)
        assert opened[0] is opened[1]
        assert opened[0].generation == 1
        await opened[0].writer().send(1)
        await opened[0].writer().flush()


@check
async def test_acking_by_sequence_before_receiving_skips_that_message(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await _send_finished(stream, 3)
        reader = stream.reader("g")
        await reader.ack(1)
        assert [m.seq async for m in reader] == [2, 3]


@check
async def test_a_handler_takes_over_messages_a_reader_received_but_did_not_ack(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await _send_finished(stream, 3)
        assert (await stream.reader("g").receive()).seq == 1
        order: list[int] = []

        async def h(tx: MessageTx[None], value: int) -> None:
            order.append(value)

        await handle_messages(stream.reader("g"), h)
        assert order == [1, 2, 3]
        assert stream.snapshot().groups[0].acked_through == 3


@check
async def test_a_stopped_group_holds_back_neither_the_writer_nor_compaction(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), capacity=4)
        await stream.writer().send(1)

        async def stop(tx: MessageTx[None], value: int) -> None:
            tx.stop()

        await handle_messages(stream.reader("g"), stop)
        with anyio.fail_after(10):
            for i in range(2, 12):
                await stream.writer().send(i)
            await stream.writer().flush()
        assert stream.snapshot().appended == 11


@check
async def test_two_handlers_cannot_write_one_output_stream(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("a", "b"))
        out = await scope.open_stream(OUT, node="h", groups=("o",))
        await _send_finished(numbers, 4)
        first_staged = anyio.Event()
        release = anyio.Event()

        async def slow(tx: MessageTx[None], value: int) -> None:
            tx.send(out.writer(), value)
            if value == 2:  # message 1 is staged: this run writes `out` now
                first_staged.set()
                await release.wait()

        async def other(tx: MessageTx[None], value: int) -> None:
            tx.send(out.writer(), value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(handle_messages, numbers.reader("a"), slow)
            await first_staged.wait()
            with raises(StreamStateError, match="another running message handler"):
                await handle_messages(numbers.reader("b"), other)
            release.set()
        assert out.snapshot().appended == 4


@check
async def test_a_plain_ack_on_a_group_a_handler_consumes_is_refused(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await stream.writer().send(1)
        await stream.writer().flush()
        acked = anyio.Event()

        async def h(tx: MessageTx[None], value: int) -> None:
            with raises(GroupBusyError):
                await stream.reader("g").ack(1)
            acked.set()

        await handle_messages(stream.reader("g"), h, limit=1)
        assert acked.is_set()


@cases(("a/b",), ("",), ("bad\udc80",), ids=["slash", "empty", "not-utf-8"])
async def test_names_that_could_collide_or_not_be_stored_are_refused(world: World, name: str) -> None:
    async with world.session() as hooks:
        with raises(ValueError):
            async with open_scope(hooks, scope=name):
                pass
        async with open_scope(hooks, scope="s") as scope:
            with raises(ValueError):
                await scope.open_stream(NUMBERS, node=name, groups=("g",))
            with raises(ValueError):
                await scope.open_stream(NUMBERS, node="src", groups=(name,))


@check
async def test_a_waiting_reader_never_takes_messages_from_a_handler(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        handled: list[int] = []
        refused = anyio.Event()

        async def plain_reader() -> None:
            with raises(GroupBusyError):
                await stream.reader("g").receive()
            refused.set()

        async def h(tx: MessageTx[None], value: int) -> None:
            handled.append(value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(plain_reader)
            await anyio.wait_all_tasks_blocked()  # the reader waits in receive()
            tg.start_soon(handle_messages, stream.reader("g"), h)
            await anyio.wait_all_tasks_blocked()  # the handler claimed the group
            await _send_finished(stream, 3)
        assert refused.is_set()
        assert handled == [1, 2, 3]


@check
async def test_a_latched_failure_stops_the_next_handler_run_before_its_handler(world: World) -> None:
    async with world.session() as hooks:
        faulty = FaultyHooks(hooks, fail={"commit": 1})
        with raises(CheckpointError):
            async with open_scope(faulty, scope="s") as scope:
                stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
                for i in range(3):
                    await stream.writer().send(i)
                await stream.writer().finish()
                calls: list[int] = []

                async def h(tx: MessageTx[None], value: int) -> None:
                    calls.append(value)

                with raises(CheckpointError) as first:
                    await handle_messages(stream.reader("g"), h)
                calls.clear()
                with raises(CheckpointError) as second:
                    await handle_messages(stream.reader("g"), h)
                assert calls == []
                assert second.value is first.value
                raise first.value


@check
async def test_a_stopped_group_keeps_no_values_and_its_reader_is_refused(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), capacity=4, resumable=True)
        await stream.writer().send(1)

        async def stop(tx: MessageTx[None], value: int) -> None:
            tx.stop()

        await handle_messages(stream.reader("g"), stop)
        for i in range(100):
            await stream.writer().send(i)
        await stream.writer().flush()
        assert core_of(stream).held <= stream.capacity
        with raises(StreamStateError, match="stopped"):
            await stream.reader("g").receive()
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), capacity=4, resumable=True)
        assert core_of(stream).held == 0  # a recovery loads no tail for a group that reads no more


@check
async def test_a_failed_attempt_leaves_no_trace_in_the_state_of_the_retry(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await stream.writer().send(5)
        await stream.writer().finish()
        seen: list[dict[str, int]] = []

        async def h(tx: MessageTx[dict[str, int]], value: int) -> None:
            seen.append(dict(tx.state))
            tx.state["total"] += value  # in place: outside the transaction
            if tx.attempt == 0:
                raise RuntimeError("transient")
            tx.set_state(tx.state)

        result = await handle_messages(stream.reader("g"), h, initial_state={"total": 0}, attempts=2)
        assert seen == [{"total": 0}, {"total": 0}]
        assert result.state == {"total": 5}


@check
async def test_a_value_too_large_for_its_type_is_a_payload_error_not_a_failed_attempt(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        out = await scope.open_stream(OUT, node="h", groups=("o",))
        await numbers.writer().send(1)
        await numbers.writer().finish()

        async def h(tx: MessageTx[None], value: int) -> None:
            tx.send(out.writer(), 2**70)

        with raises(PayloadTypeError):
            await handle_messages(numbers.reader("g"), h, attempts=3)
        assert numbers.snapshot().groups[0].exhausted == 0


@check
async def test_a_failed_append_surfaces_as_a_checkpoint_error(world: World) -> None:
    async with world.session() as hooks:
        faulty = FaultyHooks(hooks, fail={"append": 1})
        with raises(CheckpointError):
            async with open_scope(faulty, scope="s") as scope:
                stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
                await stream.writer().send(1)
                await anyio.sleep_forever()


@check
async def test_a_commit_error_that_meets_a_cancellation_is_raised_as_itself(world: World) -> None:
    gate = anyio.Event()

    class SlowFailingCommit(PassThroughHooks):
        async def commit(self, commits: Sequence[MessageCommit]) -> None:
            await gate.wait()
            raise CheckpointError("commit refused")

    async with world.session() as hooks:
        refusing = SlowFailingCommit(hooks)
        async with open_scope(refusing, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
            for i in range(3):
                await stream.writer().send(i)
            await stream.writer().flush()
            outer = anyio.CancelScope()

            async def h(tx: MessageTx[None], value: int) -> None:
                if value == 1:  # message 0's commit is in flight: cancel, then let it fail
                    outer.cancel()
                    gate.set()
                    await anyio.sleep_forever()

            with raises(CheckpointError, match="commit refused"), outer:
                await handle_messages(stream.reader("g"), h)
