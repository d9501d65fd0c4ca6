"""One connection to a PostgreSQL ledger, and the transaction every hook call runs in.

Each call is one serializable transaction: the rules of :mod:`streams.store`
run over a :class:`~ledger.postgres._view.PgView` of it, and it commits only
if they returned. Two workers whose calls conflict cannot both commit: one
is aborted by PostgreSQL and run again from scratch, which is safe because
an aborted transaction left nothing behind. Any other failure of the server
or the connection is raised: the outcome of a commit whose answer was lost
is found in the ledger on recovery, never assumed.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol, TypeVar

import anyio
import anyio.lowlevel
import psycopg
from psycopg import errors

from streams.store import StreamRef

from .._errors import LedgerUnreachableError
from .._gather import GATHER_STEPS
from ._schema import ensure_schema
from ._verify import verify_streams
from ._view import PgView

__all__ = ["Calls", "PgConnection", "connect", "describe_url"]


class Calls(Protocol):
    """What the stores of a PostgreSQL ledger make their calls through: its connection, maybe fenced."""

    @property
    def where(self) -> str: ...

    async def call(self, op: Callable[[PgView], T], *, buffered: bool = True) -> T: ...

    async def read(self, op: Callable[[PgView], T]) -> T: ...


@contextlib.contextmanager
def _no_savepoint() -> Iterator[None]:
    yield


T = TypeVar("T")

#: How often a call is run again after PostgreSQL aborted it for a conflict with another worker's.
MAX_CONFLICT_RETRIES: Final = 100
_CONFLICTS: Final = (errors.SerializationFailure, errors.DeadlockDetected)


def describe_url(url: str) -> str:
    """``url`` as error messages name it: database and host, never a password."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "a PostgreSQL ledger (its URL does not parse)"
    host = params.get("host") or "localhost"
    return f"the PostgreSQL ledger {params.get('dbname') or '(default database)'} on {host}"


def connect(url: str) -> Any:
    """An autocommit connection to ``url``; an unreachable server is :class:`LedgerUnreachableError`."""
    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise LedgerUnreachableError(f"{describe_url(url)} cannot be reached: {reason}") from None
    except psycopg.ProgrammingError as exc:  # a URL libpq cannot parse
        raise LedgerUnreachableError(f"{describe_url(url)}: {exc}") from None


class _Call:
    """One hook call waiting for, or done by, a group commit."""

    __slots__ = ("done", "error", "op", "result", "savepoint")

    def __init__(self, op: Callable[[PgView], Any], savepoint: bool) -> None:
        self.op = op
        self.savepoint = savepoint  # it may write before it raises: run it in a savepoint of its own
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


#: How long the server lets a transaction of this connection sit idle before it ends the session.
#: A transaction here runs its statements back to back and commits at once, so only a process that
#: stopped inside one (SIGSTOP, a debugger, a frozen VM) is ever idle in it; ending its session
#: releases its row locks, so another worker can take its runs over once their leases run out (the
#: stopped one, resumed, finds its connection gone and its lease lost). A URL that sets
#: ``idle_in_transaction_session_timeout`` itself keeps its own value.
IDLE_IN_TRANSACTION_SECONDS = 5


def _end_abandoned_transactions(conn: Any) -> None:
    row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    if row is not None and row[0] in ("0", "0ms"):
        conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_SECONDS}s'")


