"""The pipeline on the PostgreSQL ledger beside two hand-written psycopg loops doing the same writes.

* ``raw_psycopg``: the physical limit with psycopg. Per batch of ``batch``
  orders, one transaction writes what the ledger writes for them: the
  orders as runs of 256 (one row each), the billing frontier with its
  state, the invoices as runs, and the audit frontier with its count, all
  msgpack in ``bytea`` rows of the ledger's own tables, pipelined. One
  thread, no event loop, no hooks, no checks.
* ``psycopg_per_message``: what a user would write: one transaction per
  order, with one row per message and the two frontiers updated.
* ``skip_locked``: the queue a careful user would build instead of a
  ledger: orders enqueued in a queue table, a billing consumer that claims
  a batch with ``FOR UPDATE SKIP LOCKED``, bills it (its running totals
  kept in a row), enqueues the invoices in a second queue table and
  deletes the rows it claimed, all in one transaction, and an audit
  consumer doing the same on the invoices; the producer and the two
  consumers each on a thread and a connection of their own, at once.

Every run gets a database of its own on the same server, with
``synchronous_commit`` on (the server's default).
"""

from __future__ import annotations

import itertools
import threading
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
    "run_skip_locked",
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


_QUEUE_TABLES = """
CREATE TABLE order_queue (id bigserial PRIMARY KEY, payload bytea NOT NULL);
CREATE TABLE invoice_queue (id bigserial PRIMARY KEY, payload bytea NOT NULL);
CREATE TABLE running_totals (name text PRIMARY KEY, total bigint NOT NULL, count bigint NOT NULL);
INSERT INTO running_totals VALUES ('billing', 0, 0), ('audit', 0, 0);
"""
_ENQUEUE = "INSERT INTO {table} (payload) SELECT * FROM unnest(%b::bytea[])"
_CLAIM = (
    "DELETE FROM {table} WHERE id IN"
    " (SELECT id FROM {table} ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING payload"
)
_ADD = "UPDATE running_totals SET total = total + %s, count = count + %s WHERE name = %s"
#: How long an idle consumer waits before it claims again (a queue's usual poll).
_POLL_SECONDS = 0.0005


def run_skip_locked(url: str, n: int, *, batch: int = WINDOW) -> PgRun:
    """``n`` orders through a hand-written ``SKIP LOCKED`` batch queue: enqueue, bill, audit."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_QUEUE_TABLES)
    produced = threading.Event()
    billed = threading.Event()
    errors: list[BaseException] = []
    decode_order = msgspec.msgpack.Decoder(Order).decode
    decode_invoice = msgspec.msgpack.Decoder(Invoice).decode

    def produce(conn: Any) -> None:
        for first in range(1, n + 1, batch):
            orders = [_encode(Order(i, i)) for i in range(first, min(first + batch, n + 1))]
            with conn.transaction():
                conn.execute(_ENQUEUE.format(table="order_queue"), (orders,))

    def bill(conn: Any) -> bool:
        with conn.transaction():
            rows = conn.execute(_CLAIM.format(table="order_queue"), (batch,)).fetchall()
            if not rows:
                return False
            orders = [decode_order(raw) for (raw,) in rows]
            conn.execute(_ADD, (sum(o.amount for o in orders), len(orders), "billing"))
            invoices = [_encode(Invoice(o.id, o.amount)) for o in orders]
            conn.execute(_ENQUEUE.format(table="invoice_queue"), (invoices,))
        return True

    def audit(conn: Any) -> bool:
        with conn.transaction():
            rows = conn.execute(_CLAIM.format(table="invoice_queue"), (batch,)).fetchall()
            if not rows:
                return False
            invoices = [decode_invoice(raw) for (raw,) in rows]
            conn.execute(_ADD, (sum(i.amount for i in invoices), len(invoices), "audit"))
        return True

    def consume(step: Any, upstream: threading.Event, done: threading.Event | None) -> Any:
        def loop(conn: Any) -> None:
            while True:
                finished = upstream.is_set()  # read before the claim: an empty claim after it is the end
                if step(conn):
                    continue
                if finished:
                    break
                time.sleep(_POLL_SECONDS)
            if done is not None:
                done.set()

        return loop

    def worker(body: Any, done: threading.Event | None) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                body(conn)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if done is not None:
                done.set()  # a failed upstream ends its consumers too

    connected = [
        threading.Thread(target=worker, args=(produce, produced)),
        threading.Thread(target=worker, args=(consume(bill, produced, billed), billed)),
        threading.Thread(target=worker, args=(consume(audit, billed, None), None)),
    ]
    started = time.perf_counter()
    for thread in connected:
        thread.start()
    for thread in connected:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise BenchError(f"the SKIP LOCKED queue failed: {errors[0]!r}") from errors[0]
    with psycopg.connect(url, autocommit=True) as conn:
        totals = dict(
            (name, (total, count))
            for name, total, count in conn.execute("SELECT name, total, count FROM running_totals")
        )
        left = conn.execute(
            "SELECT (SELECT count(*) FROM order_queue) + (SELECT count(*) FROM invoice_queue)"
        ).fetchone()
    want = (expected_total(n), n)
    if totals != {"billing": want, "audit": want} or left != (0,):
        raise BenchError(f"the SKIP LOCKED queue ended with {totals!r}, {left} rows left in its queues")
    return PgRun("skip_locked", n, seconds)


def run_demo_workers(url: str, n: int, workers: int) -> PgRun:
    """The demo's ``n`` orders in shards run by ``workers`` worker processes, timed from the start."""
    from ledger.postgres._demo import run_demo_postgres

    started = time.perf_counter()
    summary = anyio.run(lambda: run_demo_postgres(url, n, workers=workers))
    seconds = time.perf_counter() - started
    if (summary.billing_total, summary.invoices, summary.audit_count) != (expected_total(n), n, n):
        raise BenchError(f"the demo on {workers} workers ended with {summary!r}")
    return PgRun(f"demo_workers_{workers}", n, seconds)
