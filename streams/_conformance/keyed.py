"""A group's keyed state at the record level: applied with the ack, owned by its attempt, listed in order."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from .. import (
    KeyedState,
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
from .._errors import KeyedStateError
from .._keyed import SWEEP_EVERY, SWEEP_KEYS
from .._store._hooks import KeyedHooks
from .._store._records import MAX_KEY_BYTES, KeyedRange, KeyedRead, KeyedWrite, OutputBatch
from ..store import AppendBatch, MessageCommit, MessageFail, MessageRef, StreamOpen
from ._support import World, cases, check, raises
from .groups import INT, LONG_GROUP
from .records import NUMBERS


def _ref(scope: str) -> StreamRef:
    return StreamRef(scope, "src", "numbers")


def _keyed(hooks: StreamHooks) -> KeyedHooks:
    assert isinstance(hooks, KeyedHooks), f"{hooks!r} keeps no keyed state (it is no KeyedHooks)"
    return hooks


async def _appended(hooks: StreamHooks, ref: StreamRef, groups: tuple[str, ...], n: int) -> int:
    """Open ``ref`` with ``groups`` and append messages 1 to ``n``; its generation."""
    opened = await hooks.open(StreamOpen(ref, INT, 1 << 20, groups, True))
    payloads = tuple(msgspec.msgpack.encode(i) for i in range(1, n + 1))
    if payloads:
        await hooks.append(AppendBatch(ref, opened.generation, opened.appended + 1, payloads))
    return opened.generation


async def _read(
    hooks: StreamHooks, ref: StreamRef, group: str, *keys: bytes, attempt: str = ""
) -> tuple[bytes | None, ...]:
    return await _keyed(hooks).read_keyed(KeyedRead(ref, group, keys, attempt))


async def _all(hooks: StreamHooks, ref: StreamRef, group: str, **fields: Any) -> dict[bytes, bytes]:
    entries = await _keyed(hooks).list_keyed(KeyedRange(ref, group, **{"limit": 10_000, **fields}))
    return {e.key: e.value for e in entries}


def _puts(**values: int | None) -> tuple[KeyedWrite, ...]:
    return tuple(
        KeyedWrite(k.encode(), None if v is None else msgspec.msgpack.encode(v)) for k, v in values.items()
    )


@check
async def test_keyed_writes_are_confirmed_with_the_ack_and_read_back_after_a_restart(world: World) -> None:
    ref = _ref("keyed-basic")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a", "b"), 4)
        await hooks.commit(
            [
                MessageCommit(MessageRef(ref, "a", generation, 1), keyed=_puts(x=1, y=2)),
                MessageCommit(MessageRef(ref, "a", generation, 2), keyed=_puts(x=3, z=0)),
            ]
        )
        # a run of messages: every message's writes in order, the last write of a key holds
        await hooks.commit(
            [MessageCommit(MessageRef(ref, "a", generation, 3), through=4, keyed=_puts(y=5, z=None, y2=7))]
        )
        await hooks.commit([MessageCommit(MessageRef(ref, "b", generation, 1), keyed=_puts(x=100))])
    async with world.session() as hooks:
        x, y, z, y2, w = await _read(hooks, ref, "a", b"x", b"y", b"z", b"y2", b"w")
        assert (x, y, z, y2, w) == tuple(
            None if v is None else msgspec.msgpack.encode(v) for v in (3, 5, None, 7, None)
        )
        assert await _read(hooks, ref, "b", b"x", b"y") == (msgspec.msgpack.encode(100), None)
        assert await _read(hooks, ref, "a") == ()


@check
async def test_a_refused_commit_batch_writes_no_keyed_state(world: World) -> None:
    ref = _ref("keyed-refused")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a",), 3)
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 1), keyed=_puts(x=1))])
        with raises(SequenceError, match="already acknowledged"):
            await hooks.commit(
                [
                    MessageCommit(MessageRef(ref, "a", generation, 2), keyed=_puts(x=2, y=2)),
                    MessageCommit(MessageRef(ref, "a", generation, 1), keyed=_puts(z=3)),
                ]
            )
        too_long = KeyedWrite(b"k" * (MAX_KEY_BYTES + 1), b"")
        with raises(KeyedStateError, match=f"at most {MAX_KEY_BYTES} bytes"):
            await hooks.commit(
                [MessageCommit(MessageRef(ref, "a", generation, 2), keyed=(*_puts(y=9), too_long))]
            )
    async with world.session() as hooks:
        assert await _all(hooks, ref, "a") == {b"x": msgspec.msgpack.encode(1)}
        # the longest key a ledger keeps, and an empty value (which is not a deletion)
        longest = KeyedWrite(b"k" * MAX_KEY_BYTES, b"")
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 2), keyed=(longest,))])
        assert await _read(hooks, ref, "a", longest.key) == (b"",)


@check
async def test_keyed_state_belongs_to_the_parent_attempt_that_committed_it(world: World) -> None:
    ref = _ref("keyed-attempts")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a",), 4)
        message = MessageRef(ref, "a", generation, 1)
        await hooks.commit([MessageCommit(message, parent_attempt="first", keyed=_puts(x=1, y=1))])
        assert await _read(hooks, ref, "a", b"x", attempt="first") == (msgspec.msgpack.encode(1),)
        assert await _read(hooks, ref, "a", b"x", attempt="second") == (None,)  # not its attempt's
        assert await _read(hooks, ref, "a", b"x") == (None,)
    async with world.session() as hooks:
        # the next attempt's first commit takes the group over: the last one's keys are gone,
        # its own writes (in that same commit) stay
        await hooks.commit(
            [MessageCommit(MessageRef(ref, "a", generation, 2), parent_attempt="second", keyed=_puts(y=2))]
        )
        assert await _read(hooks, ref, "a", b"x", b"y", attempt="first") == (None, None)
        assert await _read(hooks, ref, "a", b"x", b"y", attempt="second") == (
            None,
            msgspec.msgpack.encode(2),
        )
        assert await _all(hooks, ref, "a") == {b"y": msgspec.msgpack.encode(2)}
        # within one batch too: the first attempt's writes, then a takeover
        await hooks.commit(
            [
                MessageCommit(MessageRef(ref, "a", generation, 3), parent_attempt="second", keyed=_puts(z=3)),
                MessageCommit(MessageRef(ref, "a", generation, 4), parent_attempt="third", keyed=_puts(w=4)),
            ]
        )
        assert await _all(hooks, ref, "a") == {b"w": msgspec.msgpack.encode(4)}


@check
async def test_a_failure_confirms_no_keyed_state_and_a_dead_letter_carries_none(world: World) -> None:
    ref = _ref("keyed-failures")
    letters = StreamRef("keyed-failures", "src", "letters")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a",), 2)
        out = await hooks.open(StreamOpen(letters, INT, 1024, (), True))
        message = MessageRef(ref, "a", generation, 1)
        await hooks.fail_message(MessageFail(message, node="n", limit=1, index=0))
        letter = OutputBatch(letters, out.generation, 1, (b"\x01",))
        with raises(SequenceError, match="no state, keyed state"):
            await hooks.commit(
                [MessageCommit(message, node="n", outputs=(letter,), dead_letter=True, keyed=_puts(x=1))]
            )
        assert await _all(hooks, ref, "a") == {}


@check
async def test_a_removed_group_loses_its_keyed_state_and_a_moved_one_keeps_it_or_not(world: World) -> None:
    ref = _ref("keyed-groups")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a", "b", "c"), 2)
        for group in ("a", "b", "c"):
            await hooks.commit([MessageCommit(MessageRef(ref, group, generation, 1), keyed=_puts(x=1))])
        await remove_group(hooks, ref, "a")
        await move_group(hooks, ref, "b", to="earliest", keep_state=True)
        await move_group(hooks, ref, "c", to="earliest", keep_state=False)
    async with world.session() as hooks:
        await _appended(hooks, ref, ("a", "b", "c"), 0)  # a comes back, new
        assert await _all(hooks, ref, "a") == {}
        assert await _all(hooks, ref, "b") == {b"x": msgspec.msgpack.encode(1)}
        assert await _all(hooks, ref, "c") == {}


@check
async def test_keyed_state_is_listed_in_byte_order_by_range(world: World) -> None:
    ref = _ref("keyed-listing")
    other = StreamRef("keyed-listing", "src", "other")
    keys = [bytes([a, b]) for a in (0, 1, 0x7F, 0xFF) for b in (0, 0xFF)]
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a", LONG_GROUP), 1)
        other_generation = await _appended(hooks, other, ("a",), 1)
        writes = tuple(KeyedWrite(k, k * 2) for k in reversed(keys))
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 1), keyed=writes)])
        await hooks.commit([MessageCommit(MessageRef(ref, LONG_GROUP, generation, 1), keyed=writes[:2])])
        await hooks.commit([MessageCommit(MessageRef(other, "a", other_generation, 1), keyed=writes[:1])])
    async with world.session() as hooks:
        listed = await _keyed(hooks).list_keyed(KeyedRange(ref, "a"))
        assert [e.key for e in listed] == keys and all(e.value == e.key * 2 for e in listed)
        assert list(await _all(hooks, ref, "a", start=b"\x01", stop=b"\xff")) == keys[2:6]
        assert list(await _all(hooks, ref, "a", start=b"\x01\x01", stop=b"\x7f\xff")) == keys[3:5]
        assert list(await _all(hooks, ref, "a", start=b"\x01", limit=3)) == keys[2:5]
        assert await _all(hooks, ref, "a", start=b"\x02", stop=b"\x01") == {}
        assert await _all(hooks, ref, "a", limit=0) == {}
        assert list(await _all(hooks, ref, LONG_GROUP)) == sorted(w.key for w in writes[:2])
        assert list(await _all(hooks, other, "a")) == [writes[0].key]
        with raises(ValueError, match="at least 0"):
            await _keyed(hooks).list_keyed(KeyedRange(ref, "a", limit=-1))


@check
async def test_many_keys_in_one_commit_and_reads_of_unknown_groups(world: World) -> None:
    ref = _ref("keyed-many")
    async with world.session() as hooks:
        generation = await _appended(hooks, ref, ("a",), 2)
        writes = tuple(KeyedWrite(b"key-%05d" % i, msgspec.msgpack.encode(i)) for i in range(3000))
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 1), keyed=writes)])
        deletes = tuple(KeyedWrite(w.key) for w in writes[::2])
        await hooks.commit([MessageCommit(MessageRef(ref, "a", generation, 2), keyed=deletes)])
    async with world.session() as hooks:
        found = await _read(hooks, ref, "a", *(w.key for w in writes))
        assert found == tuple(None if i % 2 == 0 else w.value for i, w in enumerate(writes))
        assert len(await _all(hooks, ref, "a")) == 1500
        with raises(UnknownStreamError, match="no consumer group 'z'"):
            await _read(hooks, ref, "z", b"x")
        with raises(UnknownStreamError, match="never opened"):
            await _read(hooks, _ref("keyed-nowhere"), "a", b"x")
        with raises(UnknownStreamError, match="never opened"):
            await _keyed(hooks).list_keyed(KeyedRange(_ref("keyed-nowhere"), "a"))


async def _add_per_key(tx: MessageTx[None], value: int) -> None:
    key = f"k{value % 13}"
    total = await tx.store.get(key, 0)
    tx.store.put(key, total + value)
    if value % 50 == 0 and tx.attempt == 0:
        raise ValueError("a business failure, retried")


@cases(
    (KeyedState(str, int),),
    (KeyedState(str, int, prefetch=lambda v: f"k{v % 13}", cache=4),),
    ids=["cached", "prefetched"],
)
async def test_keyed_totals_of_a_handler_hold_across_restarts(
    world: World, spec: KeyedState[str, int]
) -> None:
    values = list(range(1, 401))
    for session in range(2):
        async with world.session() as hooks, open_scope(hooks, scope="keyed-totals") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
            if session == 0:
                for value in values:
                    await stream.writer().send(value)
            else:
                await stream.writer().finish()
            await handle_messages(
                stream.reader("g"), _add_per_key, keyed=spec, attempts=2, limit=None if session else 250
            )
    async with world.session() as hooks:
        stored = await _all(hooks, StreamRef("keyed-totals", "src", "numbers"), "g")
        totals = {spec.key_codec.decode(k): spec.value_codec.decode(v) for k, v in stored.items()}
        expected: dict[str, int] = {}
        for value in values:
            expected[f"k{value % 13}"] = expected.get(f"k{value % 13}", 0) + value
        assert totals == expected


class _Clock:
    """A clock a check sets: the keyed state's time, whatever the machine's."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _touch(tx: MessageTx[None], value: int) -> None:
    """Negative: read key ``k`` only; below 1,000: add the value to ``k``; else put key ``k<value>``."""
    if value < 0:
        await tx.store.get("k")
    elif value < 1000:
        tx.store.put("k", await tx.store.get("k", 0) + value)
    else:
        tx.store.put(f"k{value}", value)