class PgConnection:
    """A ledger's connection, and its group commit.

    Calls made while a transaction is in flight wait and then share the next
    one: each runs in a savepoint of its own, so a call its rules refuse
    leaves nothing and fails alone, and one COMMIT (one WAL flush) confirms
    the others together. The transaction runs in a worker thread, so the
    event loop never waits on the server.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = describe_url(url)
        self._conn: Any = None
        self._using = threading.Lock()  # the connection is used by one batch, or one read, at a time
        self._ids: dict[StreamRef, int] = {}
        self._pending: list[_Call] = []
        self._busy = False
        self._landed = anyio.Event()
        #: Transactions committed and the calls they confirmed, for benchmarks and tests.
        self.transactions = 0
        self.calls = 0

    def connect(self) -> None:
        """Connect (blocking) and check or make the schema."""
        conn = connect(self.url)
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        try:
            _end_abandoned_transactions(conn)
            ensure_schema(conn, self.where)
            verify_streams(conn, self.where)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def call(self, op: Callable[[PgView], T], *, buffered: bool = True) -> T:
        """Run ``op`` over a view of the next transaction; return once it committed.

        ``buffered`` says that ``op`` writes only through its view, which
        writes at its end: one that raises wrote nothing, so it needs no
        savepoint. Others (the node hooks) run in a savepoint.

        The caller that finds no transaction in flight runs the batch of every
        call waiting, its own among them; the others wait for it. Once its
        transaction started, a call runs to its end even if its caller is
        cancelled; a call cancelled before that is dropped, never run.
        """
        call = _Call(op, savepoint=not buffered)
        self._pending.append(call)
        try:
            while not call.done:
                if self._busy:
                    await self._landed.wait()
                    for _ in range(GATHER_STEPS - 1):  # waking was the first: what the landing
                        await anyio.lowlevel.checkpoint()  # sets off joins the next batch
                    continue
                batch, self._pending = self._pending, []
                self._busy = True
                try:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(self._run_batch, batch)
                finally:
                    self._busy = False
                    landed, self._landed = self._landed, anyio.Event()
                    landed.set()
        except BaseException:
            if call in self._pending:  # never started: as if it had not been made
                self._pending.remove(call)
            raise
        if call.error is not None:
            raise call.error
        result: T = call.result
        return result

    async def read(self, op: Callable[[PgView], T]) -> T:
        """Run ``op`` in a transaction of its own, in a worker thread: the event loop never waits on it.

        It runs as soon as no batch holds the connection, beside the group
        commit's queue (a read needs no durable commit). Cancelled, it still
        runs to its end in its thread and its answer is dropped.
        """
        call = _Call(op, savepoint=False)
        await anyio.to_thread.run_sync(self._run_batch, [call])
        if call.error is not None:
            raise call.error
        result: T = call.result
        return result

    def _run_batch(self, batch: list[_Call]) -> None:
        with self._using:
            try:
                self._transaction(batch)
            except Exception as exc:  # the transaction failed as a whole (or its one call was refused)
                for call in batch:
                    if not call.done:
                        call.error, call.done = exc, True

    def _transaction(self, batch: list[_Call]) -> None:
        if self._conn is None or self._conn.broken:
            self.close()
            self.connect()  # a connection lost before: its last calls' outcomes are in the ledger
        conn = self._conn
        shared = len(batch) > 1
        for attempt in range(MAX_CONFLICT_RETRIES + 1):
            outcomes: list[tuple[_Call, Any, BaseException | None, dict[StreamRef, int]]] = []
            try:
                with conn.transaction():
                    for call in batch:
                        outcomes.append(self._one(conn, call, shared))
                    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                        # the server aborted the transaction: its COMMIT would be a silent ROLLBACK
                        raise _WriteRefused
            except _CONFLICTS:
                if attempt == MAX_CONFLICT_RETRIES:
                    raise
                # a little apart, so two workers that keep colliding stop doing so in step
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
                continue
            except _WriteRefused:
                for call in batch:  # one call's writes failed and aborted the others': each on its own
                    try:
                        self._transaction([call])
                    except Exception as exc:
                        call.error, call.done = exc, True
                return
            self.transactions += 1
            self.calls += len(batch)
            for call, result, error, ids in outcomes:
                if error is None:
                    self._ids.update(ids)
                call.result, call.error, call.done = result, error, True
            return

    def _one(
        self, conn: Any, call: _Call, shared: bool
    ) -> tuple[_Call, Any, BaseException | None, dict[StreamRef, int]]:
        """Run one call of a transaction; an error of its own is its outcome, unless it must abort all."""
        view = PgView(conn, self._ids)
        if not shared:  # alone in its transaction: whatever it raises rolls the transaction back
            result = call.op(view)
            view.flush()
            return call, result, None, view.ids
        if call.savepoint:
            try:
                with conn.transaction():
                    result = call.op(view)
                    view.flush()
            except _CONFLICTS:
                raise
            except Exception as exc:  # its savepoint left nothing
                return call, None, exc, {}
            return call, result, None, view.ids
        try:
            result = call.op(view)
        except _CONFLICTS:
            raise
        except psycopg.Error as exc:  # the server failed a read: it aborted the whole transaction
            raise _WriteRefused from exc
        except Exception as exc:  # refused by the rules before it wrote anything
            return call, None, exc, {}
        try:
            view.flush()
        except _CONFLICTS:
            raise
        except Exception as exc:  # the server refused a write: the transaction is aborted
            raise _WriteRefused from exc
        return call, result, None, view.ids


class _WriteRefused(Exception):
    """A shared transaction's write failed: run its calls again, each in a transaction of its own."""
