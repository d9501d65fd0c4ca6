"""Per-key totals on the PostgreSQL ledger, handled by 1, 2, 4 member processes sharing one group.

The orders of :mod:`bench._keyed` go to a stream of ``partitions``
partitions by customer, written and finished by the bench before the
members start (the stream holds them all: ``capacity`` is the N orders).
Then ``workers`` processes each run one member of the group ``totals``
(``ledger.postgres.consume``), keeping a total per customer in keyed
state: they share the partitions under leases, and each returns once
every partition is handled. The number of partitions stays the same for
every number of members, so every configuration does the same work.

Measured as :mod:`bench._keyed_postgres` measures the run workers: wall
time from the members' start to the last one's exit, their CPU (with the
start-up and exit of one member on a ledger whose stream is empty and
finished left out, per process), the database's commits and rollbacks in
``pg_stat_database`` across their run, and the server's CPU.

Verified: the union of the partitions' keyed totals equals the totals
recomputed from the N orders.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Final

import anyio

from ledger.postgres import consume, open_postgres
from streams import KeyedState, MessageTx, StreamRef, open_scope

from ._keyed import CUSTOMER_ORDERS, CustomerOrder, Totals, customer_order, expected_totals
from ._keyed_postgres import PgKeyedRun, measured, run_processes
from ._shape import BenchError

__all__ = ["member_startup_cpu", "run_keyed_members"]

SCOPE: Final = "keyed-members"
NODE: Final = "source"
GROUP: Final = "totals"
LEASE_SECONDS: Final = 10.0
POLL_SECONDS: Final = 0.05
TOTALS: Final = KeyedState(str, int, prefetch=lambda order: order.customer)


def _customer(order: CustomerOrder) -> str:
    return order.customer


async def _add(tx: MessageTx[None], order: CustomerOrder) -> None:
    totals = TOTALS.of(tx)
    totals.put(order.customer, await totals.get(order.customer, 0) + order.amount)


async def _prepare(url: str, n: int, keys: int, partitions: int) -> None:
    async with open_postgres(url) as ledger, open_scope(ledger.streams, scope=SCOPE) as scope:
        stream = await scope.open_partitioned(
            CUSTOMER_ORDERS,
            node=NODE,
            partitions=partitions,
            partition_key=_customer,
            groups=(GROUP,),
            capacity=n + 1,
            resumable=True,
        )
        if any(s.appended for s in stream.snapshot()):
            raise BenchError("the keyed members' database is not fresh")
        writer = stream.writer()
        for i in range(1, n + 1):
            await writer.send(customer_order(i, keys), send_at=i)
        await writer.finish()


async def _member(url: str, partitions: int) -> int:
    return await consume(
        url,
        CUSTOMER_ORDERS,
        _add,
        scope=SCOPE,
        node=NODE,
        partitions=partitions,
        group=GROUP,
        keyed=TOTALS,
        lease_seconds=LEASE_SECONDS,
        poll_seconds=POLL_SECONDS,
        report=lambda partition, event: None,
    )


def _command(url: str, partitions: int) -> list[str]:
    return [sys.executable, "-m", "bench._keyed_pg_members", url, str(partitions)]


async def _verify(url: str, n: int, keys: int, partitions: int) -> None:
    merged: Totals = {}
    async with open_postgres(url) as ledger:
        for p in range(partitions):
            ref = StreamRef(SCOPE, NODE, f"{CUSTOMER_ORDERS.name}#{p}")
            merged.update(await TOTALS.items(ledger.streams, ref, GROUP, limit=keys + 1))
    expected = {customer: total for customer, total in expected_totals(n, keys).items() if total}
    if merged != expected:
        raise BenchError(f"the members' totals differ from the {n} orders' ({keys} keys)")


def run_keyed_members(
    server_url: str, url: str, *, n: int, keys: int, partitions: int, workers: int, data: Path | None = None
) -> PgKeyedRun:
    """``n`` orders on ``partitions`` partitions of the new database ``url``, handled by ``workers``."""
    anyio.run(_prepare, url, n, keys, partitions)
    run = measured(server_url, url, _command(url, partitions), workers=workers, messages=n, data=data)
    anyio.run(_verify, url, n, keys, partitions)
    return run


def member_startup_cpu(url: str, *, partitions: int, repeat: int = 3) -> float:
    """CPU seconds of one member started on ``url``, whose stream is empty and finished: it exits."""
    anyio.run(_prepare, url, 0, 1, partitions)
    return statistics.median(run_processes(_command(url, partitions), 1)[1] for _ in range(repeat))


if __name__ == "__main__":
    anyio.run(_member, sys.argv[1], int(sys.argv[2]))
