"""Per-key totals shared by members: a stream of M partitions, each partition's handler a member.

The orders of :mod:`bench._keyed` go to a stream opened with
``open_partitioned(..., partitions=M, partition_key=customer)``: each
customer's orders land in one partition, in order. One ``handle_messages``
over the partitioned reader runs M handlers at once in this process, each
keeping its customers' totals in keyed state. Each partition's first
message seeds its customers at 0, untimed; the timed part handles the rest,
every order once. A member still handling when ``seconds`` have passed
stops after that message (*cut short*). The rate counts the orders every
member handled, over the time until the last one returned.

Verified: each partition's keyed totals, read back from the closed ledger,
equal the totals of the orders it handled, and its frontier is at its last.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import anyio

from ledger import open_ledger
from streams import KeyedState, MessageTx, PartitionedResult, handle_messages, open_scope

from ._keyed import CUSTOMER_ORDERS, CustomerOrder, KeyedRun, Totals, customer_order
from ._shape import BenchError

__all__ = ["run_members"]


def _keyed_state() -> KeyedState[str, int]:
    return KeyedState(str, int, prefetch=lambda order: order.customer)


def _customer(order: CustomerOrder) -> str:
    return order.customer


async def _run(path: Path, n: int, keys: int, members: int, seconds: float, window: int) -> KeyedRun:
    spec = _keyed_state()
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="keyed") as scope:
        stream = await scope.open_partitioned(
            CUSTOMER_ORDERS,
            node="source",
            partitions=members,
            partition_key=_customer,
            groups=("totals",),
            capacity=n + 1,
            resumable=True,
        )
        if any(s.appended for s in stream.snapshot()):
            raise BenchError("the keyed bench's ledger is not fresh")
        writer = stream.writer()
        orders: list[list[CustomerOrder]] = [[] for _ in range(members)]
        for i in range(1, n + 1):
            order = customer_order(i, keys)
            orders[stream.partition_of(order)].append(order)
            try:
                writer.send_nowait(order, send_at=i)
            except anyio.WouldBlock:
                await writer.send(order, send_at=i)
        await writer.finish()
        seeds: list[Totals] = [{} for _ in range(members)]
        for k in range(keys):
            customer = f"c{k}"
            seeds[stream.partition_of(CustomerOrder(customer, 0))][customer] = 0

        for p, part in enumerate(stream.reader("totals").partitions):  # each partition's first order seeds it
            seed = seeds[p]

            async def seeded(tx: MessageTx[None], order: CustomerOrder, seed: Totals = seed) -> None:
                totals = spec.of(tx)
                for customer, total in seed.items():
                    totals.put(customer, total)
                totals.put(order.customer, order.amount)

            if orders[p]:
                await handle_messages(part, seeded, keyed=spec, window=window, limit=1)

        deadline = [float("inf")]
        clock = time.perf_counter

        async def add(tx: MessageTx[None], order: CustomerOrder) -> None:
            totals = spec.of(tx)
            totals.put(order.customer, await totals.get(order.customer, 0) + order.amount)
            if clock() > deadline[0]:
                tx.stop()

        cpu = time.thread_time()
        started = clock()
        deadline[0] = started + seconds
        result = await handle_messages(stream.reader("totals"), add, keyed=spec, window=window)
        elapsed = clock() - started
        loop_cpu = time.thread_time() - cpu
        assert isinstance(result, PartitionedResult)
        refs = [part.ref for part in stream.partitions]

    handled = [r.handled for r in result.partitions]
    cut_short = any(r.stopped for r in result.partitions)
    if not cut_short and sum(handled) != n - sum(1 for p in orders if p):
        raise BenchError(f"the members handled {handled} of the timed orders without stopping")
    async with open_ledger(path) as ledger:
        for p, ref in enumerate(refs):
            expected = dict(seeds[p])
            for order in orders[p][: 1 + handled[p]] if orders[p] else ():
                expected[order.customer] += order.amount
            found = dict(await spec.items(ledger.streams, ref, "totals", limit=len(expected) + 1))
            if found != expected:
                raise BenchError(f"partition {p} of the ledger at {path} committed keyed totals that differ")
    return KeyedRun(keys, members, "keyed", sum(handled), elapsed, cut_short, loop_cpu, 0)


def run_members(
    n: int,
    *,
    keys: int,
    members: int,
    seconds: float = 10.0,
    window: int = 1024,
    backend: str = "asyncio",
    workdir: Path | None = None,
) -> KeyedRun:
    """One members configuration on a fresh durable LMDB ledger in a temporary directory, verified."""
    if n < 2 or keys < 1 or members < 1:
        raise ValueError("the members bench needs at least 2 orders, 1 key and 1 member")
    with tempfile.TemporaryDirectory(prefix="streamledger-members-", dir=workdir) as tmp:
        return anyio.run(_run, Path(tmp) / "ledger", n, keys, members, seconds, window, backend=backend)
