"""Calls sharing a transaction send it in one pipeline (``_pipelined.py``): one round trip, all or nothing.

The round trips are counted in libpq's own trace of the protocol: the
client sends messages (``F``) until it must wait for the server's (``B``);
each turn from sending to receiving is one round trip.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from ledger.postgres import open_postgres
from ledger.postgres._pipelined import PipelinedTransaction
from streams import StreamRef
from streams.store import AppendBatch, StreamOpen

pytestmark = pytest.mark.anyio

REFS = [StreamRef("shop", "intake", f"orders-{i}") for i in range(3)]


@contextmanager
def round_trips(conn: Any, trace: Path) -> Iterator[list[int]]:
    """The round trips ``conn`` makes in the block, counted once it ends (one item: the count)."""
    counted: list[int] = []
    fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    conn.pgconn.trace(fd)
    conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
    try:
        yield counted
    finally:
        conn.pgconn.untrace()
        os.close(fd)
    sides = [line.split("\t", 1)[0] for line in trace.read_text().splitlines() if line[:1] in ("F", "B")]
    counted.append(sum(1 for turn in itertools.pairwise(sides) if turn == ("F", "B")))


async def _appended(ledger: Any, ref: StreamRef) -> int:
    described = await ledger.streams.describe(ref)
    assert described is not None
    return int(described.appended)


async def _together(ledger: Any, generations: list[int], seq: int) -> list[int]:
    """An append to each stream, all made in one step of the event loop: their calls share a batch;
    the sizes of the batches the connection ran."""
    connection = ledger.backend.connection
    sizes: list[int] = []
    attempt = type(connection)._attempt

    def seen(self: Any, batch: list[Any]) -> None:
        sizes.append(len(batch))
        attempt(self, batch)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(type(connection), "_attempt", seen)
        async with anyio.create_task_group() as tg:
            for ref, generation in zip(REFS, generations, strict=True):
                tg.start_soon(ledger.streams.append, AppendBatch(ref, generation, seq, (bytes([seq]),)))
    return sizes


async def test_calls_sharing_a_transaction_send_begin_their_writes_and_commit_in_one_round_trip(
    postgres_url: str, tmp_path: Path
) -> None:
    async with open_postgres(postgres_url) as ledger:
        generations = []
        for ref in REFS:
            opened = await ledger.streams.open(StreamOpen(ref, "bytes", 16, ("totals",)))
            await ledger.streams.append(AppendBatch(ref, opened.generation, 1, (b"\x01",)))  # now kept
            generations.append(opened.generation)
        conn = await ledger.backend.connection.call(lambda view: view.connection)
        pipelines: list[PipelinedTransaction] = []
        enter = PipelinedTransaction.__enter__

        def counted(self: PipelinedTransaction) -> PipelinedTransaction:
            pipelines.append(self)
            return enter(self)

        with pytest.MonkeyPatch.context() as patched, round_trips(conn, tmp_path / "trace") as trips:
            patched.setattr(PipelinedTransaction, "__enter__", counted)
            sizes = await _together(ledger, generations, 2)
        assert sizes == [3] and len(pipelines) == 1
        assert trips == [1]  # BEGIN, three writes and COMMIT: one flight, one answer
        # committed, for everyone
        with psycopg.connect(postgres_url, autocommit=True) as other:
            [(runs,)] = other.execute("SELECT count(*) FROM streamledger_messages").fetchall()
        assert runs == 6
        assert [await _appended(ledger, ref) for ref in REFS] == [2, 2, 2]


async def test_a_shared_write_whose_kept_stream_went_stale_runs_the_batch_again_from_fresh_reads(
    postgres_url: str,
) -> None:
    """Another store appends to one of the kept streams: that call's write fails in the pipeline, the
    server skips the rest (COMMIT too), and the batch runs again from records read afresh; each call
    then meets its own outcome (the stale one is refused by its rules: its sequence was taken)."""
    async with open_postgres(postgres_url) as ledger, open_postgres(postgres_url) as other:
        generations = []
        for ref in REFS:
            opened = await ledger.streams.open(StreamOpen(ref, "bytes", 16, ("totals",)))
            await ledger.streams.append(AppendBatch(ref, opened.generation, 1, (b"\x01",)))
            generations.append(opened.generation)
        await other.streams.append(AppendBatch(REFS[1], generations[1], 2, (b"theirs",)))
        connection = ledger.backend.connection
        outcomes: list[BaseException | None] = [None] * len(REFS)

        async def append(i: int) -> None:
            try:
                await ledger.streams.append(AppendBatch(REFS[i], generations[i], 2, (b"\x02",)))
            except Exception as exc:
                outcomes[i] = exc

        before = connection.transactions
        async with anyio.create_task_group() as tg:
            for i in range(len(REFS)):
                tg.start_soon(append, i)
        assert [type(o).__name__ for o in outcomes] == ["NoneType", "SequenceError", "NoneType"]
        assert connection.transactions == before + 1  # the failed pipeline committed nothing
        assert [await _appended(ledger, ref) for ref in REFS] == [2, 2, 2]
        reopened = await ledger.streams.open(StreamOpen(REFS[1], "bytes", 16, ("totals",), resumable=True))
        assert [m.payload for m in reopened.tail] == [b"\x01", b"theirs"]


async def test_a_failure_fetched_as_commit_is_queued_ends_the_pipeline_and_the_batch_runs_again(
    postgres_url: str,
) -> None:
    """Queuing COMMIT fetches the answers already in, so an earlier statement's failure can surface
    there; the pipeline still ends (none is left open on the connection for the next batch to sync)
    and the batch runs again: each call commits once."""
    async with open_postgres(postgres_url) as ledger:
        generations = []
        for ref in REFS:
            opened = await ledger.streams.open(StreamOpen(ref, "bytes", 16, ("totals",)))
            await ledger.streams.append(AppendBatch(ref, opened.generation, 1, (b"\x01",)))
            generations.append(opened.generation)
        conn = await ledger.backend.connection.call(lambda view: view.connection)
        left_open: list[object] = []
        leave = PipelinedTransaction.__exit__
        execute = type(conn).execute
        failures = [psycopg.errors.SerializationFailure("could not serialize access")]

        def commit_fails_once(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if query == "COMMIT" and failures and getattr(self, "deferred", False):
                raise failures.pop()
            return execute(self, query, *args, **kwargs)

        def ended(tx: PipelinedTransaction, kind: Any, exc: Any, tb: Any) -> bool:
            try:
                return leave(tx, kind, exc, tb)
            finally:
                left_open.append(tx.connection._pipeline)

        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(type(conn), "execute", commit_fails_once)
            patched.setattr(PipelinedTransaction, "__exit__", ended)
            sizes = await _together(ledger, generations, 2)
        assert not failures and sizes[0] == 3
        assert left_open and all(pipeline is None for pipeline in left_open)
        assert not conn.deferred and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert [await _appended(ledger, ref) for ref in REFS] == [2, 2, 2]
        with psycopg.connect(postgres_url, autocommit=True) as other:
            [(runs,)] = other.execute("SELECT count(*) FROM streamledger_messages").fetchall()
        assert runs == 6
