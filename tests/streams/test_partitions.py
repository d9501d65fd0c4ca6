"""Partitioned streams on MemoryStore: routing by key, order per key, a resumed source, handlers.

What every store must keep (a partition's count, refused when another is
asked; totals across restarts) is in the conformance suite
(``streams/_conformance/partitions.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from hashlib import blake2b
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from streams import (
    HandlerContractError,
    Key,
    KeyedState,
    ManagedStream,
    MemoryStore,
    MessageExhaustedError,
    MessageTx,
    PartitionedResult,
    PartitionedStream,
    PartitionError,
    PayloadTypeError,
    Stream,
    StreamRef,
    handle_messages,
    open_scope,
)
from streams._unwrap import leaves

pytestmark = pytest.mark.anyio


class Order(msgspec.Struct, frozen=True):
    customer: str
    amount: int


ORDERS = Key("orders", Stream[Order])
TOTALS = KeyedState(str, int)


def _digest(key: str) -> int:
    return int.from_bytes(blake2b(msgspec.msgpack.encode(key), digest_size=8).digest(), "big")


#: Customers enough that each of three or four partitions gets some (c0 to c9 leave one empty).
CUSTOMERS = 20


def _order(i: int) -> Order:
    return Order(f"c{i % CUSTOMERS}", i)


def _by_customer(order: Order) -> str:
    return order.customer


@pytest.fixture
async def scopes() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def _orders(
    scopes: AsyncExitStack, store: Any, *, partitions: int = 3, scope: str = "p", **options: Any
) -> PartitionedStream[Order]:
    opened = await scopes.enter_async_context(open_scope(store, scope=scope))
    return await opened.open_partitioned(
        ORDERS,
        node="checkout",
        partitions=partitions,
        partition_key=_by_customer,
        groups=("totals",),
        resumable=True,
        **options,
    )


async def test_a_message_goes_to_its_keys_partition_and_keeps_its_order_there(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    orders = await _orders(scopes, store)
    writer = orders.writer()
    for i in range(1, 101):
        await writer.send(_order(i), send_at=i)
    await writer.finish()
    assert [p.ref for p in orders.partitions] == [StreamRef("p", "checkout", f"orders#{p}") for p in range(3)]
    seen: dict[int, list[Order]] = {}
    for index, part in enumerate(orders.partitions):
        seen[index] = [
            msgspec.msgpack.decode(payload, type=Order)
            for _, payload in sorted(store.stored_messages(part.ref).items())
        ]
    for index, kept in seen.items():
        # every message of a customer is in the partition its key's digest names, in the order sent
        assert all(_digest(o.customer) % 3 == index for o in kept)
        for customer in {o.customer for o in kept}:
            mine = [o.amount for o in kept if o.customer == customer]
            assert mine == sorted(mine) == [i for i in range(1, 101) if _order(i).customer == customer]
    assert sum(len(kept) for kept in seen.values()) == 100
    assert [s.appended for s in orders.snapshot()] == [len(seen[p]) for p in range(3)]
    assert orders.finished and orders.done and not orders.failed


async def test_a_resumed_source_appends_each_message_once_across_partitions(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    orders = await _orders(scopes, store, scope="resume")
    writer = orders.writer()
    assert writer.position is None
    for i in range(1, 41):
        await writer.send(_order(i), send_at=i)
    await writer.flush()
    await scopes.aclose()  # the process ends: nothing more is sent
    async with AsyncExitStack() as again:
        orders = await _orders(again, store, scope="resume")
        writer = orders.writer()
        position = writer.position
        assert position is not None and position <= 40
        for i in range(1, 61):  # from the very start: what was confirmed is skipped
            await writer.send(_order(i), send_at=i)
        await writer.finish()
        appended = sum(s.appended for s in orders.snapshot())
        assert appended == 60
        assert all(p.position == max(i for i in range(1, 61) if orders.partition_of(_order(i)) == n)
                   for n, p in enumerate(orders.partitions))  # fmt: skip


async def test_handlers_run_per_partition_with_keyed_state_split_by_partition(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    orders = await _orders(scopes, store, partitions=4, scope="totals")
    writer = orders.writer()
    for i in range(1, 201):
        writer.send_nowait(_order(i), send_at=i)
    await writer.finish()

    async def add(tx: MessageTx[int], order: Order) -> None:
        totals = TOTALS.of(tx)
        totals.put(order.customer, await totals.get(order.customer, 0) + order.amount)
        tx.set_state(tx.state + 1)

    result = await handle_messages(orders.reader("totals"), add, initial_state=0, keyed=TOTALS)
    assert isinstance(result, PartitionedResult)
    assert result.handled == 200 and not result.stopped
    assert [r.state for r in result.partitions] == [s.appended for s in orders.snapshot()]
    totals: dict[str, int] = {}
    for part in orders.partitions:
        for customer, total in await TOTALS.items(store, part.ref, "totals"):
            assert customer not in totals  # a key's state lives in its partition alone
            totals[customer] = total
    assert totals == {f"c{c}": sum(i for i in range(1, 201) if i % CUSTOMERS == c) for c in range(CUSTOMERS)}


async def _thirty(scopes: AsyncExitStack, scope: str) -> PartitionedStream[Order]:
    """Orders 1..30 sent and finished on a new store."""
    orders = await _orders(scopes, MemoryStore(), scope=scope)
    writer = orders.writer()
    for i in range(1, 31):
        await writer.send(_order(i), send_at=i)
    await writer.finish()
    return orders


async def test_a_failure_in_one_partition_stops_them_all_with_that_error(scopes: AsyncExitStack) -> None:
    orders = await _thirty(scopes, "failing")

    async def fail_on_seven(tx: MessageTx[None], order: Order) -> None:
        if order.amount == 7:
            raise ValueError("a business failure")

    with pytest.raises(MessageExhaustedError):
        await handle_messages(orders.reader("totals"), fail_on_seven)


async def test_partitions_failing_at_once_raise_the_first_failure_not_a_group(scopes: AsyncExitStack) -> None:
    orders = await _thirty(scopes, "failing-at-once")
    failed: list[int] = []

    async def fail_everywhere(tx: MessageTx[None], order: Order) -> None:
        failed.append(order.amount)
        raise ValueError("a business failure")

    with pytest.raises(MessageExhaustedError):  # one error: every partition's handler failed at once
        await handle_messages(orders.reader("totals"), fail_everywhere)
    assert len(failed) == len(orders.partitions)  # each partition's first message, then they all stopped


async def test_partitions_are_refused_when_they_do_not_fit(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    opened = await scopes.enter_async_context(open_scope(store, scope="refusals"))
    for bad in (0, -1, 4097, True, "3"):
        with pytest.raises(PartitionError, match="1 to 4096 partitions"):
            await opened.open_partitioned(ORDERS, node="n", partitions=bad, partition_key=_by_customer)  # type: ignore[arg-type]
    with pytest.raises(PartitionError, match="partition_key"):
        await opened.open_partitioned(ORDERS, node="n", partitions=2, partition_key=None)
    orders = await opened.open_partitioned(
        ORDERS, node="n", partitions=2, partition_key=_by_customer, resumable=True
    )
    assert await opened.open_partitioned(ORDERS, node="n", partitions=2, partition_key=_by_customer) is orders
    with pytest.raises(PartitionError, match=r"already open .* in 2 partitions"):
        await opened.open_partitioned(ORDERS, node="n", partitions=3, partition_key=_by_customer)
    plain: ManagedStream[Order] = await opened.open_stream(ORDERS, node="plain", resumable=True)
    with pytest.raises(PartitionError, match="already open as a stream of its own"):
        await opened.open_partitioned(ORDERS, node="plain", partitions=2, partition_key=_by_customer)
    assert plain.snapshot().appended == 0
    with pytest.raises(PayloadTypeError, match="partition key"):
        orders.partition_of(Order(object(), 1))  # type: ignore[arg-type]
    with pytest.raises(HandlerContractError, match="dead-letter stream"):
        await handle_messages(orders.reader("default"), _noop, dead_letter=object())  # type: ignore[call-overload]


async def _noop(tx: MessageTx[None], order: Order) -> None:
    return None


async def _sent(scopes: AsyncExitStack, store: Any, scope: str, n: int = 200) -> PartitionedStream[Order]:
    """Four partitions holding orders 1 to ``n``, finished."""
    orders = await _orders(scopes, store, partitions=4, scope=scope)
    writer = orders.writer()
    if not writer.done:
        for i in range(1, n + 1):
            writer.send_nowait(_order(i), send_at=i)
        await writer.finish()
    return orders


async def test_two_members_make_at_most_two_handler_calls_at_once(scopes: AsyncExitStack) -> None:
    orders = await _sent(scopes, MemoryStore(), "members")
    running = most = 0
    seen: dict[int, list[int]] = {}

    async def slow(tx: MessageTx[None], order: Order) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(3):  # other partitions' loops run meanwhile
            await anyio.lowlevel.checkpoint()
        running -= 1
        seen.setdefault(orders.partition_of(order), []).append(order.amount)

    result = await handle_messages(orders.reader("totals"), slow, concurrency=2)
    assert result.handled == 200 and 1 <= most <= 2
    assert sorted(a for amounts in seen.values() for a in amounts) == list(range(1, 201))
    assert all(amounts == sorted(amounts) for amounts in seen.values())  # each partition in order
    assert len(result.partitions) == 4


async def test_a_member_per_partition_by_default_runs_them_all_at_once(scopes: AsyncExitStack) -> None:
    orders = await _sent(scopes, MemoryStore(), "default")
    running = 0
    three = anyio.Event()

    async def waits_for_three(tx: MessageTx[None], order: Order) -> None:
        nonlocal running
        running += 1
        if running >= 3:
            three.set()
        with anyio.fail_after(5):  # only if the partitions did not run at once
            await three.wait()
        running -= 1

    result = await handle_messages(orders.reader("totals"), waits_for_three)
    assert result.handled == 200 and three.is_set()


async def test_a_members_partitions_never_run_their_handlers_at_the_same_time(scopes: AsyncExitStack) -> None:
    orders = await _sent(scopes, MemoryStore(), "owned")
    running = [0, 0]  # by member: partitions 0 and 2 are member 0's, 1 and 3 member 1's
    overlaps: list[int] = []

    async def slow(tx: MessageTx[None], order: Order) -> None:
        member = orders.partition_of(order) % 2
        running[member] += 1
        if running[member] > 1:
            overlaps.append(member)
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        running[member] -= 1

    result = await handle_messages(orders.reader("totals"), slow, concurrency=2)
    assert result.handled == 200 and overlaps == []


async def test_a_concurrency_that_is_no_count_of_members_is_refused_before_anything_runs(
    scopes: AsyncExitStack,
) -> None:
    orders = await _sent(scopes, MemoryStore(), "refused")
    calls: list[Order] = []

    async def record(tx: MessageTx[None], order: Order) -> None:
        calls.append(order)

    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="concurrency"):
            await handle_messages(orders.reader("totals"), record, concurrency=bad)  # type: ignore[arg-type]
    plain = orders.partitions[0].reader("totals")
    with pytest.raises(ValueError, match="partitioned stream's reader"):
        await handle_messages(plain, record, concurrency=2)

    def not_async(tx: MessageTx[None], order: Order) -> None:
        calls.append(order)

    # the members' wrapper is async: the handler under it is still checked (each member may meet it)
    with pytest.raises(BaseException) as caught:
        await handle_messages(orders.reader("totals"), not_async, concurrency=2)  # type: ignore[arg-type]
    errors = leaves(caught.value) if isinstance(caught.value, BaseExceptionGroup) else [caught.value]
    assert all(isinstance(e, HandlerContractError) and "not an awaitable" in str(e) for e in errors)
    assert all(g.acked_through == 0 for s in orders.snapshot() for g in s.groups)
    calls.clear()  # the sync handler ran once per partition before it was refused
    alone = await handle_messages(plain, record, concurrency=1)  # 1 is the single handler of today
    result = await handle_messages(orders.reader("totals"), record, concurrency=2)
    assert alone.handled + result.handled == 200 == len(calls)


async def test_members_resume_where_their_partitions_confirmed(scopes: AsyncExitStack) -> None:
    store = MemoryStore()
    orders = await _sent(scopes, store, "resumed")
    handled: list[int] = []

    async def record(tx: MessageTx[None], order: Order) -> None:
        handled.append(order.amount)

    first = await handle_messages(orders.reader("totals"), record, concurrency=2, limit=10)
    assert first.handled == 40 == len(handled)
    await scopes.aclose()  # the process ends
    async with AsyncExitStack() as again:
        orders = await _sent(again, store, "resumed")
        second = await handle_messages(orders.reader("totals"), record, concurrency=2)
        assert first.handled + second.handled == 200
        assert sorted(handled) == list(range(1, 201))  # each once
        assert [g.acked_through for s in orders.snapshot() for g in s.groups if g.group == "totals"] == [
            s.appended for s in orders.snapshot()
        ]
