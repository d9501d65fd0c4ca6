"""A running total per customer, in keyed state, on a partitioned stream, resumable after kill -9.

    python examples/customer_totals.py PATH [ORDERS] [CUSTOMERS] [PARTITIONS]

Orders go to customer ``i * 7919 % CUSTOMERS``, on a stream of PARTITIONS
partitions (4 by default) by customer; a handler per partition adds each
order to its customer's total, confirmed with the order's ack. Kill it
whenever you like and run it again: it resumes from what the ledger
confirmed, and prints every customer's total as JSON, the same as an
uninterrupted run's.
"""

from __future__ import annotations

import json
import sys

import anyio
import msgspec

from ledger import open_ledger
from streams import Key, KeyedState, MessageTx, Stream, handle_messages, open_scope


class Order(msgspec.Struct, frozen=True):
    customer: str
    amount: int


ORDERS = Key("orders", Stream[Order])
#: A total per customer; the customers of each batch of orders are read from the ledger at once.
TOTALS = KeyedState(str, int, prefetch=lambda order: order.customer)


def order(i: int, customers: int) -> Order:
    return Order(f"customer-{i * 7919 % customers}", i % 100 + 1)


def customer_of(order: Order) -> str:
    return order.customer


async def run(path: str, n: int, customers: int, partitions: int) -> dict[str, int]:
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_partitioned(
            ORDERS,
            node="checkout",
            partitions=partitions,
            partition_key=customer_of,
            groups=("totals",),
            resumable=True,
        )
        writer = orders.writer()

        async def source() -> None:
            if writer.done:
                return
            for i in range((writer.position or 0) + 1, n + 1):
                await writer.send(order(i, customers), send_at=i)
            await writer.finish()

        async def add(tx: MessageTx[None], order: Order) -> None:
            totals = TOTALS.of(tx)
            totals.put(order.customer, await totals.get(order.customer, 0) + order.amount)

        async with anyio.create_task_group() as tg:
            tg.start_soon(source)
            await handle_messages(orders.reader("totals"), add, keyed=TOTALS)  # every partition at once
        totals: dict[str, int] = {}
        for partition in orders.partitions:  # a customer's total lives in its partition
            totals.update(await TOTALS.items(ledger.streams, partition.ref, "totals", limit=customers + 1))
        return totals


if __name__ == "__main__":
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    customers = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000
    partitions = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    print(json.dumps(anyio.run(run, path, n, customers, partitions), sort_keys=True))
