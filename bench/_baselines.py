"""Hand-written baselines writing the pipeline's records: raw py-lmdb and stdlib sqlite3.

Raw py-lmdb is the physical limit of the store: per order it puts the order
message, the billing frontier with its state, the invoice message and the
audit frontier with its count, each a crc-sealed msgpack value like the
ledger's, under sequential big-endian keys, in batches of the handler window
with one write transaction (and one fsync when durable) per batch. It runs on
one thread with no event loop, no hook protocol and no checks.

sqlite3 is what a user would write instead: WAL mode, ``synchronous=FULL``,
one transaction per step of each message (append the order; read it, ack it,
update the billing state and insert the invoice; read the invoice, ack it and
update the audit count).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lmdb
import msgspec

from ledger.lmdb._env import write_mode
from ledger.lmdb._seal import seal, unseal
from streams import GroupFrontier

from ._shape import BenchError, Invoice, Order, Totals, expected_total

__all__ = ["BaselineRun", "probe_fsync", "run_raw_lmdb", "run_sqlite"]

_u64 = struct.Struct(">Q")
_encode = msgspec.msgpack.encode
_totals = msgspec.msgpack.Decoder(Totals)
_frontier = msgspec.msgpack.Decoder(GroupFrontier)


@dataclass(frozen=True)
class BaselineRun:
    name: str
    sync: bool
    messages: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds


def probe_fsync(*, count: int = 50, workdir: Path | None = None) -> float:
    """Write-and-fsync rate of 100 bytes on the bench's disk, to judge the durable figures by."""
    with tempfile.TemporaryDirectory(prefix="fsync-probe-", dir=workdir) as tmp:
        fd = os.open(Path(tmp) / "probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            started = time.perf_counter()
            for _ in range(count):
                os.write(fd, b"x" * 100)
                os.fsync(fd)
            return count / (time.perf_counter() - started)
        finally:
            os.close(fd)


def run_raw_lmdb(n: int, *, sync: bool, batch: int = 256, workdir: Path | None = None) -> BaselineRun:
    """The pipeline's records written by a plain py-lmdb loop, ``batch`` orders per transaction."""
    with tempfile.TemporaryDirectory(prefix="raw-lmdb-bench-", dir=workdir) as tmp:
        env = lmdb.open(tmp, map_size=1 << 32, max_dbs=4, **write_mode(sync))
        try:
            messages = env.open_db(b"messages")
            groups = env.open_db(b"groups")
            orders_id, invoices_id = _u64.pack(1), _u64.pack(2)
            billing_key, audit_key = orders_id + b"billing", invoices_id + b"audit"
            pack = _u64.pack
            total = count = audited = 0
            started = time.perf_counter()
            for first in range(1, n + 1, batch):
                with env.begin(write=True) as txn:
                    for i in range(first, min(first + batch, n + 1)):
                        key = orders_id + pack(i)
                        txn.put(key, seal("messages", key, _encode(Order(i, i))), db=messages)
                        total += i
                        count += 1
                        billing = GroupFrontier(
                            "billing", acked_through=i, state=_encode(Totals(total, count))
                        )
                        txn.put(billing_key, seal("groups", billing_key, _encode(billing)), db=groups)
                        key = invoices_id + pack(i)
                        txn.put(key, seal("messages", key, _encode(Invoice(i, i))), db=messages)
                        audited += 1
                        audit = GroupFrontier("audit", acked_through=i, state=_encode(audited))
                        txn.put(audit_key, seal("groups", audit_key, _encode(audit)), db=groups)
            seconds = time.perf_counter() - started
            with env.begin() as txn:
                stored = txn.stat(messages)["entries"]
                raw = txn.get(billing_key, db=groups)
                frontier = (
                    _frontier.decode(unseal(bytes(raw), db="groups", key=billing_key))
                    if raw is not None
                    else None
                )
        finally:
            env.close()
    state = _totals.decode(frontier.state) if frontier and frontier.state else None
    if stored != 2 * n or state != Totals(expected_total(n), n):
        raise BenchError(f"raw LMDB loop stored {stored} messages and state {state!r}")
    return BaselineRun("raw_lmdb", sync, n, seconds)


_SCHEMA = """
CREATE TABLE orders (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE invoices (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE groups (name TEXT PRIMARY KEY, acked_through INTEGER NOT NULL, state BLOB);
INSERT INTO groups VALUES ('billing', 0, NULL), ('audit', 0, NULL);
"""


def run_sqlite(n: int, *, sync: bool = True, workdir: Path | None = None) -> BaselineRun:
    """The pipeline as a per-message sqlite3 loop: WAL, ``synchronous=FULL`` (``OFF`` if not sync)."""
    order_decoder = msgspec.msgpack.Decoder(Order)
    invoice_decoder = msgspec.msgpack.Decoder(Invoice)
    with (
        tempfile.TemporaryDirectory(prefix="sqlite-bench-", dir=workdir) as tmp,
        contextlib.closing(sqlite3.connect(Path(tmp) / "bench.db", isolation_level=None)) as db,
    ):
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if sync else 'OFF'}")
        db.executescript(_SCHEMA)
        totals = Totals()
        started = time.perf_counter()
        for i in range(1, n + 1):
            # The source appends the order.
            db.execute("BEGIN")
            db.execute("INSERT INTO orders VALUES (?, ?)", (i, _encode(Order(i, i))))
            db.execute("COMMIT")
            # Billing: read it, ack it with the new state and the invoice, in one transaction.
            db.execute("BEGIN")
            (body,) = db.execute("SELECT body FROM orders WHERE seq = ?", (i,)).fetchone()
            order = order_decoder.decode(body)
            totals = Totals(totals.total + order.amount, totals.count + 1)
            db.execute(
                "UPDATE groups SET acked_through = ?, state = ? WHERE name = 'billing'",
                (i, _encode(totals)),
            )
            db.execute("INSERT INTO invoices VALUES (?, ?)", (i, _encode(Invoice(order.id, order.amount))))
            db.execute("COMMIT")
            # Audit: read the invoice, ack it with the new count.
            db.execute("BEGIN")
            (body,) = db.execute("SELECT body FROM invoices WHERE seq = ?", (i,)).fetchone()
            invoice_decoder.decode(body)
            db.execute(
                "UPDATE groups SET acked_through = ?, state = ? WHERE name = 'audit'",
                (i, _encode(i)),
            )
            db.execute("COMMIT")
        seconds = time.perf_counter() - started
        (state,) = db.execute("SELECT state FROM groups WHERE name = 'billing'").fetchone()
        (invoices,) = db.execute("SELECT count(*) FROM invoices").fetchone()
    if _totals.decode(state) != Totals(expected_total(n), n) or invoices != n:
        raise BenchError(f"sqlite loop ended with state {state!r} and {invoices} invoices")
    return BaselineRun("sqlite", sync, n, seconds)
