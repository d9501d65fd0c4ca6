"""Dead letters and retry backoff, on every store: exhausted messages move on, delays survive restarts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import anyio

from .. import (
    Backoff,
    CheckpointError,
    DeadLetter,
    HandlerContractError,
    Key,
    ManagedStream,
    MemoryStore,
    MessageTx,
    Stream,
    StreamHooks,
    StreamRef,
    handle_messages,
    open_scope,
)
from .._store._records import MessageAttempt
from .._testing import InjectedFault, PassThroughHooks
from .._type_names import type_name
from ..store import MessageCommit, MessageFail, StreamOpen
from ._support import World, check, raises
from .records import NUMBERS

DEAD: Final = Key("numbers.dead", Stream[DeadLetter[int]])


async def _fragile(tx: MessageTx[int], value: int) -> None:
    if value == 2:
        raise KeyError("card 4242 declined")  # its text is private: never stored
    tx.set_state(tx.state + value)


async def _three_numbers(hooks: StreamHooks, scope_name: str) -> None:
    async with open_scope(hooks, scope=scope_name) as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        for i in (1, 2, 3):
            await stream.writer().send(i)
        await stream.writer().finish()


@check
async def test_an_exhausted_message_goes_to_its_dead_letters_with_its_ack_and_the_group_moves_on(
    world: World,
) -> None:
    async with world.session() as hooks:
        await _three_numbers(hooks, "dl")
        async with open_scope(hooks, scope="dl") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
            dead = await scope.open_stream(DEAD, node="src", groups=("ops",))
            result = await handle_messages(
                stream.reader("a"), _fragile, initial_state=0, attempts=2, dead_letter=dead.writer()
            )
            assert (result.handled, result.state) == (3, 1 + 3)
            await dead.writer().finish()
            letters = [m.value async for m in dead.reader("ops")]
    assert letters == [
        DeadLetter(
            source="dl/src/numbers", seq=2, group="a", node="a", attempts=2, error_type="KeyError", message=2
        )
    ]
    assert "4242" not in repr(letters)
    async with world.session() as hooks:
        opened = await hooks.open(
            StreamOpen(StreamRef("dl", "src", "numbers"), type_name(int), 8, ("a",), True)
        )
        (a,) = opened.groups
        assert (a.acked_through, a.exhausted, a.dead_lettered) == (3, (), 1)


class _LosesDeadLetters(PassThroughHooks):
    """The process dies after a message's exhaustion was confirmed, before its dead letter was."""

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        if any(c.dead_letter for c in commits):
            raise InjectedFault("the process died before the dead letter was confirmed")
        await self.inner.commit(commits)


@check
async def test_a_message_exhausted_before_a_restart_goes_to_the_dead_letters_after_it(world: World) -> None:
    async with world.session() as hooks:
        await _three_numbers(hooks, "dl-crash")
        with raises(CheckpointError):
            async with open_scope(_LosesDeadLetters(hooks), scope="dl-crash") as scope:
                stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
                dead = await scope.open_stream(DEAD, node="src", groups=("ops",), resumable=True)
                await handle_messages(
                    stream.reader("a"), _fragile, initial_state=0, attempts=2, dead_letter=dead.writer()
                )
    async with world.session() as hooks, open_scope(hooks, scope="dl-crash") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        dead = await scope.open_stream(DEAD, node="src", groups=("ops",), resumable=True)
        handled: list[int] = []

        async def record(tx: MessageTx[int], value: int) -> None:
            handled.append(value)
            tx.set_state(tx.state + value)

        result = await handle_messages(
            stream.reader("a"), record, initial_state=0, attempts=2, dead_letter=dead.writer()
        )
        assert (result.handled, handled) == (2, [3])  # message 2 was exhausted: not handled again
        await dead.writer().finish()
        letters = [m.value async for m in dead.reader("ops")]
    assert [(d.seq, d.attempts, d.error_type) for d in letters] == [(2, 2, "KeyError")]


