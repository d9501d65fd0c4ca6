"""An operator's consumer groups: removal, moves, retention, dead letters, on every store."""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec

from .. import (
    CheckpointError,
    CompactedHistoryError,
    MessageExhaustedError,
    MessageTx,
    SequenceError,
    StreamHooks,
    StreamRef,
    UnknownStreamError,
    handle_messages,
    move_group,
    open_scope,
    remove_group,
)
from .._store._records import GroupFrontier, OutputBatch, StreamOpened
from .._type_names import type_name
from ..store import AppendBatch, MessageCommit, MessageFail, MessageOpen, MessageRef, StreamOpen
from ._support import World, check, raises
from .records import NUMBERS

INT: Final = type_name(int)
#: Names long enough that a store keying budgets by them must shorten its keys.
LONG_GROUP: Final = "g" * 300
LONG_NODE: Final = "n" * 300


def _ref(scope: str) -> StreamRef:
    return StreamRef(scope, "src", "numbers")


async def _opened(hooks: StreamHooks, ref: StreamRef, groups: tuple[str, ...], **fields: Any) -> StreamOpened:
    return await hooks.open(StreamOpen(ref, INT, 1024, groups, True, **fields))


async def _appended(hooks: StreamHooks, ref: StreamRef, groups: tuple[str, ...], n: int) -> int:
    """Open ``ref`` with ``groups`` and append messages 1 to ``n``; its generation."""
    opened = await _opened(hooks, ref, groups)
    payloads = tuple(msgspec.msgpack.encode(i) for i in range(1, n + 1))
    await hooks.append(AppendBatch(ref, opened.generation, 1, payloads))
    return opened.generation


def _frontier(opened: StreamOpened, group: str) -> GroupFrontier:
    return next(g for g in opened.groups if g.group == group)


async def _add(tx: MessageTx[int], value: int) -> None:
    tx.set_state(tx.state + value)


@check
async def test_a_removed_group_frees_what_it_held_back(world: World) -> None:
    ref = _ref("remove")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a", "b"), 2000)
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 1), through=2000)])
        held = await _opened(hooks, ref, ("a", "b"))
        assert len(held.tail) == 2000  # group b acknowledged none
        await remove_group(hooks, ref, "b")
    async with world.session() as hooks:
        opened = await _opened(hooks, ref, ("a",))
        assert [g.group for g in opened.groups] == ["a"] and opened.tail == ()
        assert opened.generation == held.generation + 2  # the removal raised it too
        with raises(CompactedHistoryError, match="messages 1 to 2000"):
            await _opened(hooks, ref, ("a", "c"))  # gone: compaction ran without b


@check
async def test_a_removed_group_named_again_comes_back_new_with_whole_budgets(world: World) -> None:
    ref = _ref("budgets")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a", LONG_GROUP), 3)
        for group in ("a", LONG_GROUP):
            for node in ("n", LONG_NODE):
                message = MessageRef(ref, group, generation, 1)
                await hooks.fail_message(MessageFail(message, node=node, limit=5, index=0))
        await remove_group(hooks, ref, LONG_GROUP)
        opened = await _opened(hooks, ref, ("a", LONG_GROUP))
        back = _frontier(opened, LONG_GROUP)
        assert (back.acked_through, back.failing, back.exhausted) == (0, (), ())
        for group, index in (("a", 1), (LONG_GROUP, 0)):
            for node in ("n", LONG_NODE):
                message = MessageRef(ref, group, opened.generation, 1)
                attempt = await hooks.open_message(MessageOpen(message, node=node, limit=5))
                assert attempt.index == index, (group[:3], node[:3])


@check
async def test_a_moved_group_receives_again_or_skips_and_keeps_or_clears_its_state(world: World) -> None:
    ref = StreamRef("move", "src", "numbers")
    async with world.session() as hooks, open_scope(hooks, scope="move") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        for i in range(1, 6):
            await stream.writer().send(i)
        result = await handle_messages(stream.reader("a"), _add, initial_state=0, limit=5)
        assert result.state == 15
    async with world.session() as hooks:
        moved = await move_group(hooks, ref, "a", to=3, keep_state=True)
        assert moved.acked_through == 2 and moved.state == msgspec.msgpack.encode(15)
    async with world.session() as hooks, open_scope(hooks, scope="move") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        result = await handle_messages(stream.reader("a"), _add, initial_state=0, limit=3)
        assert (result.handled, result.state) == (3, 15 + 3 + 4 + 5)
        for i in range(6, 9):
            await stream.writer().send(i)
        await stream.writer().flush()
    async with world.session() as hooks:
        moved = await move_group(hooks, ref, "a", to="latest", keep_state=False)
        assert (moved.acked_through, moved.state, moved.results) == (8, None, {})
    async with world.session() as hooks, open_scope(hooks, scope="move") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        await stream.writer().finish()
        result = await handle_messages(stream.reader("a"), _add, initial_state=100)
        assert (result.handled, result.state) == (0, 100)  # messages 6 to 8 skipped, the state cleared
    async with world.session() as hooks:
        with raises(CompactedHistoryError, match="messages 1 to 8"):
            await move_group(hooks, ref, "a", to="earliest", keep_state=True)


@check
async def test_a_refused_group_change_changes_nothing(world: World) -> None:
    ref = _ref("refused")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a",), 5)
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 1), through=2)])
        with raises(UnknownStreamError, match="has no consumer group 'z'"):
            await remove_group(hooks, ref, "z")
        with raises(UnknownStreamError, match="never opened"):
            await move_group(hooks, _ref("nowhere"), "a", to=1, keep_state=True)
        with raises(SequenceError, match="only 5 messages were appended"):
            await move_group(hooks, ref, "a", to=7, keep_state=True)
        with raises(ValueError, match="a group moves to"):
            await move_group(hooks, ref, "a", to=0, keep_state=True)
        opened = await _opened(hooks, ref, ("a",))
        assert opened.generation == generation + 1  # this open's own
        assert _frontier(opened, "a").acked_through == 2


