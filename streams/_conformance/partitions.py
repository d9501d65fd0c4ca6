"""Partitioned streams on every store: a partition keeps its count, and each is a stream of its own."""

from __future__ import annotations

from typing import Final

from .. import KeyedState, MessageTx, PartitionError, StreamRef, handle_messages, open_scope
from .._type_names import type_name
from ..store import StreamOpen
from ._support import World, check, raises
from .records import ORDERS, Order

INT: Final = type_name(int)
TOTALS: Final = KeyedState(int, int)


#: Customers enough that each of three partitions gets some of the first 150 orders (18 at least).
CUSTOMERS: Final = 23


def _customer(order: Order) -> int:
    return order.id % CUSTOMERS


@check
async def test_a_partition_keeps_the_number_of_partitions_it_was_created_with(world: World) -> None:
    part = StreamRef("partitions", "src", "numbers#0")
    plain = StreamRef("partitions", "src", "plain")
    async with world.session() as hooks:
        opened = await hooks.open(StreamOpen(part, INT, 64, ("g",), True, partitions=4))
        assert opened.created
        await hooks.open(StreamOpen(plain, INT, 64, ("g",), True))
    async with world.session() as hooks:
        with raises(PartitionError, match="is one of 4 partitions, but was opened as one of 8"):
            await hooks.open(StreamOpen(part, INT, 64, ("g",), True, partitions=8))
        with raises(PartitionError, match="is one of 4 partitions, but was opened as a stream of its own"):
            await hooks.open(StreamOpen(part, INT, 64, ("g",), True))
        with raises(PartitionError, match="is a stream of its own, but was opened as one of 2"):
            await hooks.open(StreamOpen(plain, INT, 64, ("g",), True, partitions=2))
        desc = await hooks.describe(part)
        assert desc is not None and (desc.partitions, desc.generation) == (4, 1)  # nothing changed
        again = await hooks.open(StreamOpen(part, INT, 64, ("g",), True, partitions=4))
        assert again.generation == 2


async def _add(tx: MessageTx[None], order: Order) -> None:
    totals = TOTALS.of(tx)
    customer = _customer(order)
    totals.put(customer, await totals.get(customer, 0) + order.amount)


@check
async def test_partitioned_keyed_totals_hold_across_restarts(world: World) -> None:
    n = 300
    for session in range(2):
        async with world.session() as hooks, open_scope(hooks, scope="partitioned") as scope:
            orders = await scope.open_partitioned(
                ORDERS, node="checkout", partitions=3, partition_key=_customer, groups=("t",), resumable=True
            )
            writer = orders.writer()
            for i in range(1, (n // 2 if session == 0 else n) + 1):  # the second session resends from 1
                await writer.send(Order(i, i), send_at=i)
            if session == 1:
                await writer.finish()
            await handle_messages(orders.reader("t"), _add, keyed=TOTALS, limit=None if session else 10)
    async with world.session() as hooks, open_scope(hooks, scope="partitioned") as scope:
        orders = await scope.open_partitioned(
            ORDERS, node="checkout", partitions=3, partition_key=_customer, groups=("t",)
        )
        assert sum(s.appended for s in orders.snapshot()) == n  # each order appended once
        totals: dict[int, int] = {}
        for part in orders.partitions:
            for customer, total in await TOTALS.items(hooks, part.ref, "t"):
                assert customer not in totals
                totals[customer] = total
        expected: dict[int, int] = {}
        for i in range(1, n + 1):
            expected[i % CUSTOMERS] = expected.get(i % CUSTOMERS, 0) + i
        assert totals == expected