async def _handled(world: World, scope: str, spec: KeyedState[str, int], values: list[int]) -> None:
    """Send ``values`` on scope's stream and handle them all with :func:`_touch`, in one session."""
    async with world.session() as hooks, open_scope(hooks, scope=scope) as opened:
        stream = await opened.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        for value in values:
            await stream.writer().send(value)
        await handle_messages(stream.reader("g"), _touch, keyed=spec, limit=len(values))


@check
async def test_a_key_past_its_ttl_is_gone_for_every_reader_and_the_commit_that_noticed_it_deletes_it(
    world: World,
) -> None:
    clock = _Clock(1_000.0)
    spec = KeyedState(str, int, ttl=timedelta(seconds=10), clock=clock)
    ref, k = _ref("keyed-ttl"), spec.key_codec.encode("k")
    await _handled(world, "keyed-ttl", spec, [1, 2])
    async with world.session() as hooks:
        assert await spec.get(hooks, ref, "g", "k") == 3
        assert await spec.items(hooks, ref, "g") == [("k", 3)]
        clock.now = 1_009.999  # not yet
        assert await spec.get(hooks, ref, "g", "k") == 3
        clock.now = 1_010.0  # ten seconds after the write that last put it: gone for every reader
        assert await spec.get(hooks, ref, "g", "k", -1) == -1
        assert await spec.items(hooks, ref, "g") == []
        assert await spec.items(hooks, ref, "g", prefix="k") == []
        assert k in await _all(hooks, ref, "g")  # nothing noticed it yet: the record is there
    await _handled(world, "keyed-ttl", spec, [5])  # its handler reads the default: a new total
    async with world.session() as hooks:
        assert await spec.get(hooks, ref, "g", "k") == 5
        clock.now = 1_030.0  # gone again; a message that only reads it deletes it with its ack
    await _handled(world, "keyed-ttl", spec, [-1])
    async with world.session() as hooks:
        assert k not in await _all(hooks, ref, "g")
    clock.now = 1_031.0
    await _handled(world, "keyed-ttl", spec, [7])
    async with world.session() as hooks:
        # a declaration without a ttl reads a stamped value as its stamp says (gone at 1,041)
        assert await KeyedState(str, int, clock=lambda: 1_040.9).get(hooks, ref, "g", "k") == 7
        assert await KeyedState(str, int, clock=lambda: 1_041.0).get(hooks, ref, "g", "k") is None


@check
async def test_the_commits_of_a_group_sweep_the_keys_nobody_touches_once_past_their_ttl(
    world: World,
) -> None:
    clock = _Clock(1_000.0)
    spec = KeyedState(str, int, ttl=timedelta(hours=1), clock=clock)
    ref = _ref("keyed-sweep")
    untouched = [1_000 + i for i in range(SWEEP_KEYS + 44)]
    await _handled(world, "keyed-sweep", spec, untouched)
    async with world.session() as hooks:
        assert len(await _all(hooks, ref, "g")) == len(untouched)
    clock.now = 1_000.0 + 3_600  # all of them gone; messages that touch only key k sweep them
    for _ in range(2):  # a page of SWEEP_KEYS keys each SWEEP_EVERY messages, from the first key on
        await _handled(world, "keyed-sweep", spec, [1] * SWEEP_EVERY)
    async with world.session() as hooks:
        assert set(await _all(hooks, ref, "g")) == {spec.key_codec.encode("k")}
        assert await spec.get(hooks, ref, "g", "k") == 2 * SWEEP_EVERY
