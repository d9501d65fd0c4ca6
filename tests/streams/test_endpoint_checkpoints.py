"""Every async operation of a stream endpoint is a checkpoint; the ``*_nowait`` methods are the fast path.

A checkpoint yields to the scheduler and raises a pending cancellation
before the operation does anything, even when it could complete at once
(anyio's and trio's rule). Nothing here waits for time to pass: a
cancellation comes from another task woken by an event, or from a deadline
already reached, which only a checkpoint notices.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from streams import (
    Key,
    ManagedStream,
    MemoryStore,
    PayloadTypeError,
    Stream,
    StreamClosedError,
    StreamFailedError,
    open_scope,
)

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])
#: The length of the loops cancelled: more than any batch, window or capacity default of the engine.
LOOP = 10_000
#: Where a loop asks to be cancelled.
CANCEL_AT = 100


@asynccontextmanager
async def _stream(*, capacity: int = LOOP) -> AsyncIterator[ManagedStream[int]]:
    async with open_scope(MemoryStore(), scope="s") as scope:
        yield await scope.open_stream(NUMBERS, node="src", groups=("g",), capacity=capacity)


async def _confirmed(stream: ManagedStream[int], n: int) -> None:
    """``n`` messages sent and confirmed, ready for the group to read."""
    writer = stream.writer()
    for i in range(n):
        writer.send_nowait(i)
    await writer.flush()


# -- a loop of sends or receives yields and sees its cancellation ------------------------


async def test_a_send_loop_is_cancelled_from_another_task_at_its_next_send() -> None:
    async with _stream() as stream:
        writer = stream.writer()
        sent = 0
        cancelled_at: list[int] = []
        asked = anyio.Event()
        with anyio.CancelScope() as loop:
            async with anyio.create_task_group() as tg:

                async def cancel_the_loop() -> None:
                    await asked.wait()
                    cancelled_at.append(sent)
                    loop.cancel()

                tg.start_soon(cancel_the_loop)
                for i in range(LOOP):
                    await writer.send(i)
                    sent += 1
                    if sent == CANCEL_AT:
                        asked.set()
        assert loop.cancelled_caught
        # The canceller ran at the send after it was woken (trio may run it one send later), and the
        # send it cancelled raised before it queued anything: every message counted, none more.
        assert cancelled_at == [sent]
        assert CANCEL_AT <= sent <= CANCEL_AT + 1
        await writer.flush()
        assert stream.snapshot().appended == sent


async def test_a_send_loop_is_cancelled_by_a_reached_deadline_at_its_next_send() -> None:
    async with _stream() as stream:
        writer = stream.writer()
        sent = 0
        with anyio.CancelScope() as loop:
            for i in range(LOOP):
                await writer.send(i)
                sent += 1
                if sent == CANCEL_AT:
                    loop.deadline = -math.inf  # reached: the next checkpoint raises
        assert loop.cancelled_caught
        assert sent == CANCEL_AT
        await writer.flush()
        assert stream.snapshot().appended == CANCEL_AT


async def test_another_task_runs_between_two_sends() -> None:
    async with _stream() as stream, anyio.create_task_group() as tg:
        writer = stream.writer()
        woken, ran = anyio.Event(), anyio.Event()

        async def other(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            task_status.started()
            await woken.wait()
            ran.set()

        await tg.start(other)
        woken.set()
        sends = 0
        while not ran.is_set() and sends < LOOP:
            await writer.send(sends)
            sends += 1
        # asyncio runs the woken task at the first send's yield; trio, in either order within a batch,
        # by the end of the second.
        assert 1 <= sends <= 2


async def test_a_receive_loop_is_cancelled_from_another_task_at_its_next_receive() -> None:
    async with _stream() as stream:
        await _confirmed(stream, LOOP)
        reader = stream.reader("g")
        received = 0
        cancelled_at: list[int] = []
        asked = anyio.Event()
        with anyio.CancelScope() as loop:
            async with anyio.create_task_group() as tg:

                async def cancel_the_loop() -> None:
                    await asked.wait()
                    cancelled_at.append(received)
                    loop.cancel()

                tg.start_soon(cancel_the_loop)
                async for _ in reader:
                    received += 1
                    if received == CANCEL_AT:
                        asked.set()
        assert loop.cancelled_caught
        assert cancelled_at == [received]
        assert CANCEL_AT <= received <= CANCEL_AT + 1
        assert reader.receive_nowait().seq == received + 1  # the cancelled receive took no message


async def test_a_receive_loop_is_cancelled_by_a_reached_deadline_at_its_next_receive() -> None:
    async with _stream() as stream:
        await _confirmed(stream, LOOP)
        reader = stream.reader("g")
        received = 0
        with anyio.CancelScope() as loop:
            for _ in range(LOOP):
                await reader.receive()
                received += 1
                if received == CANCEL_AT:
                    loop.deadline = -math.inf
        assert loop.cancelled_caught
        assert received == CANCEL_AT
        assert reader.receive_nowait().seq == CANCEL_AT + 1


async def test_another_task_runs_between_two_receives() -> None:
    async with _stream() as stream, anyio.create_task_group() as tg:
        await _confirmed(stream, LOOP)
        reader = stream.reader("g")
        woken, ran = anyio.Event(), anyio.Event()

        async def other(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            task_status.started()
            await woken.wait()
            ran.set()

        await tg.start(other)
        woken.set()
        receives = 0
        while not ran.is_set() and receives < LOOP:
            await reader.receive()
            receives += 1
        assert 1 <= receives <= 2


# -- every other async operation of an endpoint --------------------------------------------


async def _cancelled(operation: Callable[[], Awaitable[object]]) -> None:
    """Run ``operation`` with a cancellation already pending; it must raise it."""
    with anyio.CancelScope() as scope:
        scope.cancel()
        await operation()
        pytest.fail("the operation completed with a cancellation pending: it is no checkpoint")
    assert scope.cancelled_caught


async def test_a_pending_cancellation_stops_every_endpoint_operation_before_it_does_anything() -> None:
    async with _stream() as stream:
        writer, reader = stream.writer(), stream.reader("g")
        await _cancelled(lambda: writer.send(1))
        await _cancelled(writer.flush)  # nothing to wait for
        await writer.flush()
        assert stream.snapshot().appended == 0  # the cancelled send queued nothing

        await _confirmed(stream, 1)
        await _cancelled(reader.receive)  # a message is ready
        message = reader.receive_nowait()  # the cancelled receive took none
        await _cancelled(lambda: reader.ack(message))
        assert stream.snapshot().groups[0].acked_through == 0

        await _cancelled(writer.finish)
        await _cancelled(writer.fail)
        assert not stream.done
        await writer.finish()
        await _cancelled(stream.wait_done)  # done already
        await _cancelled(writer.finish)  # finished already


async def test_a_send_waiting_for_room_is_cancelled_queuing_nothing_and_one_given_room_queues() -> None:
    async with _stream(capacity=1) as stream:
        writer, reader = stream.writer(), stream.reader("g")
        writer.send_nowait(1)
        waiting = anyio.CancelScope()

        async def send_into_the_full_stream() -> None:
            with waiting:
                await writer.send(2)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_into_the_full_stream)
            await anyio.wait_all_tasks_blocked()
            waiting.cancel()
        assert waiting.cancelled_caught
        await writer.flush()
        assert stream.snapshot().appended == 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.send, 2)
            await anyio.wait_all_tasks_blocked()
            assert stream.snapshot().appended == 1  # still waiting for room
            await reader.ack(await reader.receive())
        await writer.flush()
        assert stream.snapshot().appended == 2


# -- the fast paths -------------------------------------------------------------------------


async def test_send_nowait_queues_at_once_and_would_block_when_full_queuing_nothing() -> None:
    async with _stream(capacity=2) as stream:
        writer, reader = stream.writer(), stream.reader("g")
        writer.send_nowait(1, send_at=1)
        writer.send_nowait(2, send_at=2)
        with pytest.raises(anyio.WouldBlock):
            writer.send_nowait(3, send_at=3)
        with pytest.raises(PayloadTypeError):  # a refused value is refused, full or not
            writer.send_nowait("three")  # type: ignore[arg-type]
        await writer.flush()
        snapshot = stream.snapshot()
        assert (snapshot.appended, snapshot.position) == (2, 2)  # WouldBlock queued nothing

        await reader.ack(await reader.receive())
        writer.send_nowait(3, send_at=3)  # room again
        await writer.finish()
        assert [m.value async for m in reader] == [2, 3]
        with pytest.raises(StreamClosedError):
            writer.send_nowait(4)


async def test_receive_nowait_would_block_until_a_message_is_confirmed_then_ends_as_receive_does() -> None:
    async with _stream() as stream:
        writer, reader = stream.writer(), stream.reader("g")
        with pytest.raises(anyio.WouldBlock):
            reader.receive_nowait()
        writer.send_nowait(7)
        with pytest.raises(anyio.WouldBlock):  # sent, not yet confirmed
            reader.receive_nowait()
        await writer.flush()
        message = reader.receive_nowait()
        assert (message.seq, message.value, message.group) == (1, 7, "g")
        with pytest.raises(anyio.WouldBlock):
            reader.receive_nowait()
        await writer.finish()
        with pytest.raises(anyio.EndOfStream):
            reader.receive_nowait()

    async with _stream() as stream:
        await stream.writer().fail()
        with pytest.raises(StreamFailedError):
            stream.reader("g").receive_nowait()


async def test_the_nowait_methods_are_no_checkpoints() -> None:
    async with _stream() as stream:
        writer, reader = stream.writer(), stream.reader("g")
        sent = 0
        with anyio.CancelScope() as scope:
            scope.cancel()
            for i in range(LOOP):
                writer.send_nowait(i)
                sent += 1
            await anyio.lowlevel.checkpoint()  # the first checkpoint raises the cancellation
        assert (scope.cancelled_caught, sent) == (True, LOOP)
        await writer.flush()
        values: list[int] = []
        with anyio.CancelScope() as scope:
            scope.cancel()
            values.extend(reader.receive_nowait().value for _ in range(LOOP))
            await anyio.lowlevel.checkpoint()
        assert scope.cancelled_caught
        assert values == list(range(LOOP))
