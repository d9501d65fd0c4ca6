"""The PostgreSQL ledger as a store: its schema record, damage, lost connections, workers that conflict.

The conformance suite proves its rules (it runs every check on PostgreSQL
too); these are the store's own counterparts of the LMDB ledger's tests of
versions, damage and locking.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec
import psycopg
import pytest

from ledger import (
    DamagedLedgerError,
    LedgerServerError,
    NotALedgerError,
    OutcomeUnknownError,
    SchemaVersionError,
)
from ledger._committer import GATHER_STEPS
from ledger._format import LedgerMeta
from ledger.postgres import open_postgres
from ledger.postgres._schema import FORMAT
from streams import (
    Key,
    MessageTx,
    StaleGenerationError,
    Stream,
    StreamRef,
    handle_messages,
    open_scope,
    store,
)
from streams.store import (
    AppendBatch,
    KeyedEntry,
    KeyedRange,
    KeyedRead,
    KeyedWrite,
    MessageCommit,
    MessageOpen,
    MessageRef,
    StreamOpen,
)

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])
REF = StreamRef("s", "src", "numbers")


def execute(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


async def three_messages(url: str) -> None:
    async with open_postgres(url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a", "b")))
        await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01", b"\x02", b"\x03")))


@asynccontextmanager
async def in_flight(connection: Any, tg: anyio.abc.TaskGroup) -> AsyncIterator[None]:
    """A transaction in flight for the block: the calls made in it wait, and share the next one."""
    connection._using.acquire()  # the writer thread waits for the connection with its batch
    try:
        tg.start_soon(connection.call, lambda view: None)
        for _ in range(GATHER_STEPS + 1):  # the call leaves at the end of its step of the loop
            await anyio.lowlevel.checkpoint()
        assert connection._committer._batch is not None
        yield
    finally:
        connection._using.release()


async def test_a_new_database_gets_its_tables_and_schema_record(postgres_url: str) -> None:
    await three_messages(postgres_url)
    [(raw,)] = execute(postgres_url, "SELECT value FROM streamledger_meta WHERE name = 'schema'")
    assert msgspec.msgpack.decode(raw, type=LedgerMeta).format == FORMAT
    async with open_postgres(postgres_url) as ledger:  # reopened: the same records
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a", "b"), resumable=True))
        assert (opened.generation, opened.appended, len(opened.tail)) == (2, 3, 3)


@pytest.mark.parametrize(
    ("record", "error"),
    [
        (LedgerMeta(FORMAT, 99, "msgpack", 1), SchemaVersionError),
        (LedgerMeta(FORMAT, 1, "msgpack", 7), SchemaVersionError),
        (LedgerMeta("something-else", 1, "msgpack", 1), NotALedgerError),
    ],
)
async def test_another_schema_codec_or_format_is_refused_and_changes_nothing(
    postgres_url: str, record: LedgerMeta, error: type[Exception]
) -> None:
    await three_messages(postgres_url)
    execute(
        postgres_url,
        "UPDATE streamledger_meta SET value = %s WHERE name = 'schema'",
        (msgspec.msgpack.encode(record),),
    )
    before = execute(postgres_url, "SELECT descriptor FROM streamledger_streams")
    with pytest.raises(error):
        async with open_postgres(postgres_url):
            pass
    assert execute(postgres_url, "SELECT descriptor FROM streamledger_streams") == before


async def test_a_dropped_table_is_damage_found_on_open(postgres_url: str) -> None:
    await three_messages(postgres_url)
    execute(postgres_url, "DROP TABLE streamledger_groups")
    with pytest.raises(DamagedLedgerError, match=r"lacks its table\(s\) streamledger_groups"):
        async with open_postgres(postgres_url):
            pass


async def test_a_connection_lost_inside_a_call_runs_it_again_on_a_new_connection(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_postgres(postgres_url) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
        for i in (1, 2, 3):
            await stream.writer().send(i)
        await stream.writer().flush()
    commit = store.commit
    lost: list[int] = []

    def commit_then_lose_the_connection(view: Any, commits: Any) -> None:
        # a statement first: the call's transaction begins with it (a call whose only statement is its
        # write sends it alone, its own transaction, and a link lost then is a lost commit)
        view.connection.execute("SELECT 1")
        commit(view, commits)
        view.flush()  # the records are written in the open transaction; the server drops it with the link
        if not lost:
            lost.append(1)
            view._conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    monkeypatch.setattr(store, "commit", commit_then_lose_the_connection)

    async def add(tx: MessageTx[int], value: int) -> None:
        tx.set_state(tx.state + value)

    async with open_postgres(postgres_url) as ledger:
        async with open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
            await stream.writer().finish()
            assert (await handle_messages(stream.reader("a"), add, initial_state=0)).state == 6
        assert lost == [1] and ledger.backend.connection.reconnects == 1  # the lost transaction left nothing
        async with open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("a",), resumable=True)
            assert [g.acked_through for g in stream.snapshot().groups] == [3]  # each message once


async def test_a_connection_lost_while_its_commit_was_in_flight_is_an_unknown_outcome(
    postgres_url: str,
) -> None:
    """The server ends the session inside COMMIT (a deferred trigger): whether it landed is unknown to
    the caller, so it is told so, typed, and the next call reconnects; a read just runs again."""
    async with open_postgres(postgres_url) as ledger:
        await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        execute(
            postgres_url,
            "CREATE FUNCTION lose_at_commit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$",
        )
        execute(
            postgres_url,
            "CREATE CONSTRAINT TRIGGER lose_at_commit AFTER INSERT ON streamledger_messages"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lose_at_commit()",
        )
        with pytest.raises(OutcomeUnknownError, match="went away while a commit was in flight"):
            await ledger.streams.append(AppendBatch(REF, 1, 1, (b"\x01",)))
        # the next call reconnects; the ledger says what landed (the trigger's session ended first: nothing)
        described = await ledger.streams.describe(REF)
        assert described is not None and described.appended == 0
        assert ledger.backend.connection.reconnects == 1


async def test_workers_on_one_ledger_conflict_safely_and_a_reopen_fences_the_older_one(
    postgres_url: str,
) -> None:
    await three_messages(postgres_url)
    async with open_postgres(postgres_url) as first, open_postgres(postgres_url) as second:
        opened = await first.streams.open(StreamOpen(REF, "int", 16, ("a", "b"), resumable=True))
        n = 200
        await first.streams.append(
            AppendBatch(REF, opened.generation, 4, tuple(b"%d" % i for i in range(n - 3)))
        )

        async def ack_all(worker: Any, group: str) -> None:
            for seq in range(1, n + 1):
                await worker.streams.commit([MessageCommit(MessageRef(REF, group, opened.generation, seq))])

        async with anyio.create_task_group() as tg:  # two connections, serializable: conflicts are retried
            tg.start_soon(ack_all, first, "a")
            tg.start_soon(ack_all, second, "b")
        taken = await second.streams.open(StreamOpen(REF, "int", 16, ("a", "b"), resumable=True))
        assert [g.acked_through for g in taken.groups] == [n, n] and taken.tail == ()
        with pytest.raises(StaleGenerationError):
            await first.streams.append(AppendBatch(REF, opened.generation, n + 1, (b"late",)))


def test_migrate_makes_a_ledger_in_an_empty_database_then_has_nothing_to_do(postgres_url: str) -> None:
    from .test_cli import cli

    made = cli("migrate", postgres_url)
    assert made.returncode == 0 and made.stdout.startswith("made a ledger of schema 4 in "), made.stderr
    again = cli("migrate", postgres_url)
    assert again.returncode == 0 and "is at schema 4: nothing to do" in again.stdout


async def test_an_older_schema_is_refused_on_open_and_migrated_explicitly(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.postgres import _schema

    await three_messages(postgres_url)
    # this build reads schema 5, whose migration from 4 adds a table
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", 5)
    monkeypatch.setattr(_schema, "MIGRATIONS", {4: "CREATE TABLE streamledger_extra (x integer)"})
    with pytest.raises(
        SchemaVersionError, match=r"holds schema 4; this build reads schema 5: .*ledger migrate"
    ):
        async with open_postgres(postgres_url):
            pass
    assert execute(postgres_url, "SELECT to_regclass('streamledger_extra') IS NULL") == [(True,)]

    def migrate() -> tuple[int, int]:  # as `python -m ledger migrate` does, off the event loop
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            return _schema.migrate(conn, "the ledger")

    assert await anyio.to_thread.run_sync(migrate) == (4, 5)
    async with open_postgres(postgres_url) as ledger:  # migrated: it opens, with its records
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a", "b"), resumable=True))
        assert opened.appended == 3
    # a step that fails leaves the schema as it was
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", 6)
    monkeypatch.setattr(_schema, "MIGRATIONS", {5: "CREATE TABLE streamledger_meta (x integer)"})
    with pytest.raises(psycopg.errors.DuplicateTable):
        await anyio.to_thread.run_sync(migrate)
    [(raw,)] = execute(postgres_url, "SELECT value FROM streamledger_meta WHERE name = 'schema'")
    assert msgspec.msgpack.decode(raw, type=LedgerMeta).schema_version == 5


async def test_a_schema_1_ledger_is_migrated_to_keep_each_run_id_twice(postgres_url: str) -> None:
    """Schema 2 keeps a digest of each run id beside it: the migration computes it for every row."""
    from ledger.postgres import _schema

    from .pool_graphs import N, summing

    async with open_postgres(postgres_url) as ledger:
        await ledger.run(summing(), {N: 4}, run_id="sum-4")
    meta = LedgerMeta(FORMAT, 1, "msgpack", 1)
    for table in ("streamledger_runs", "streamledger_graph_runs"):  # what schema 1 had
        execute(postgres_url, f"ALTER TABLE {table} DROP COLUMN id_digest")
    execute(postgres_url, "DROP TABLE streamledger_keyed")  # schema 3's
    execute(postgres_url, "DROP TABLE streamledger_members, streamledger_partition_leases")  # schema 4's
    execute(
        postgres_url,
        "UPDATE streamledger_meta SET value = %s WHERE name = 'schema'",
        (msgspec.msgpack.encode(meta),),
    )
    with pytest.raises(SchemaVersionError, match="holds schema 1"):
        async with open_postgres(postgres_url):
            pass

    def migrate() -> tuple[int, int]:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            return _schema.migrate(conn, "the ledger")

    assert await anyio.to_thread.run_sync(migrate) == (1, 4)  # through schemas 2 and 3
    assert execute(postgres_url, "SELECT id_digest = md5(run_id) FROM streamledger_runs") == [(True,)]
    async with open_postgres(postgres_url) as ledger:
        again = await ledger.resume("sum-4", summing())
        assert again.already_finished and again.result[Key("answer", int)] == 21


async def test_a_schema_2_ledger_is_refused_then_migrated_and_keeps_keyed_state(postgres_url: str) -> None:
    """Schema 3 adds the table of the groups' keyed state: a schema 2 ledger is migrated to it, empty."""
    from ledger.postgres import _schema

    await three_messages(postgres_url)
    execute(postgres_url, "DROP TABLE streamledger_keyed")  # what schema 2 had
    execute(postgres_url, "DROP TABLE streamledger_members, streamledger_partition_leases")
    execute(
        postgres_url,
        "UPDATE streamledger_meta SET value = %s WHERE name = 'schema'",
        (msgspec.msgpack.encode(LedgerMeta(FORMAT, 2, "msgpack", 1)),),
    )
    with pytest.raises(SchemaVersionError, match=r"holds schema 2; this build reads schema 4: .*migrate"):
        async with open_postgres(postgres_url):
            pass
    assert execute(postgres_url, "SELECT to_regclass('streamledger_keyed') IS NULL") == [(True,)]

    def migrate() -> tuple[int, int]:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            return _schema.migrate(conn, "the ledger")

    assert await anyio.to_thread.run_sync(migrate) == (2, 4)  # keyed state, then the members' tables
    assert await anyio.to_thread.run_sync(migrate) == (4, 4)  # nothing more to do
    values = (KeyedWrite(b"alice", b"\x01"), KeyedWrite(b"bob", b"\x02"))
    async with open_postgres(postgres_url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a", "b"), resumable=True))
        assert opened.appended == 3  # its records, as they were
        message = MessageRef(REF, "a", opened.generation, 1)
        await ledger.streams.commit([MessageCommit(message, keyed=values)])
    async with open_postgres(postgres_url) as ledger:
        hooks = ledger.streams
        assert isinstance(hooks, store.KeyedHooks)
        assert await hooks.read_keyed(KeyedRead(REF, "a", (b"bob", b"carol", b"alice"))) == (
            b"\x02",
            None,
            b"\x01",
        )
        listed = await hooks.list_keyed(KeyedRange(REF, "a"))
        assert listed == (KeyedEntry(b"alice", b"\x01"), KeyedEntry(b"bob", b"\x02"))
        assert await hooks.list_keyed(KeyedRange(REF, "b")) == ()


async def test_a_call_the_server_fails_in_a_shared_transaction_takes_no_other_call_with_it(
    postgres_url: str,
) -> None:
    async with open_postgres(postgres_url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        connection = ledger.backend.connection
        results: dict[str, str] = {}

        async def append() -> None:
            await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01", b"\x02")))
            results["append"] = "ok"

        async def out_of_range() -> None:  # the server aborts the transaction this call reads in
            try:
                await ledger.streams.open_message(
                    MessageOpen(MessageRef(REF, "a", opened.generation, 2**63), "n", 3)
                )
            except LedgerServerError as exc:  # the ledger's error, never psycopg's
                results["bad"] = str(exc).split("(SQLSTATE ")[1][:5]

        async def other_open() -> None:
            await ledger.streams.open(StreamOpen(StreamRef("s", "src", "other"), "int", 16, ("a",)))
            results["open"] = "ok"

        async with anyio.create_task_group() as tg, in_flight(connection, tg):
            for call in (append, out_of_range, other_open):  # they wait, then share the next batch
                tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()
            assert connection._committer is not None and len(connection._committer._pending) == 3
        assert results == {"append": "ok", "bad": "22003", "open": "ok"}  # numeric_value_out_of_range
        reopened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",), resumable=True))
        assert reopened.appended == 2  # the append was committed, not rolled back with the failed read
        other = await ledger.streams.open(StreamOpen(StreamRef("s", "src", "other"), "int", 16, ("a",), True))
        assert not other.created


async def test_a_call_the_rules_refuse_in_a_shared_transaction_leaves_nothing_and_the_others_commit(
    postgres_url: str,
) -> None:
    async with open_postgres(postgres_url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        connection = ledger.backend.connection
        results: dict[str, str] = {}

        async def append() -> None:
            await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01", b"\x02")))
            results["append"] = "ok"

        async def stale() -> None:  # refused by the rules once it has read: no write of it may land
            try:
                await ledger.streams.append(AppendBatch(REF, opened.generation + 5, 3, (b"\x09",)))
            except StaleGenerationError:
                results["stale"] = "refused"

        async def other_open() -> None:  # in any order with the others: they touch other records
            await ledger.streams.open(StreamOpen(StreamRef("s", "src", "other"), "int", 16, ("a",)))
            results["open"] = "ok"

        transactions, calls = connection.transactions, connection.calls
        async with anyio.create_task_group() as tg, in_flight(connection, tg):
            for call in (append, stale, other_open):  # they wait, then share the next batch
                tg.start_soon(call)
            await anyio.wait_all_tasks_blocked()
        assert results == {"append": "ok", "stale": "refused", "open": "ok"}
        assert connection.calls - calls > connection.transactions - transactions  # calls shared transactions
        reopened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",), resumable=True))
        assert reopened.appended == 2
        other = await ledger.streams.open(StreamOpen(StreamRef("s", "src", "other"), "int", 16, ("a",), True))
        assert not other.created


def test_a_process_stopped_inside_a_transaction_loses_its_session_and_its_locks(postgres_url: str) -> None:
    """A worker frozen mid-transaction (SIGSTOP) cannot hold its rows for ever: the server ends its
    session once it sat idle in the transaction, and another connection then takes the row lock."""
    from ledger.postgres._store import IDLE_IN_TRANSACTION_SECONDS, SESSION_TIMEOUTS, PgConnection

    execute(postgres_url, "CREATE TABLE IF NOT EXISTS frozen (id int PRIMARY KEY)")
    execute(postgres_url, "INSERT INTO frozen VALUES (1) ON CONFLICT DO NOTHING")
    stopped = PgConnection(postgres_url)
    stopped.connect()
    [(setting,)] = stopped._conn.execute("SHOW idle_in_transaction_session_timeout").fetchall()
    assert setting == f"{IDLE_IN_TRANSACTION_SECONDS}s"
    for name, value in SESSION_TIMEOUTS.items():  # a lock wait, a statement: bounded too
        assert stopped._conn.execute(f"SHOW {name}").fetchone() == (value,)
    # its session is gone when it wakes up
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout), stopped._conn.transaction():
        stopped._conn.execute("SELECT id FROM frozen WHERE id = 1 FOR UPDATE")
        with psycopg.connect(postgres_url, autocommit=True) as other:
            # blocks on the frozen transaction's lock until the server ends that session
            assert other.execute("SELECT id FROM frozen WHERE id = 1 FOR UPDATE").fetchone() == (1,)
        stopped._conn.execute("SELECT 1")
    assert stopped._conn.broken
    stopped.close()
    own = PgConnection(f"{postgres_url}%20-clock_timeout%3D7s")  # the URL's own value is kept
    own.connect()
    assert own._conn.execute("SHOW lock_timeout").fetchone() == ("7s",)
    assert own._conn.execute("SHOW statement_timeout").fetchone() == (SESSION_TIMEOUTS["statement_timeout"],)
    own.close()
