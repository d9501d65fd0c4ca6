"""Keyed state in handle_messages: typed keys in order, writes with the ack, reads the store seldom.

The record-level rules (attempt ownership, group removal and moves,
listing) are conformance checks run on every store
(``streams/_conformance/keyed.py``); the state machines in
``tests/ledger/stateful.py`` hold keyed totals against a model across
crashes. Here: the engine's side, on MemoryStore.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams import (
    HandlerContractError,
    Key,
    KeyedState,
    KeyedStateError,
    ManagedStream,
    MemoryStore,
    MessageExhaustedError,
    MessageTx,
    PayloadTypeError,
    Stream,
    StreamStateError,
    UnknownStreamError,
    handle_messages,
    open_scope,
)
from streams._store._hooks import STREAM_HOOKS
from streams.store import MAX_KEY_BYTES, KeyedRange, key_to_plain
from streams.testing import PassThroughHooks

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])
TOTALS = KeyedState(str, int)


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


@pytest.fixture
async def scopes() -> AsyncIterator[AsyncExitStack]:
    """Where the tests' scopes stay open until the test ends."""
    async with AsyncExitStack() as stack:
        yield stack


async def _numbers(
    scopes: AsyncExitStack, store: Any, values: list[int], *, scope: str = "k"
) -> ManagedStream[int]:
    """``values`` appended to a stream of one group, ``g``, in scope ``scope`` (open until the test ends)."""
    opened = await scopes.enter_async_context(open_scope(store, scope=scope))
    stream: ManagedStream[int] = await opened.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
    writer = stream.writer()
    for value in values:
        await writer.send(value)
    await writer.flush()
    return stream