@check
async def test_a_group_change_fences_off_endpoints_open_on_the_stream(world: World) -> None:
    ref = StreamRef("fence", "src", "numbers")
    async with world.session() as hooks:
        with raises(CheckpointError, match="fenced off"):
            async with open_scope(hooks, scope="fence") as scope:
                stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
                await stream.writer().send(1)
                await stream.writer().flush()
                await move_group(hooks, ref, "a", to="latest", keep_state=True)
                await stream.writer().send(2)
                await stream.writer().flush()
    async with world.session() as hooks:
        opened = await _opened(hooks, ref, ("a",))
        assert opened.appended == 1 and _frontier(opened, "a").acked_through == 1


@check
async def test_a_group_moved_back_handles_its_exhausted_message_with_a_whole_budget(world: World) -> None:
    ref = StreamRef("again", "src", "numbers")

    async def fragile(tx: MessageTx[int], value: int) -> None:
        if value == 2:
            raise ValueError("a bug")
        tx.set_state(tx.state + value)

    async with world.session() as hooks, open_scope(hooks, scope="again") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        for i in (1, 2, 3):
            await stream.writer().send(i)
        await stream.writer().finish()
        with raises(MessageExhaustedError):
            await handle_messages(stream.reader("a"), fragile, initial_state=0, attempts=2)
    async with world.session() as hooks:
        await move_group(hooks, ref, "a", to=2, keep_state=True)
    async with world.session() as hooks, open_scope(hooks, scope="again") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        result = await handle_messages(stream.reader("a"), _add, initial_state=0, attempts=2)
        assert (result.handled, result.state) == (2, 1 + 2 + 3)


@check
async def test_retained_messages_outlive_their_acknowledgement(world: World) -> None:
    ref = StreamRef("retain", "src", "numbers")
    async with world.session() as hooks, open_scope(hooks, scope="retain") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), retain=3)
        for i in range(1, 11):
            await stream.writer().send(i)
        await stream.writer().finish()
        assert (await handle_messages(stream.reader("a"), _add, initial_state=0)).state == 55
    async with world.session() as hooks:
        with raises(CompactedHistoryError, match="messages 1 to 7"):
            await hooks.open(StreamOpen(ref, INT, 1024, ("a", "b"), start="earliest"))
        opened = await hooks.open(StreamOpen(ref, INT, 1024, ("a", "b"), start=8))  # keeps retain=3
        assert _frontier(opened, "b").acked_through == 7
        assert [m.seq for m in opened.tail] == [8, 9, 10]
        with raises(ValueError, match="retain is a number of messages"):
            async with open_scope(hooks, scope="retain-bad") as scope:
                await scope.open_stream(NUMBERS, node="src", retain=-1)
    async with world.session() as hooks, open_scope(hooks, scope="retain") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a", "b"))  # names no retain: keeps 3
        await handle_messages(stream.reader("b"), _add, initial_state=0)
    async with world.session() as hooks:  # b acknowledged everything: the last 3 are still kept
        opened = await hooks.open(StreamOpen(ref, INT, 1024, ("a", "b", "c"), start=8))
        assert [m.seq for m in opened.tail] == [8, 9, 10]


@check
async def test_only_an_exhausted_message_is_dead_lettered_with_its_ack(world: World) -> None:
    ref, letters = _ref("dead"), StreamRef("dead", "src", "letters")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a",), 2)
        out = (await hooks.open(StreamOpen(letters, "bytes", 1024, ("ops",)))).generation
        message = MessageRef(ref, "a", generation, 1)
        failed = await hooks.fail_message(
            MessageFail(message, node="n", limit=2, index=0, error_type="ValueError", at=1234.5)
        )
        assert (failed.failed_at, failed.error_type) == (1234.5, "ValueError")
        reopened = await hooks.open_message(MessageOpen(message, node="n", limit=2))
        assert (reopened.index, reopened.failed_at, reopened.error_type) == (1, 1234.5, "ValueError")
        assert _frontier(await _opened(hooks, ref, ("a",)), "a").active_at == 1234.5  # its last activity
        generation += 1  # that open raised it
        message = MessageRef(ref, "a", generation, 1)
        letter = (OutputBatch(letters, out, 1, (b"x",)),)
        with raises(SequenceError, match="has not exhausted its attempt budget"):
            await hooks.commit(
                [MessageCommit(message, node="n", attempt=1, outputs=letter, dead_letter=True)]
            )
        await hooks.fail_message(MessageFail(message, node="n", limit=2, index=1, error_type="ValueError"))
        with raises(SequenceError, match="exactly one message"):
            await hooks.commit([MessageCommit(message, node="n", attempt=2, dead_letter=True)])
        before = time.time()
        await hooks.commit([MessageCommit(message, node="n", attempt=2, outputs=letter, dead_letter=True)])
        opened = await _opened(hooks, ref, ("a",))
        a = _frontier(opened, "a")
        assert (a.acked_through, a.exhausted, a.dead_lettered) == (1, (), 1)
        assert a.active_at >= before  # an ack is activity too
        assert (await hooks.open(StreamOpen(letters, "bytes", 1024, ("ops",), True))).appended == 1
        again = MessageRef(ref, "a", opened.generation, 1)
        with raises(SequenceError, match="already acknowledged"):
            await hooks.open_message(MessageOpen(again, node="n", limit=2))
