"""A program that feeds a running graph and reads its output, by run id on the ledger; kill it, run it again.

    python examples/host_desk.py LEDGER RUN_ID COUNT

The graph's input ``orders`` is a stream the host writes (a web handler
appending orders would do the same): orders 1..COUNT, each after the last
one the stream kept, since the host promised to continue from its position
(``resumable_inputs``). Node ``billing`` sums them and writes an invoice for
each to ``invoices``, an outlet of the graph. The host's consumer group
``mailer`` reads the invoices and keeps, in its explicit state confirmed
with each acknowledgement, how many it mailed and their sum. Killed
anywhere and run again, it prints what an uninterrupted run prints.
``ORDER_DELAY=0.005`` makes each order take that long to arrive.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import msgspec

from ledger import open_ledger
from streams import Execution, Graph, Key, MessageTx, NodeContext, Stream, handle_messages

ORDERS = Key("orders", Stream[int])
INVOICES = Key("invoices", Stream[int])
BILLED = Key("billed", int)


class Mailed(msgspec.Struct, frozen=True):
    count: int = 0
    total: int = 0


def amount(order: int) -> int:
    return order * 3 % 17 + 1


def build() -> Graph:
    desk = Graph("desk", version="1", inputs=[ORDERS], outlets=[INVOICES])

    @desk.node(requires=[ORDERS], provides=[INVOICES, BILLED], resumable=True)
    async def billing(ctx: NodeContext) -> None:
        invoices = ctx.writer(INVOICES)

        async def bill(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + amount(order))
            tx.set(BILLED, tx.state)
            tx.send(invoices, amount(order))

        await ctx.handle_messages(ORDERS, bill, initial_state=0)

    return desk


async def feed(execution: Execution, count: int) -> None:
    """The host's writer: the orders the stream does not hold yet, then the stream's end."""
    delay = float(os.environ.get("ORDER_DELAY", "0"))
    writer = await execution.host_writer(ORDERS)
    for order in range((writer.position or 0) + 1, count + 1):
        await anyio.sleep(delay)
        await writer.send(order, send_at=order)
    await writer.finish()


async def mail(execution: Execution, mailed: list[Mailed]) -> None:
    """The host's reader: each invoice "mailed" once, counted in state confirmed with its ack."""
    reader = await execution.host_reader(INVOICES, "mailer")

    async def one(tx: MessageTx[Mailed], invoice: int) -> None:
        tx.set_state(Mailed(tx.state.count + 1, tx.state.total + invoice))

    outcome = await handle_messages(reader, one, initial_state=Mailed())
    mailed.append(outcome.state)


async def main(path: Path, run_id: str, count: int) -> str:
    graph = build()
    mailed: list[Mailed] = []
    async with open_ledger(path) as ledger, anyio.create_task_group() as host:

        def start(execution: Execution) -> None:
            host.start_soon(feed, execution, count)
            host.start_soon(mail, execution, mailed)

        if run_id in {run.run_id for run in await ledger.runs()}:
            outcome = await ledger.resume(
                run_id, graph, on_start=start, host_readers={INVOICES: ["mailer"]}, resumable_inputs=[ORDERS]
            )
        else:
            outcome = await ledger.run(
                graph,
                {},
                run_id=run_id,
                on_start=start,
                host_readers={INVOICES: ["mailer"]},
                resumable_inputs=[ORDERS],
            )
    how = "already finished" if outcome.already_finished else "resumed" if outcome.resumed else "ran"
    [done] = mailed
    return f"billed={outcome.result[BILLED]} mailed={done.count} mailed_total={done.total} ({how})"


if __name__ == "__main__":
    ledger_path, run, orders_count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    print(anyio.run(main, ledger_path, run, orders_count))