class _SevenCalls:
    """A store of the seven stream calls only, and no keyed state."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in STREAM_HOOKS:
            return getattr(self._inner, name)
        raise AttributeError(name)


async def _stored(
    store: MemoryStore, stream: ManagedStream[Any], spec: KeyedState[Any, Any]
) -> dict[Any, Any]:
    entries = await store.list_keyed(KeyedRange(stream.ref, "g", limit=10_000))
    return {key_to_plain(e.key): spec.value_codec.decode(e.value) for e in entries}


async def _add(tx: MessageTx[None], value: int) -> None:
    key = f"c{value % 7}"
    tx.store.put(key, await tx.store.get(key, 0) + value)


async def test_per_key_totals_are_confirmed_with_each_ack_and_the_store_is_read_once_per_key(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, list(range(1000)))
    spec = KeyedState(str, int)
    result = await handle_messages(stream.reader("g"), _add, keyed=spec, limit=1000)
    assert result.handled == 1000
    expected = {f"c{j}": sum(v for v in range(1000) if v % 7 == j) for j in range(7)}
    assert await _stored(store, stream, spec) == expected


async def test_reads_go_to_the_store_only_for_keys_never_seen(
    scopes: AsyncExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    calls: list[int] = []
    read = store.read_keyed

    async def counted(request: Any) -> Any:
        calls.append(len(request.keys))
        return await read(request)

    monkeypatch.setattr(store, "read_keyed", counted)
    stream = await _numbers(scopes, store, list(range(1000)))
    await handle_messages(stream.reader("g"), _add, keyed=KeyedState(str, int), limit=1000)
    assert calls == [1] * 7  # one read per key, the first time it is asked for
    calls.clear()
    prefetched = KeyedState(str, int, prefetch=lambda v: f"c{v % 7}")
    await stream.writer().send(7)
    await stream.writer().flush()
    # a new call knows nothing: one read of every key its first messages need, at once
    more = await _numbers(scopes, store, list(range(200)), scope="k2")
    await handle_messages(more.reader("g"), _add, keyed=prefetched, limit=200)
    assert calls == [7]


async def test_a_bounded_cache_reads_again_what_it_let_go_and_stays_exact(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, list(range(500)))
    spec = KeyedState(str, int, cache=2)
    await handle_messages(stream.reader("g"), _add, keyed=spec, limit=500)
    expected = {f"c{j}": sum(v for v in range(500) if v % 7 == j) for j in range(7)}
    assert await _stored(store, stream, spec) == expected
    uncached = await _numbers(scopes, store, list(range(500)), scope="k2")
    await handle_messages(uncached.reader("g"), _add, keyed=KeyedState(str, int, cache=0), limit=500)
    assert await _stored(store, uncached, spec) == expected


async def test_a_failed_attempt_leaves_no_key_behind_and_its_retry_reads_the_confirmed_value(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2, 3])
    seen: list[tuple[int, int, int | None]] = []

    async def flaky(tx: MessageTx[None], value: int) -> None:
        before = await tx.store.get("total")
        seen.append((value, tx.attempt, before))
        tx.store.put("total", (before or 0) + value)
        tx.store.put(f"attempt-{value}-{tx.attempt}", tx.attempt)
        if value == 2 and tx.attempt == 0:
            raise ValueError("a business failure")

    spec = KeyedState(str, int)
    await handle_messages(stream.reader("g"), flaky, keyed=spec, attempts=2, limit=3)
    assert seen == [(1, 0, None), (2, 0, 1), (2, 1, 1), (3, 0, 3)]
    assert await _stored(store, stream, spec) == {
        "total": 6,
        "attempt-1-0": 0,
        "attempt-2-1": 1,
        "attempt-3-0": 0,
    }


async def test_an_exhausted_message_confirms_none_of_its_attempts_keys(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2])

    async def failing(tx: MessageTx[None], value: int) -> None:
        tx.store.put(f"k{value}", value)
        if value == 2:
            raise ValueError("always")

    spec = KeyedState(str, int)
    with pytest.raises(MessageExhaustedError):
        await handle_messages(stream.reader("g"), failing, keyed=spec, attempts=2)
    assert await _stored(store, stream, spec) == {"k1": 1}


async def test_each_message_sees_the_writes_of_the_messages_before_it_while_they_are_unconfirmed(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, list(range(1, 101)))
    seen: list[int] = []

    async def running(tx: MessageTx[None], value: int) -> None:
        total = await tx.store.get("t", 0)
        seen.append(total)
        tx.store.put("t", total + value)
        if value % 10 == 0:
            tx.store.delete("t")
            assert await tx.store.get("t") is None  # its own delete, before its ack

    await handle_messages(stream.reader("g"), running, keyed=KeyedState(str, int), limit=100, window=1000)
    totals, t = [], 0
    for value in range(1, 101):
        totals.append(t)
        t = 0 if value % 10 == 0 else t + value
    assert seen == totals


async def test_another_parent_attempt_starts_from_no_keys_and_takes_the_keyed_state_over(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2, 3, 4])
    spec = KeyedState(str, int)
    await handle_messages(stream.reader("g"), _add, keyed=spec, limit=2, parent_attempt="a")
    assert await _stored(store, stream, spec) == {"c1": 1, "c2": 2}
    seen: list[int | None] = []

    async def peek(tx: MessageTx[None], value: int) -> None:
        seen.append(await tx.store.get("c1"))
        tx.store.put("b", value)

    await handle_messages(stream.reader("g"), peek, keyed=spec, limit=2, parent_attempt="b")
    assert seen == [None, None]
    assert await _stored(store, stream, spec) == {"b": 4}


async def test_typed_keys_and_values_are_checked_before_anything_is_staged(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2])
    attempts: list[int] = []

    async def wrong_key(tx: MessageTx[None], value: int) -> None:
        attempts.append(tx.attempt)
        tx.store.put(3, value)

    spec = KeyedState(str, int)
    with pytest.raises(PayloadTypeError, match="takes str keys, got a int"):
        await handle_messages(stream.reader("g"), wrong_key, keyed=spec, attempts=3)

    async def wrong_value(tx: MessageTx[None], value: int) -> None:
        tx.store.put("k", "not an int")

    with pytest.raises(PayloadTypeError, match="takes int"):
        await handle_messages(stream.reader("g"), wrong_value, keyed=spec, attempts=3)

    async def too_long(tx: MessageTx[None], value: int) -> None:
        tx.store.put("k" * MAX_KEY_BYTES, value)

    with pytest.raises(KeyedStateError, match=f"at most {MAX_KEY_BYTES} bytes"):
        await handle_messages(stream.reader("g"), too_long, keyed=spec, attempts=3)
    assert attempts == [0]  # refusals are no handler failures: no attempt was spent
    frontier = store.frontier(stream.ref, "g")
    assert frontier is not None and (frontier.acked_through, frontier.failing) == (0, ())
    assert await _stored(store, stream, spec) == {}


async def test_tx_store_needs_keyed_state_and_a_store_that_keeps_it(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1])
    with pytest.raises(HandlerContractError, match="given no keyed state"):
        await handle_messages(stream.reader("g"), _add, attempts=3)
    frontier = store.frontier(stream.ref, "g")
    assert frontier is not None and frontier.failing == ()
    with pytest.raises(TypeError, match="keyed takes a KeyedState"):
        await handle_messages(stream.reader("g"), _add, keyed=(str, int))  # type: ignore[call-overload]
    bare = await _numbers(scopes, _SevenCalls(MemoryStore()), [1], scope="bare")
    with pytest.raises(HandlerContractError, match="keeps none"):
        await handle_messages(bare.reader("g"), _add, keyed=KeyedState(str, int))


async def test_the_typed_view_is_the_declared_ones_and_a_tx_is_used_only_inside_its_call(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2])
    kept: list[MessageTx[None]] = []

    async def typed(tx: MessageTx[None], value: int) -> None:
        totals = TOTALS.of(tx)
        totals.put("sum", (await totals.get("sum", 0)) + value)
        kept.append(tx)

    await handle_messages(stream.reader("g"), typed, keyed=TOTALS, limit=1)
    with pytest.raises(StreamStateError, match="after its handler call returned"):
        kept[0].store.put("late", 1)
    with pytest.raises(StreamStateError, match="after its handler call returned"):
        await kept[0].store.get("sum")

    async def other(tx: MessageTx[None], value: int) -> None:
        KeyedState(str, int).of(tx)

    with pytest.raises(HandlerContractError, match="is not the keyed state"):
        await handle_messages(stream.reader("g"), other, keyed=TOTALS, attempts=2)
    assert await _stored(store, stream, TOTALS) == {"sum": 1}


async def test_keys_of_every_type_round_trip_and_structs_and_tuples_are_keys_too(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2, 3])
    spec = KeyedState(Point, list[int])

    async def by_point(tx: MessageTx[None], value: int) -> None:
        point = Point(value % 2, -value)
        tx.store.put(point, [*(await tx.store.get(point, [])), value])

    await handle_messages(stream.reader("g"), by_point, keyed=spec, limit=3)
    entries = await store.list_keyed(KeyedRange(stream.ref, "g"))
    assert {spec.key_codec.decode(e.key): spec.value_codec.decode(e.value) for e in entries} == {
        Point(1, -1): [1],
        Point(0, -2): [2],
        Point(1, -3): [3],
    }
    with pytest.raises(ValueError, match="not a keyed-state key"):
        key_to_plain(b"?")
    with pytest.raises(KeyedStateError, match="64 bits"):
        KeyedState(int, int).key_codec.encode(1 << 63)
    assert KeyedState(bytes, int).key_codec.decode(KeyedState(bytes, int).key_codec.encode(b"\x00\xff")) == (
        b"\x00\xff"
    )


@given(st.lists(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), min_size=2))
def test_int_keys_sort_by_their_bytes_as_by_their_values(keys: list[int]) -> None:
    codec = KeyedState(int, int).key_codec
    assert sorted(keys, key=codec.encode) == sorted(keys)
    assert [codec.decode(codec.encode(k)) for k in keys] == keys


@given(st.lists(st.text(), min_size=2))
def test_str_keys_sort_by_their_bytes_as_by_their_code_points(keys: list[str]) -> None:
    codec = KeyedState(str, int).key_codec
    keys = [k for k in keys if len(k.encode()) < MAX_KEY_BYTES]
    assert sorted(keys, key=codec.encode) == sorted(keys)
    assert [key_to_plain(codec.encode(k)) for k in keys] == keys


async def test_items_lists_the_confirmed_keys_in_key_order_by_range(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [-5, 3, 0, 70, -2])
    spec = KeyedState(int, int)

    async def keep(tx: MessageTx[None], value: int) -> None:
        spec.of(tx).put(value, value * 10)

    await handle_messages(stream.reader("g"), keep, keyed=spec, limit=5)
    assert await spec.items(store, stream.ref, "g") == [(-5, -50), (-2, -20), (0, 0), (3, 30), (70, 700)]
    assert await spec.items(store, stream.ref, "g", start=-2, stop=70) == [(-2, -20), (0, 0), (3, 30)]
    assert await spec.items(store, stream.ref, "g", start=0, limit=1) == [(0, 0)]
    with pytest.raises(TypeError, match="keeps no keyed state"):
        await spec.items(_SevenCalls(store), stream.ref, "g")
    with pytest.raises(TypeError, match="keeps no keyed state"):
        await spec.items(PassThroughHooks(_SevenCalls(store)), stream.ref, "g")


async def test_get_reads_one_confirmed_key_and_never_a_write_staged_but_unconfirmed(
    scopes: AsyncExitStack,
) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2])
    spec = KeyedState(str, int)
    seen: list[int | None] = []

    async def keep(tx: MessageTx[None], value: int) -> None:
        spec.of(tx).put("k", value)
        seen.append(await spec.get(store, stream.ref, "g", "k"))  # this message's put is only staged

    await handle_messages(stream.reader("g"), keep, keyed=spec, limit=1)
    assert seen == [None] and await spec.get(store, stream.ref, "g", "k") == 1
    await handle_messages(stream.reader("g"), keep, keyed=spec, limit=1)
    assert seen == [None, 1] and await spec.get(store, stream.ref, "g", "k") == 2
    assert await spec.get(store, stream.ref, "g", "k\x00") is None  # the key, not the keys after it
    assert await spec.get(store, stream.ref, "g", "absent", -1) == -1
    with pytest.raises(UnknownStreamError, match="no consumer group 'nobody'"):
        await spec.get(store, stream.ref, "nobody", "k")
    with pytest.raises(PayloadTypeError, match="takes str keys"):
        await spec.get(store, stream.ref, "g", 1)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="keeps no keyed state"):
        await spec.get(_SevenCalls(store), stream.ref, "g", "k")


async def test_items_by_prefix_lists_the_str_or_bytes_keys_that_start_with_it(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    names = ["a", "ab", "abc", "ac", "b", "a\uffff", "\U0010ffff", "\U0010ffffz", "é"]
    stream = await _numbers(scopes, store, list(range(len(names))))
    spec = KeyedState(str, int)

    async def keep(tx: MessageTx[None], value: int) -> None:
        spec.of(tx).put(names[value], value)

    await handle_messages(stream.reader("g"), keep, keyed=spec, limit=len(names))
    for prefix in ("a", "ab", "abc", "abd", "", "\U0010ffff", "é"):
        listed = [k for k, _ in await spec.items(store, stream.ref, "g", prefix=prefix)]
        assert listed == sorted(n for n in names if n.startswith(prefix)), prefix
    with pytest.raises(ValueError, match="a prefix or a range"):
        await spec.items(store, stream.ref, "g", prefix="a", start="a")
    with pytest.raises(PayloadTypeError, match="a prefix of bytes"):
        await spec.items(store, stream.ref, "g", prefix=b"a")
    with pytest.raises(TypeError, match="ranges str or bytes keys, not int keys"):
        await KeyedState(int, int).items(store, stream.ref, "g", prefix="1")


@given(st.binary(max_size=4), st.binary(max_size=6))
def test_a_prefix_range_holds_exactly_the_keys_that_start_with_the_prefix(prefix: bytes, rest: bytes) -> None:
    start, stop = KeyedState(bytes, int).key_codec.prefix(prefix)
    for key in (b"b" + rest, b"b" + prefix + rest, b"b" + prefix[:-1] + rest):
        inside = start <= key and (stop is None or key < stop)
        assert inside == key.startswith(start), (prefix, key)


async def test_a_message_may_stage_more_keys_than_the_cache_holds(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    stream = await _numbers(scopes, store, [1, 2])
    spec = KeyedState(int, int, cache=4)
    seen: list[list[int | None]] = []

    async def many(tx: MessageTx[None], value: int) -> None:
        store_ = spec.of(tx)
        if value == 1:
            for k in range(5000):  # staged, unconfirmed: kept whatever the cache's bound
                store_.put(k, k)
        seen.append([await store_.get(k) for k in (0, 2500, 4999)])

    await handle_messages(stream.reader("g"), many, keyed=spec, limit=2, window=10)
    assert seen == [[0, 2500, 4999], [0, 2500, 4999]]
    assert len(await spec.items(store, stream.ref, "g", limit=10_000)) == 5000
