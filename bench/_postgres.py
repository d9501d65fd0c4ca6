"""The pipeline on the PostgreSQL ledger beside two hand-written psycopg loops doing the same writes.

* ``raw_psycopg``: the physical limit with psycopg. Per batch of ``batch``
  orders, one transaction writes what the ledger writes for them: the
  orders as runs of 256 (one row each), the billing frontier with its
  state, the invoices as runs, and the audit frontier with its count, all
  msgpack in ``bytea`` rows of the ledger's own tables, pipelined. One
  thread, no event loop, no hooks, no checks.
* ``psycopg_per_message``: what a user would write: one transaction per
  order, with one row per message and the two frontiers updated.

Every run gets a database of its own on the same server, with
``synchronous_commit`` on (the server's default).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
import psycopg

from ledger._format import CHUNK
from ledger.postgres import open_postgres
from streams import GroupFrontier

from ._shape import BenchError, Invoice, Order, Totals, expected_total
from ._streams import WINDOW, run_pipeline

__all__ = [
    "PgRun",
    "new_database",
    "run_demo_workers",
    "run_psycopg_per_message",
    "run_raw_psycopg",
    "run_streamledger_postgres",
]

_encode = msgspec.msgpack.encode
_databases = itertools.count()


@dataclass(frozen=True)
class PgRun:
    name: str
    messages: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds


def new_database(server_url: str, make_url: Any) -> str:
    """A new, empty database on the server; its URL (``make_url(name)``)."""
    name = f"bench_{time.time_ns()}_{next(_databases)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return str(make_url(name))


def run_streamledger_postgres(url: str, n: int, *, window: int = WINDOW, backend: str = "asyncio") -> PgRun:
    async def main() -> float:
        async with open_postgres(url) as ledger:
            return await run_pipeline(ledger.streams, n, window=window)

    return PgRun("streamledger", n, anyio.run(main, backend=backend))


_TABLES = """
CREATE TABLE messages (stream_id bigint, first_seq bigint, last_seq bigint, payloads bytea,
                       PRIMARY KEY (stream_id, first_seq));
CREATE TABLE groups (stream_id bigint, name text, frontier bytea, PRIMARY KEY (stream_id, name));
"""
_PUT_RUN = "INSERT INTO messages (stream_id, first_seq, last_seq, payloads) VALUES (%s, %s, %s, %s)"
_PUT_GROUP = (
    "INSERT INTO groups (stream_id, name, frontier) VALUES (%s, %s, %s)"
    " ON CONFLICT (stream_id, name) DO UPDATE SET frontier = EXCLUDED.frontier"
)
_ORDERS, _INVOICES = 1, 2


def run_raw_psycopg(url: str, n: int, *, batch: int = WINDOW) -> PgRun:
    """The ledger's writes for ``n`` orders, ``batch`` orders per transaction, by hand."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_TABLES)
        totals = Totals()
        started = time.perf_counter()
        for first in range(1, n + 1, batch):
            last = min(first + batch - 1, n)
            orders = [Order(i, i) for i in range(first, last + 1)]
            for order in orders:
                totals = Totals(totals.total + order.amount, totals.count + 1)
            invoices = [Invoice(o.id, o.amount) for o in orders]
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(_PUT_RUN, _runs(_ORDERS, first, [_encode(o) for o in orders]))
                cur.executemany(_PUT_RUN, _runs(_INVOICES, first, [_encode(i) for i in invoices]))
                billing = GroupFrontier("billing", acked_through=last, state=_encode(totals))
                audit = GroupFrontier("audit", acked_through=last, state=_encode(totals.count))
                cur.executemany(
                    _PUT_GROUP, [(_ORDERS, "billing", _encode(billing)), (_INVOICES, "audit", _encode(audit))]
                )
        seconds = time.perf_counter() - started
    if totals != Totals(expected_total(n), n):
        raise BenchError(f"the raw psycopg loop ended with {totals!r}")
    return PgRun("raw_psycopg", n, seconds)


def _runs(stream_id: int, first: int, payloads: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    return [
        (stream_id, first + start, first + start + len(run) - 1, _encode(run))
        for start in range(0, len(payloads), CHUNK)
        if (run := payloads[start : start + CHUNK])
    ]


_PER_MESSAGE_TABLES = """
CREATE TABLE orders (seq bigint PRIMARY KEY, payload bytea);
CREATE TABLE invoices (seq bigint PRIMARY KEY, payload bytea);
CREATE TABLE frontiers (name text PRIMARY KEY, acked_through bigint, state bytea);
"""


def run_psycopg_per_message(url: str, n: int) -> PgRun:
    """One transaction per step of each order: append it; bill it (ack, state, invoice); audit it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_PER_MESSAGE_TABLES)
        conn.execute("INSERT INTO frontiers VALUES ('billing', 0, %s), ('audit', 0, %s)", (b"", b""))
        totals, count = Totals(), 0
        started = time.perf_counter()
        for i in range(1, n + 1):
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (%s, %s)", (i, _encode(Order(i, i))))
            with conn.transaction():
                row = conn.execute("SELECT payload FROM orders WHERE seq = %s", (i,)).fetchone()
                assert row is not None
                (raw,) = row
                order = msgspec.msgpack.decode(raw, type=Order)
                totals = Totals(totals.total + order.amount, totals.count + 1)
                conn.execute(
                    "UPDATE frontiers SET acked_through = %s, state = %s WHERE name = 'billing'",
                    (i, _encode(totals)),
                )
                conn.execute(
                    "INSERT INTO invoices VALUES (%s, %s)", (i, _encode(Invoice(order.id, order.amount)))
                )
            with conn.transaction():
                conn.execute("SELECT payload FROM invoices WHERE seq = %s", (i,)).fetchone()
                count += 1
                conn.execute(
                    "UPDATE frontiers SET acked_through = %s, state = %s WHERE name = 'audit'",
                    (i, _encode(count)),
                )
        seconds = time.perf_counter() - started
    if totals != Totals(expected_total(n), n) or count != n:
        raise BenchError(f"the per-message psycopg loop ended with {totals!r}, {count}")
    return PgRun("psycopg_per_message", n, seconds)


def run_demo_workers(url: str, n: int, workers: int) -> PgRun:
    """The demo's ``n`` orders in shards run by ``workers`` worker processes, timed from the start."""
    from ledger.postgres._demo import run_demo_postgres

    started = time.perf_counter()
    summary = anyio.run(lambda: run_demo_postgres(url, n, workers=workers))
    seconds = time.perf_counter() - started
    if (summary.billing_total, summary.invoices, summary.audit_count) != (expected_total(n), n, n):
        raise BenchError(f"the demo on {workers} workers ended with {summary!r}")
    return PgRun(f"demo_workers_{workers}", n, seconds)