@check
async def test_dead_letters_go_only_to_a_stream_of_the_messages_dead_letters_on_the_same_store(
    world: World,
) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="dl-type") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",))
        wrong: list[ManagedStream[Any]] = [
            await scope.open_stream(Key("other", Stream[int]), node="src", groups=("ops",)),
            await scope.open_stream(Key("strs", Stream[DeadLetter[str]]), node="src", groups=("ops",)),
        ]
        for other in wrong:
            with raises(HandlerContractError, match=r"go to a Stream\[DeadLetter\[int\]\]"):
                await handle_messages(
                    stream.reader("a"), _fragile, initial_state=0, dead_letter=other.writer()
                )
        async with open_scope(MemoryStore(), scope="elsewhere") as elsewhere:
            foreign = await elsewhere.open_stream(DEAD, node="src", groups=("ops",))
            with raises(HandlerContractError, match="on another store"):
                await handle_messages(
                    stream.reader("a"), _fragile, initial_state=0, dead_letter=foreign.writer()
                )
            await foreign.writer().finish()
        await stream.writer().finish()
        for other in wrong:
            await other.writer().finish()
    async with world.session() as hooks:
        opened = await hooks.open(
            StreamOpen(StreamRef("dl-type", "src", "numbers"), type_name(int), 8, ("a",))
        )
        assert opened.groups[0].failing == ()  # refused before any attempt: no budget was spent


class _NotesFailures(PassThroughHooks):
    """Sets :attr:`failed` once a failed attempt is confirmed."""

    def __init__(self, inner: StreamHooks) -> None:
        super().__init__(inner)
        self.failed = anyio.Event()

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        attempt = await self.inner.fail_message(request)
        self.failed.set()
        return attempt


@check
async def test_retries_wait_out_their_backoff_and_a_restart_does_not_retry_sooner(world: World) -> None:
    attempts: list[float] = []

    async def flaky(tx: MessageTx[int], value: int) -> None:
        attempts.append(time.time())
        if len(attempts) < 3:
            raise ValueError("not yet")
        tx.set_state(tx.state + value)

    async with world.session() as hooks:
        async with open_scope(hooks, scope="backoff") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
            await stream.writer().send(1)
            await stream.writer().finish()
        noting = _NotesFailures(hooks)
        async with open_scope(noting, scope="backoff") as scope, anyio.create_task_group() as tg:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
            backoff = Backoff(0.3, factor=2)
            tg.start_soon(
                lambda: handle_messages(
                    stream.reader("a"), flaky, initial_state=0, attempts=5, backoff=backoff
                )
            )
            await noting.failed.wait()
            tg.cancel_scope.cancel()  # the process stops while the retry waits
    assert len(attempts) == 1
    async with world.session() as hooks, open_scope(hooks, scope="backoff") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        result = await handle_messages(
            stream.reader("a"), flaky, initial_state=0, attempts=5, backoff=backoff
        )
        assert result.handled == 1
    first, second, third = attempts
    assert second - first >= 0.3  # counted from the failure the ledger confirmed, before the restart
    assert third - second >= 0.6


@check
async def test_a_budget_lowered_across_a_restart_sends_the_message_to_its_dead_letters(world: World) -> None:
    async with world.session() as hooks:
        await _three_numbers(hooks, "dl-lower")
        noting = _NotesFailures(hooks)
        async with open_scope(noting, scope="dl-lower") as scope, anyio.create_task_group() as tg:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
            slow = Backoff(3600)  # the run waits after its first failure: 1 of a budget of 5
            tg.start_soon(
                lambda: handle_messages(
                    stream.reader("a"), _fragile, initial_state=0, attempts=5, backoff=slow
                )
            )
            await noting.failed.wait()
            tg.cancel_scope.cancel()
    async with world.session() as hooks, open_scope(hooks, scope="dl-lower") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        dead = await scope.open_stream(DEAD, node="src", groups=("ops",))
        result = await handle_messages(
            stream.reader("a"), _fragile, initial_state=0, attempts=1, dead_letter=dead.writer()
        )
        assert (result.handled, result.state) == (2, 1 + 3)  # message 1 was confirmed before the stop
        await dead.writer().finish()
        assert [(m.value.seq, m.value.attempts) async for m in dead.reader("ops")] == [(2, 1)]
