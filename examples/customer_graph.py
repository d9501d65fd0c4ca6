"""Per-customer totals in a durable graph: a node writes a partitioned stream, members of another handle it.

    python examples/customer_graph.py PATH [ORDERS] [CUSTOMERS] [PARTITIONS] [MEMBERS]

Node ``checkout`` sends order ``i`` (customer ``i * 7919 % CUSTOMERS``) on
a stream of PARTITIONS partitions by customer; node ``totals`` keeps a
total per customer in keyed state, with MEMBERS members sharing the
partitions (``ctx.handle_partitions(..., concurrency=MEMBERS)``), and sets
the run's grand total from the partitions' states. Kill it whenever you
like and run it again: run ``shop`` resumes from what the ledger confirmed
and prints every customer's total as JSON, the same as an uninterrupted
run's.
"""

from __future__ import annotations

import json
import sys
from functools import partial

import anyio
import msgspec

from ledger import open_ledger
from streams import Graph, Key, KeyedState, MessageTx, NodeContext, Stream, StreamRef


class Order(msgspec.Struct, frozen=True):
    customer: str
    amount: int


def customer_of(order: Order) -> str:
    return order.customer


N = Key("n", int)
CUSTOMERS = Key("customers", int)
GRAND_TOTAL = Key("grand_total", int)
#: A total per customer; the customers of each batch of orders are read from the ledger at once.
TOTALS = KeyedState(str, int, prefetch=customer_of)


def shop(partitions: int, members: int) -> Graph:
    orders = Key("orders", Stream[Order], partitions=partitions, partition_key=customer_of)
    graph = Graph("customer-totals", version="1", inputs=[N, CUSTOMERS])

    # resumable: after a kill it continues from its position, and what it sends again is skipped
    @graph.node(requires=[N, CUSTOMERS], provides=[orders], resumable=True)
    async def checkout(ctx: NodeContext) -> None:
        writer = ctx.partitioned_writer(orders)
        for i in range((writer.position or 0) + 1, ctx[N] + 1):
            await writer.send(Order(f"customer-{i * 7919 % ctx[CUSTOMERS]}", i % 100 + 1), send_at=i)

    @graph.node(requires=[orders], provides=[GRAND_TOTAL])
    async def totals(ctx: NodeContext) -> None:
        async def add(tx: MessageTx[int], order: Order) -> None:
            totals = TOTALS.of(tx)
            totals.put(order.customer, await totals.get(order.customer, 0) + order.amount)
            tx.set_state(tx.state + order.amount)

        handled = await ctx.handle_partitions(orders, add, concurrency=members, initial_state=0, keyed=TOTALS)
        ctx.set(GRAND_TOTAL, sum(part.state for part in handled.partitions))

    return graph


async def run(path: str, n: int, customers: int, partitions: int, members: int) -> dict[str, int]:
    graph = shop(partitions, members)
    async with open_ledger(path) as ledger:
        known = {record.run_id for record in await ledger.runs()}
        if "shop" in known:
            result = await ledger.resume("shop", graph)
        else:
            result = await ledger.run(graph, {N: n, CUSTOMERS: customers}, run_id="shop")
        totals: dict[str, int] = {}
        source = StreamRef("shop", "checkout", "orders")  # run shop's stream: partition p is orders#p
        for p in range(partitions):  # a customer's total lives in its partition
            totals.update(
                await TOTALS.items(ledger.streams, source.partition(p), "totals", limit=customers + 1)
            )
    assert sum(totals.values()) == result.result[GRAND_TOTAL]
    return totals


if __name__ == "__main__":
    given = [int(a) for a in sys.argv[2:]]
    n, customers, partitions, members = (*given, *(20_000, 1_000, 4, 2)[len(given) :])
    print(json.dumps(anyio.run(partial(run, sys.argv[1], n, customers, partitions, members)), sort_keys=True))
