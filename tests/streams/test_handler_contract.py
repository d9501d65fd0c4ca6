"""Programming errors in a handler are refused before they spend any attempt of a message's budget."""

from __future__ import annotations

from typing import Any

import pytest

from streams import (
    HandlerContractError,
    Key,
    MemoryStore,
    MessageTx,
    Stream,
    StreamScope,
    StreamStateError,
    handle_messages,
    open_scope,
)

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])


async def _numbers(scope: StreamScope, *values: int) -> Any:
    stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
    for value in values:
        await stream.writer().send(value)
    await stream.writer().finish()
    return stream


async def _handled_once_with_one_attempt(stream: Any) -> list[int]:
    """The group's messages handled by a correct handler with a budget of one: nothing was spent."""
    seen: list[int] = []

    async def good(tx: MessageTx[None], value: int) -> None:
        assert tx.attempt == 0  # no failure was confirmed before
        seen.append(value)

    result = await handle_messages(stream.reader("g"), good, attempts=1)
    assert result.handled == len(seen)
    return seen


async def test_a_handler_that_is_not_async_is_refused_and_spends_no_attempt() -> None:
    calls: list[int] = []

    def forgot_async(tx: MessageTx[None], value: int) -> None:
        calls.append(value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1, 2)
        with pytest.raises(HandlerContractError, match="returned NoneType, not an awaitable"):
            await handle_messages(stream.reader("g"), forgot_async, attempts=1)  # type: ignore[arg-type]
        assert calls == [1]  # it ran once, for the first message, and nothing was confirmed
        assert await _handled_once_with_one_attempt(stream) == [1, 2]


async def test_reading_a_state_never_given_is_refused_and_spends_no_attempt() -> None:
    async def forgot_initial_state(tx: MessageTx[Any], value: int) -> None:
        tx.set_state(tx.state + value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1, 2)
        with pytest.raises(HandlerContractError, match=r"given no initial_state .* pass initial_state="):
            await handle_messages(stream.reader("g"), forgot_initial_state, attempts=1)
        result = await handle_messages(stream.reader("g"), forgot_initial_state, initial_state=0, attempts=1)
        assert (result.handled, result.state) == (2, 3)


async def test_a_state_staged_by_an_earlier_message_is_read_by_the_next_without_an_initial_state() -> None:
    """tx.state is the last state staged: the first message sets one, the next messages read it, as
    they would once it was committed (a second run over the same group)."""

    async def counts(tx: MessageTx[Any], value: int) -> None:
        tx.set_state(value if value == 1 else tx.state + value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1, 2, 3)
        result = await handle_messages(stream.reader("g"), counts, attempts=1)
        assert (result.handled, result.state) == (3, 6)


async def test_none_given_as_the_initial_state_is_a_state() -> None:
    async def reads(tx: MessageTx[int | None], value: int) -> None:
        tx.set_state(value if tx.state is None else tx.state + value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1, 2)
        result = await handle_messages(stream.reader("g"), reads, initial_state=None, state_type=int | None)
        assert result.state == 3


async def test_async_callables_and_functions_returning_awaitables_are_handlers() -> None:
    seen: list[int] = []

    class Counter:
        async def __call__(self, tx: MessageTx[None], value: int) -> None:
            seen.append(value)

    async def record(value: int) -> None:
        seen.append(-value)

    def returns_a_coroutine(tx: MessageTx[None], value: int) -> Any:
        return record(value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1)
        await handle_messages(stream.reader("g"), Counter())
        other = await scope.open_stream(Key("more", Stream[int]), node="src", groups=("g",))
        await other.writer().send(2)
        await other.writer().finish()
        await handle_messages(other.reader("g"), returns_a_coroutine)
    assert seen == [1, -2]


async def test_a_handler_that_is_not_callable_is_refused_before_anything() -> None:
    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1)
        with pytest.raises(HandlerContractError, match="takes an async handler"):
            await handle_messages(stream.reader("g"), "handler")  # type: ignore[call-overload]
        assert await _handled_once_with_one_attempt(stream) == [1]


@pytest.mark.parametrize("wrong", ["seven", 7.0, True, None])
async def test_ack_of_something_that_is_not_a_message_or_a_sequence_is_a_type_error(wrong: Any) -> None:
    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1)
        reader = stream.reader("g")
        await reader.receive()
        with pytest.raises(TypeError, match="ack takes a Message this reader received"):
            await reader.ack(wrong)
        await reader.ack(1)  # nothing was acknowledged by the refused call
        assert stream.snapshot().groups[0].acked_through == 1


async def test_a_transaction_kept_past_its_call_stays_closed_and_its_own_while_later_messages_run() -> None:
    kept: list[MessageTx[int]] = []
    refused: list[str] = []

    async def keeps(tx: MessageTx[int], value: int) -> None:
        if value == 2:
            kept.append(tx)
        elif kept:
            assert kept[0] is not tx and kept[0].seq == 2
            try:
                kept[0].set_state(-1000)
            except StreamStateError as exc:
                refused.append(str(exc))
        tx.set_state(tx.state + value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, 1, 2, 3, 4)
        result = await handle_messages(stream.reader("g"), keeps, initial_state=0)
    assert (result.handled, result.state) == (4, 10)
    assert len(refused) == 2 and all(
        "message 2: set_state after its handler call returned" in r for r in refused
    )


async def test_each_message_stages_only_what_its_own_handler_call_did() -> None:
    """One message's state, outputs and results never carry over to the next message's transaction."""
    echoes = Key("echoes", Stream[int])
    last = Key("last", int)

    async def alternate(tx: MessageTx[int], value: int) -> None:
        assert (tx.seq, tx.attempt) == (value, 0)
        if value % 2:
            tx.send(writer, value)
            if value == 5:
                tx.set(last, value)
        else:
            tx.set_state(tx.state + value)

    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await _numbers(scope, *range(1, 9))
        out = await scope.open_stream(echoes, node="h", groups=("r",))
        writer = out.writer()
        result = await handle_messages(stream.reader("g"), alternate, initial_state=0)
        await writer.finish()
        reader = out.reader("r")
        sent = [(await reader.receive()).value for _ in range(4)]
        assert out.snapshot().appended == 4
    assert sent == [1, 3, 5, 7]
    assert (result.handled, result.state, result.result(last)) == (8, 2 + 4 + 6 + 8, 5)
