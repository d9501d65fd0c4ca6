"""A total per customer kept by group members in many processes, on a PostgreSQL ledger.

    python examples/customer_members.py produce URL [ORDERS] [CUSTOMERS]
    python examples/customer_members.py member URL [NAME] [LEASE_SECONDS]
    python examples/customer_members.py totals URL

``produce`` appends the orders to a stream of 4 partitions by customer
(resumable: run it again after a kill and it goes on from what the ledger
confirmed) and finishes it. Each ``member`` joins the group ``totals``:
the members share the partitions, each handling its own and adding each
order to its customer's total, confirmed with the order's ack. Start as
many as you like, on any machines, before, during or after ``produce``;
kill or pause any of them: the others take its partitions over once its
lease runs out, and a paused one can confirm nothing once they did.
A member returns when every order is handled, printing how many it
handled. ``totals`` prints every customer's total as JSON.
"""

from __future__ import annotations

import json
import sys

import anyio
import msgspec

from ledger.postgres import consume, open_postgres
from streams import Key, KeyedState, MessageTx, Stream, StreamRef, open_scope


class Order(msgspec.Struct, frozen=True):
    customer: str
    amount: int


ORDERS = Key("orders", Stream[Order])
PARTITIONS = 4
#: A total per customer; the customers of each batch of orders are read from the ledger at once.
TOTALS = KeyedState(str, int, prefetch=lambda order: order.customer)


def order(i: int, customers: int) -> Order:
    return Order(f"customer-{i * 7919 % customers}", i % 100 + 1)


def customer_of(order: Order) -> str:
    return order.customer


async def produce(url: str, n: int, customers: int) -> None:
    async with open_postgres(url) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_partitioned(
            ORDERS,
            node="checkout",
            partitions=PARTITIONS,
            partition_key=customer_of,
            groups=("totals",),
            resumable=True,
        )
        writer = orders.writer()
        if not writer.done:
            for i in range((writer.position or 0) + 1, n + 1):
                await writer.send(order(i, customers), send_at=i)
            await writer.finish()


async def add(tx: MessageTx[None], order: Order) -> None:
    totals = TOTALS.of(tx)
    totals.put(order.customer, await totals.get(order.customer, 0) + order.amount)


async def member(url: str, name: str | None, lease_seconds: float) -> int:
    return await consume(
        url,
        ORDERS,
        add,
        scope="shop",
        node="checkout",
        partitions=PARTITIONS,
        group="totals",
        keyed=TOTALS,
        owner=name,
        lease_seconds=lease_seconds,
    )


async def totals(url: str) -> dict[str, int]:
    found: dict[str, int] = {}
    async with open_postgres(url) as ledger:
        for p in range(PARTITIONS):  # a customer's total lives in its partition
            ref = StreamRef("shop", "checkout", f"orders#{p}")
            found.update(await TOTALS.items(ledger.streams, ref, "totals", limit=1_000_000))
    return found


if __name__ == "__main__":
    command, url = sys.argv[1], sys.argv[2]
    if command == "produce":
        n = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000
        customers = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000
        anyio.run(produce, url, n, customers)
    elif command == "member":
        name = sys.argv[3] if len(sys.argv) > 3 else None
        lease = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
        print(f"handled {anyio.run(member, url, name, lease)}", flush=True)
    elif command == "totals":
        print(json.dumps(anyio.run(totals, url), sort_keys=True))
    else:
        raise SystemExit(f"no command {command!r}: produce, member or totals")
