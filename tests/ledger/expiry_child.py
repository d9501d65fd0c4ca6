"""Baskets that expire, in keyed state, resumable after kill -9: the expiry crash test's program.

    python tests/ledger/expiry_child.py PATH|URL ORDERS CUSTOMERS [asyncio|trio]

Order ``i`` (customer ``i * 7919 % CUSTOMERS``, amount ``i % 10 + 1``)
happens at :func:`time_of` ``(i)``: a second apart, with a quiet spell of
:data:`GAP` seconds every :data:`SPELL` orders, longer than the baskets'
ttl. The handler goes by each order's own time (its keyed state's clock is
set from the message), so expiry is a function of the orders alone and a
test can predict it. Once every order is handled it prints the baskets live
at the last order's time, as JSON.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Final

import anyio
import msgspec

from ledger import connect
from streams import Key, KeyedState, MessageTx, Stream, handle_messages, open_scope

#: The first order's time: past the machine's clock, so no reader by that clock thinks a basket gone.
T0: Final = 2_000_000_000.0
TTL: Final = 400
SPELL: Final = 2_000
GAP: Final = 500


class Order(msgspec.Struct, frozen=True):
    customer: str
    amount: int
    at: float


class OrderClock:
    """The keyed state's clock: the time of the order being handled."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


ORDERS = Key("orders", Stream[Order])
CLOCK = OrderClock()
BASKETS = KeyedState(str, int, ttl=timedelta(seconds=TTL), clock=CLOCK)


def time_of(i: int) -> float:
    return T0 + i + (i // SPELL) * GAP


def order(i: int, customers: int) -> Order:
    return Order(f"c{i * 7919 % customers}", i % 10 + 1, time_of(i))


async def run(path: str, n: int, customers: int) -> dict[str, int]:
    async with connect(path) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_stream(ORDERS, node="checkout", groups=("baskets",), resumable=True)
        writer = orders.writer()

        async def write() -> None:  # beside the handler: the stream holds a window of unacknowledged orders
            if not writer.done:
                for i in range((writer.position or 0) + 1, n + 1):
                    await writer.send(order(i, customers), send_at=i)
                await writer.finish()

        async def add(tx: MessageTx[None], placed: Order) -> None:
            CLOCK.now = placed.at  # one handler at a time: the clock is this order's until it returns
            baskets = BASKETS.of(tx)
            baskets.put(placed.customer, await baskets.get(placed.customer, 0) + placed.amount)

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            await handle_messages(orders.reader("baskets"), add, keyed=BASKETS)
        CLOCK.now = time_of(n)
        return dict(await BASKETS.items(ledger.streams, orders.ref, "baskets", limit=customers + 1))


def main() -> None:
    path, n, customers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    backend = sys.argv[4] if len(sys.argv) > 4 else "asyncio"
    print(json.dumps(anyio.run(run, path, n, customers, backend=backend), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
