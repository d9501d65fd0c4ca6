"""A lone write's round trip on the PostgreSQL ledger, beside a raw one-row commit on the same server.

``pg_raw_commit``: psycopg, autocommit, one ``INSERT`` of a 100-byte row
at a time (one statement and one WAL flush each: what one commit costs
on this server). ``pg_write``: ``await ledger.streams.append(...)`` of one
message to a stream the ledger's connection keeps, one after another (the
ledger's one statement a call, sent alone, and the hand-over to its
connection's thread and back).
"""

from __future__ import annotations

import time

import anyio
import psycopg

from ledger.postgres import open_postgres
from streams import StreamRef
from streams.store import AppendBatch, StreamOpen

__all__ = ["time_pg_ledger_writes", "time_pg_raw_commits"]

_VALUE = bytes(100)
_REF = StreamRef("bench", "source", "round-trip")
#: Writes made before the timed ones: the connection then keeps the stream, and the server's
#: statement plans are made.
_WARM = 20


def time_pg_raw_commits(url: str, count: int) -> list[float]:
    """The seconds of ``count`` one-row autocommit INSERTs on ``url``'s database, one after another."""
    walls: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_round_trip (id bigint PRIMARY KEY, value bytea)")
        for i in range(_WARM + count):
            started = time.perf_counter()
            conn.execute("INSERT INTO bench_round_trip VALUES (%s, %s)", (i, _VALUE))
            if i >= _WARM:
                walls.append(time.perf_counter() - started)
    return walls


def time_pg_ledger_writes(url: str, count: int, *, backend: str = "asyncio") -> list[float]:
    """The seconds of ``count`` appends of one message each to a kept stream of the ledger at ``url``."""
    walls: list[float] = []

    async def main() -> None:
        async with open_postgres(url) as ledger:
            opened = await ledger.streams.open(StreamOpen(_REF, "bytes", 16, ("bench",)))
            for seq in range(1, _WARM + count + 1):
                batch = AppendBatch(_REF, opened.generation, seq, (_VALUE,))
                started = time.perf_counter()
                await ledger.streams.append(batch)
                if seq > _WARM:
                    walls.append(time.perf_counter() - started)

    anyio.run(main, backend=backend)
    return walls
