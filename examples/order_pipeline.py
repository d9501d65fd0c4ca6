"""Orders → billing → invoices → audit, on a durable ledger, resumable after kill -9.

    python examples/order_pipeline.py PATH [N]

Run it, kill it whenever you like, run it again: it resumes from what the
ledger confirmed and ends with the same numbers as an uninterrupted run.
"""

from __future__ import annotations

import sys

import anyio
import msgspec

from ledger import open_ledger
from streams import Key, MessageTx, Stream, StreamWriter, handle_messages, open_scope


class Order(msgspec.Struct, frozen=True):
    id: int
    amount: int


class Invoice(msgspec.Struct, frozen=True):
    order: int
    amount: int


class Billing(msgspec.Struct, frozen=True):
    total: int = 0
    count: int = 0


ORDERS = Key("orders", Stream[Order])
INVOICES = Key("invoices", Stream[Invoice])


async def run(path: str, n: int) -> tuple[Billing, int]:
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_stream(ORDERS, node="checkout", groups=("billing",), resumable=True)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), resumable=True)
        order_writer = orders.writer()
        invoice_writer: StreamWriter[Invoice] = invoices.writer()

        async def source() -> None:
            if order_writer.done:
                return
            for i in range((order_writer.position or 0) + 1, n + 1):
                await order_writer.send(Order(i, i), send_at=i)
            await order_writer.finish()

        async def bill(tx: MessageTx[Billing], order: Order) -> None:
            tx.set_state(Billing(tx.state.total + order.amount, tx.state.count + 1))
            tx.send(invoice_writer, Invoice(order.id, order.amount))

        async def count(tx: MessageTx[int], invoice: Invoice) -> None:
            tx.set_state(tx.state + 1)

        billing = audit = None

        async def billing_node() -> None:
            nonlocal billing
            billing = await handle_messages(orders.reader("billing"), bill, initial_state=Billing())
            await invoice_writer.finish()

        async def audit_node() -> None:
            nonlocal audit
            audit = await handle_messages(invoices.reader("audit"), count, initial_state=0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(source)
            tg.start_soon(billing_node)
            tg.start_soon(audit_node)
        assert billing is not None and audit is not None
        return billing.state, audit.state


if __name__ == "__main__":
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    totals, audited = anyio.run(run, path, n)
    print(f"billed {totals.count} orders for {totals.total}; audited {audited} invoices")
