"""One orders stream fanned across Sub aliases, run by id on the ledger; kill it, run it again.

    python examples/orders_fanout.py LEDGER RUN_ID COUNT

Node ``orders`` writes orders 1..COUNT to a stream, continuing from its
confirmed position after a crash (``resumable=True``). Three Subs read the
same stream, each an alias of one endpoint with groups of its own: billing
sums the amounts in explicit state, audit counts the orders, and shipping
forwards the stream to a nested Sub (packing) that counts the heavy ones.
Every message's effects are confirmed in one ledger transaction; every
node's outputs with its record. Killed anywhere and run again, it prints the
totals an uninterrupted run prints. ``ORDER_DELAY=0.01`` makes each order
take that long to produce (so random kills land inside the run).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from ledger import open_ledger
from streams import Graph, Key, MessageTx, NodeContext, Stream

COUNT = Key("count", int)
ORDERS = Key("orders", Stream[int])
BILLED = Key("billed", int)
AUDITED = Key("audited", int)
HEAVY = Key("heavy", int)
TOTAL = Key("total", int)


def amount(order: int) -> int:
    return order * 3 % 17 + 1


def build() -> Graph:
    delay = float(os.environ.get("ORDER_DELAY", "0"))

    billing = Graph("billing", version="1", inputs=[ORDERS])

    @billing.node(requires=[ORDERS], provides=[TOTAL])
    async def bill(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + amount(order))
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, one, initial_state=0)

    audit = Graph("audit", version="1", inputs=[ORDERS])

    @audit.node(requires=[ORDERS], provides=[TOTAL])
    async def count(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + 1)
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, one, initial_state=0)

    packing = Graph("packing", version="1", inputs=[ORDERS])

    @packing.node(requires=[ORDERS], provides=[TOTAL])
    async def pack(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + (amount(order) > 10))
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, one, initial_state=0)

    shipping = Graph("shipping", version="1", inputs=[ORDERS])
    shipping.sub("packing", packing, inlets={ORDERS: ORDERS}, outlets={TOTAL: TOTAL})  # forwarded deeper

    shop = Graph("shop", version="1", inputs=[COUNT])

    @shop.node(requires=[COUNT], provides=[ORDERS], resumable=True)
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        for order in range((writer.position or 0) + 1, ctx[COUNT] + 1):
            await anyio.sleep(delay)
            await writer.send(order, send_at=order)

    shop.sub("billing", billing, inlets={ORDERS: ORDERS}, outlets={TOTAL: BILLED})
    shop.sub("audit", audit, inlets={ORDERS: ORDERS}, outlets={TOTAL: AUDITED})
    shop.sub("shipping", shipping, inlets={ORDERS: ORDERS}, outlets={TOTAL: HEAVY})
    return shop


async def main(path: Path, run_id: str, count: int) -> str:
    graph = build()
    async with open_ledger(path) as ledger:
        if run_id in {run.run_id for run in await ledger.runs()}:
            outcome = await ledger.resume(run_id, graph)
        else:
            outcome = await ledger.run(graph, {COUNT: count}, run_id=run_id)
    result = outcome.result
    how = "already finished" if outcome.already_finished else "resumed" if outcome.resumed else "ran"
    return f"billed={result[BILLED]} audited={result[AUDITED]} heavy={result[HEAVY]} ({how})"


if __name__ == "__main__":
    ledger_path, run, orders_count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    print(anyio.run(main, ledger_path, run, orders_count))
