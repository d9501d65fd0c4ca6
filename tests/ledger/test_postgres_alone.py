"""A call whose only statement is its write sends it alone, a transaction of its own (``_alone.py``).

A call whose streams the connection kept writes its records in one
statement that checks what it kept: it needs no BEGIN and no COMMIT around
it, and a call that sends any statement before its write still runs in one
transaction, all or nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from ledger import OutcomeUnknownError
from ledger.postgres import open_postgres
from ledger.postgres._alone import LazyTransaction, LedgerConnection
from ledger.postgres._view import _descriptor_decoder, _encoder
from streams import StreamFinishedError, StreamRef
from streams.store import AppendBatch, StreamOpen

pytestmark = pytest.mark.anyio

REF = StreamRef("s", "src", "numbers")


def _runs(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as other:  # what is committed, for everyone
        [(runs,)] = other.execute("SELECT count(*) FROM streamledger_messages").fetchall()
    return int(runs)


async def test_a_call_whose_only_statement_is_its_write_sends_it_alone_as_its_own_transaction(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append to a kept stream is one statement: no BEGIN and no COMMIT (one round trip), and what
    it wrote is committed as it returns; a call that reads first runs in a transaction as before."""
    async with open_postgres(postgres_url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01",)))  # now kept
        begun: list[object] = []
        transaction = LedgerConnection.transaction

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            begun.append(self)
            return transaction(self, *args, **kwargs)

        monkeypatch.setattr(LedgerConnection, "transaction", counted)
        for i in (2, 3):
            await ledger.streams.append(AppendBatch(REF, opened.generation, i, (bytes([i]),)))
        assert begun == []
        assert _runs(postgres_url) == 3
        assert await ledger.backend.connection.call(lambda view: view.connection.execute("SELECT 1") and 1)
        assert len(begun) == 1  # a statement before the write: the call's transaction began with it


async def test_a_write_that_went_alone_and_lost_its_link_is_a_lost_commit(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its one statement was its commit: the server ends the session while it runs (at its commit, a
    deferred trigger), and the caller is told the outcome is unknown, never that it left nothing."""
    async with open_postgres(postgres_url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01",)))  # now kept
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "CREATE FUNCTION end_session() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$"
            )
            admin.execute(
                "CREATE CONSTRAINT TRIGGER end_session AFTER INSERT ON streamledger_messages"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION end_session()"
            )
        with pytest.raises(OutcomeUnknownError, match="whether it landed is unknown"):
            await ledger.streams.append(AppendBatch(REF, opened.generation, 2, (b"\x02",)))


def test_nothing_may_follow_a_write_that_went_alone(postgres_url: str) -> None:
    with LedgerConnection.connect(postgres_url, autocommit=True) as conn:
        with LazyTransaction(conn) as lazy:
            assert conn.write_alone() and lazy.wrote_alone
            conn.execute("SELECT 1")  # the write itself
            with pytest.raises(RuntimeError, match="went alone"):
                conn.execute("SELECT 2")
        with LazyTransaction(conn) as lazy:
            conn.execute("SELECT 1")  # began the transaction
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            assert not conn.write_alone() and not lazy.wrote_alone
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed
        with pytest.raises(ZeroDivisionError), LazyTransaction(conn):
            conn.execute("CREATE TABLE rolled_back (id int)")
            raise ZeroDivisionError
        assert conn.execute("SELECT to_regclass('rolled_back') IS NULL").fetchone() == (True,)


def _wait_until_blocked(conn: psycopg.Connection[Any], pid: int, by: int) -> None:
    """Return once session ``pid`` waits for a lock ``by`` holds (the server asked on its own side)."""
    conn.execute("SET statement_timeout = '60s'")
    conn.execute(
        f"DO $$ BEGIN WHILE NOT pg_isolation_test_session_is_blocked({int(pid)}, ARRAY[{int(by)}])"
        " LOOP PERFORM pg_sleep(0.001); END LOOP; END $$"
    )


async def test_a_lone_write_whose_row_another_transaction_changes_meanwhile_never_overwrites_it(
    postgres_url: str,
) -> None:
    """A kept append goes alone; another transaction finishes the stream in its row after the append's
    statement began (it read the snapshot before): the append must not write over the finish. It
    fails as a conflict and runs again from the rows read afresh, and is refused: the stream is
    finished. (At read committed, the server's default, it waited for the row, then overwrote it.)

    PostgreSQL has no event for a session starting to wait on a lock: as its own isolation tester
    does, the test asks ``pg_isolation_test_session_is_blocked`` until the append waits."""
    async with open_postgres(postgres_url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01",)))  # now kept
        pid = await ledger.backend.connection.call(lambda view: view.connection.info.backend_pid)
        where = "WHERE scope = %s AND node = %s AND key = %s"
        with psycopg.connect(postgres_url) as other, psycopg.connect(postgres_url, autocommit=True) as watch:
            [(raw,)] = other.execute(
                f"SELECT descriptor FROM streamledger_streams {where}", (REF.scope, REF.node, REF.key)
            ).fetchall()
            finished = msgspec.structs.replace(_descriptor_decoder.decode(raw), finished=True)
            other.execute(  # the row is locked until ``other`` commits
                f"UPDATE streamledger_streams SET descriptor = %s {where}",
                (_encoder.encode(finished), REF.scope, REF.node, REF.key),
            )
            refused: list[BaseException] = []

            async def append() -> None:
                try:
                    await ledger.streams.append(AppendBatch(REF, opened.generation, 2, (b"\x02",)))
                except StreamFinishedError as exc:
                    refused.append(exc)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(append)
                await anyio.to_thread.run_sync(_wait_until_blocked, watch, pid, other.info.backend_pid)
                other.commit()
        assert len(refused) == 1
        with psycopg.connect(postgres_url, autocommit=True) as after:
            [(raw,)] = after.execute(
                f"SELECT descriptor FROM streamledger_streams {where}", (REF.scope, REF.node, REF.key)
            ).fetchall()
        assert _descriptor_decoder.decode(raw).finished
        assert _runs(postgres_url) == 1
