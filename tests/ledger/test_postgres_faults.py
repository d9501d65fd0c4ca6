"""What a PostgreSQL fault becomes: one typed line from the CLI, a ledger error from the library.

The server-restart tests, with real worker processes, are in
``test_postgres_restarts.py``; these are the faults one connection meets.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import ledger
from ledger import (
    LeaseLostError,
    LedgerConflictError,
    LedgerError,
    LedgerServerError,
    LedgerUnreachableError,
    MissingSchemaError,
    NotALedgerError,
)
from ledger.postgres import open_postgres
from ledger.postgres._faults import ReconnectBackoff, find_cause
from streams import StreamRef
from streams.store import AppendBatch, StreamOpen, single_error

from ._mounts import remount, tmpfs
from .test_cli import cli

pytestmark = pytest.mark.anyio


def missing_schema(url: str) -> str:
    """``url`` with its search_path naming a schema that does not exist."""
    base = url.split("&options=")[0]
    return f"{base}&options=-csearch_path%3Dno_such_schema"


def test_a_search_path_naming_a_missing_schema_is_one_typed_line_from_the_cli(postgres_url: str) -> None:
    for command in ("inspect", "check"):
        done = cli(command, missing_schema(postgres_url))
        assert done.returncode == 2, done.stderr  # the caller's mistake, as a path that is not a ledger
        assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1, done.stderr
        assert "search_path (no_such_schema) names no schema that exists" in done.stderr
    migrate = cli("migrate", missing_schema(postgres_url))
    assert migrate.returncode == 2 and len(migrate.stderr.splitlines()) == 1, migrate.stderr


async def test_a_search_path_naming_a_missing_schema_is_a_typed_error_from_connect(postgres_url: str) -> None:
    with pytest.raises(MissingSchemaError, match="no_such_schema") as raised:
        async with ledger.connect(missing_schema(postgres_url)):
            pass
    assert isinstance(raised.value, NotALedgerError)
    # and nothing was made anywhere else on the server: the URL's own schema is still empty
    done = cli("inspect", postgres_url)
    assert done.returncode == 2 and "holds no ledger" in done.stderr


async def test_a_refusal_is_raised_at_once_and_a_missing_server_after_the_reconnect_time(
    postgres_server: Any, tmp_path: Any
) -> None:
    began = time.monotonic()
    with pytest.raises(LedgerUnreachableError, match='database "no_such_database" does not exist'):
        async with open_postgres(postgres_server.url_for("no_such_database"), reconnect_seconds=30):
            pass
    with pytest.raises(LedgerUnreachableError, match='role "nobody" does not exist'):
        async with open_postgres(postgres_server.url.replace("user=postgres", "user=nobody")):
            pass
    assert time.monotonic() - began < 10  # a refusal is not waited out
    began = time.monotonic()
    with pytest.raises(LedgerUnreachableError, match=r"gave up after \d+ attempt\(s\) in 0\.\d s"):
        async with open_postgres(
            f"postgresql:///postgres?host={tmp_path}&user=postgres", reconnect_seconds=0.5
        ):
            pass
    assert 0.5 <= time.monotonic() - began < 10


def test_a_missing_database_or_role_is_one_line_from_the_cli(postgres_server: Any) -> None:
    for url in (
        postgres_server.url_for("no_such_database"),
        postgres_server.url.replace("=postgres", "=nobody"),
    ):
        done = cli("inspect", url)
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
        assert "cannot be reached" in done.stderr and "does not exist" in done.stderr


def test_a_cause_is_found_through_a_cycle_of_contexts_a_task_group_made() -> None:
    """The worker's lease-lost test walked causes and contexts recursively: an error re-raised out of
    the group holding it (single_error does so) has that group as its context, a cycle it followed
    until RecursionError, as the worker did when the server restarted under it."""

    async def main() -> BaseException:
        try:
            with single_error():
                async with anyio.create_task_group() as tg:

                    async def fail() -> None:
                        raise LedgerUnreachableError("gone")

                    tg.start_soon(fail)
        except LedgerUnreachableError as exc:
            return exc
        raise AssertionError("not raised")

    raised = anyio.run(main)
    group = raised.__context__
    assert isinstance(group, BaseExceptionGroup) and raised in group.exceptions  # the cycle
    assert find_cause(raised, LeaseLostError) is None
    assert find_cause(raised, LedgerError) is raised
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = raised
    assert find_cause(wrapped, LedgerUnreachableError) is raised


def test_the_backoff_is_jittered_grows_to_its_bound_and_stops_at_its_total() -> None:
    began = time.monotonic()  # before its deadline is set: the total counts from there
    backoff = ReconnectBackoff(0.4, first=0.01, longest=0.04)
    while backoff.wait():
        pass
    spent = time.monotonic() - began
    assert 0.4 <= spent < 1.5
    assert backoff.attempts >= 0.4 / 0.04  # it waited no more than its bound each time
    stopped = ReconnectBackoff(60.0)
    stopped._stop.set()
    assert not stopped.wait()


async def test_a_full_disk_on_the_server_is_a_typed_error_that_confirms_nothing(
    postgres_server: Any, postgres_url: str
) -> None:
    """The ledger's tables in a tablespace on a tiny tmpfs (through the URL's default_tablespace)."""
    root = Path(tempfile.mkdtemp(prefix="streamledger-small-"))
    os.chmod(root, 0o755)
    name = f"small_{os.getpid()}"
    schema = postgres_url.rsplit("%3D", 1)[1]
    try:
        with tmpfs(root / "disk", "640k") as disk:
            shutil.chown(disk, "postgres", "postgres")
            execute(postgres_server.url, f"CREATE TABLESPACE {name} LOCATION '{disk}'")
            try:
                await _fill_the_disk(f"{postgres_url}%20-cdefault_tablespace%3D{name}", disk)
            finally:
                execute(postgres_server.url, f"DROP SCHEMA {schema} CASCADE")
                execute(postgres_server.url, f"DROP TABLESPACE {name}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _fill_the_disk(url: str, disk: Path) -> None:
    ref = StreamRef("s", "src", "blobs")
    async with open_postgres(url) as opened:
        stream = await opened.streams.open(StreamOpen(ref, "bytes", 16, ("a",)))
        appended = 0
        with pytest.raises(LedgerServerError, match="disk is full") as full:
            for _ in range(100):
                await opened.streams.append(
                    AppendBatch(ref, stream.generation, appended + 1, (os.urandom(64 * 1024),))
                )
                appended += 1
        assert "SQLSTATE 53100" in str(full.value)
        described = await opened.streams.describe(ref)
        assert described is not None and described.appended == appended  # the failed append left nothing
        remount(disk, "size=64m")  # space freed: the same ledger goes on
        await opened.streams.append(AppendBatch(ref, stream.generation, appended + 1, (b"after",)))


def execute(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


async def test_conflicts_past_every_retry_are_a_typed_error(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from psycopg import errors

    from ledger.postgres import _store

    monkeypatch.setattr(_store, "MAX_CONFLICT_RETRIES", 2)
    attempts: list[int] = []

    def always_conflicting(view: Any) -> None:
        attempts.append(1)
        raise errors.SerializationFailure("could not serialize access due to concurrent update")

    async with open_postgres(postgres_url) as opened:
        with pytest.raises(
            LedgerConflictError, match=r"kept conflicting with other workers.*\(SQLSTATE 40001\)"
        ):
            await opened.backend.connection.call(always_conflicting)
    assert len(attempts) == 3  # the first try and its two retries, then given up


async def test_a_run_whose_commit_was_lost_with_the_server_resumes_exact(postgres_url: str) -> None:
    """The server ends the session inside the COMMIT of the run's first append (a deferred trigger):
    the run raises, caused by OutcomeUnknownError, and resuming it ends with the uninterrupted answer."""
    from ledger import OutcomeUnknownError
    from streams import CheckpointError

    from .pool_graphs import ANSWER, N, answer, summing

    async with open_postgres(postgres_url) as opened:
        await opened.streams.describe(StreamRef("s", "src", "none"))  # the tables exist now
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
        # the append's call, or a node hook's call sharing its transaction, reports the loss first
        lost = r"outcome is unknown|whether it landed is unknown"
        with pytest.raises(CheckpointError, match=lost) as raised:
            await opened.run(summing(), {N: 5}, run_id="lost")
        assert find_cause(raised.value, OutcomeUnknownError) is not None
        execute(postgres_url, "DROP TRIGGER lose_at_commit ON streamledger_messages")
        resumed = await opened.resume("lost", summing())
        assert resumed.result[ANSWER] == answer(5)
