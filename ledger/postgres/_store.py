"""One connection to a PostgreSQL ledger, and the transaction every hook call runs in.

Each call is one serializable transaction: the rules of :mod:`streams.store`
run over a :class:`~ledger.postgres._view.PgView` of it, and it commits only
if they returned. Two workers whose calls conflict cannot both commit: one
is aborted by PostgreSQL and run again from scratch, which is safe because
an aborted transaction left nothing behind.

The connection keeps each stream's descriptor and frontiers as its last
committed call left them (:meth:`PgView.keep`), so a call whose streams
are all kept reads none of them; its write statement compares every kept
record it used with its row instead. Another process's write fails the
comparison (:class:`~ledger.postgres._view.KeptStale`): the transaction is
rolled back and run again from records read afresh, as a conflict is. A
call that raised after using kept records is run again so too before its
error is believed, and a failed transaction forgets everything kept.

A server that goes away (stopped, restarted, crashed) is waited for
(:mod:`ledger.postgres._faults`): a transaction that had not asked to
commit left nothing and runs again on a new connection, with a bounded,
jittered backoff between attempts, for at most :data:`RECONNECT_SECONDS`
in all; then the call raises :class:`~ledger.LedgerUnreachableError`. A
call lost while its commit was in flight raises
:class:`~ledger.OutcomeUnknownError` (unless it is idempotent, a read or
a lease renewal, and simply runs again): its outcome is found in the
ledger on recovery, never assumed. Every other psycopg error is raised as
the ledger's (:func:`~ledger.postgres._faults.ledger_error`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Final, Protocol, TypeVar

import anyio
import anyio.to_thread
import psycopg

from streams import StreamRef
from streams.store import ATTR

from .._committer import Answer, Batch, BatchTimer, BeforeCommit, GroupCommitter, ServesWrites, serving
from .._errors import LeaseLostError, LedgerClosedError, LedgerUnreachableError, OutcomeUnknownError
from ._alone import LazyTransaction, LedgerConnection
from ._faults import (
    CONFLICTS,
    ReconnectBackoff,
    ledger_error,
    reason,
    refused_for_good,
    server_gone,
    unreachable,
)
from ._pipelined import PipelinedTransaction, PipelineFailed
from ._schema import ensure_schema
from ._verify import verify_streams
from ._view import Kept, KeptStale, PgView

__all__ = [
    "Calls",
    "PgConnection",
    "connect",
    "connected",
    "database_name",
    "describe_url",
    "set_default_isolation",
]


class Calls(Protocol):
    """What the stores of a PostgreSQL ledger make their calls through: its connection, maybe fenced."""

    @property
    def where(self) -> str: ...

    async def call(
        self, op: Callable[[PgView], T], *, buffered: bool = True, idempotent: bool = False
    ) -> T: ...

    async def read(self, op: Callable[[PgView], T]) -> T: ...


T = TypeVar("T")

#: How often a call is run again after PostgreSQL aborted it for a conflict with another worker's.
MAX_CONFLICT_RETRIES: Final = 100
#: How many streams a connection keeps between calls (:class:`PgView`); past it, it starts over.
MAX_KEPT_STREAMS: Final = 10_000
#: How long a ledger keeps trying to reach its server again once it went away, before its calls
#: raise :class:`~ledger.LedgerUnreachableError` (``open_postgres(url, reconnect_seconds=...)``).
RECONNECT_SECONDS: Final = 30.0


def describe_url(url: str) -> str:
    """``url`` as error messages name it: database and host, never a password."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "a PostgreSQL ledger (its URL does not parse)"
    host = params.get("host") or "localhost"
    return f"the PostgreSQL ledger {params.get('dbname') or '(default database)'} on {host}"


def database_name(url: str) -> str:
    """The name of ``url``'s database, as the ledger's metrics name it."""
    try:
        return str(psycopg.conninfo.conninfo_to_dict(url).get("dbname") or "postgres")
    except psycopg.ProgrammingError:
        return "postgres"


def connect(url: str) -> Any:
    """An autocommit connection to ``url``, one attempt; one that fails is :class:`LedgerUnreachableError`."""
    try:
        return LedgerConnection.connect(url, autocommit=True)
    except psycopg.Error as exc:
        raise unreachable(exc, describe_url(url)) from None


class _Outage:
    """Since when the server is away, how often it was tried, and whether a call gave up waiting."""

    __slots__ = ("attempts", "began", "gave_up")

    def __init__(self, began: float) -> None:
        self.began = began
        self.attempts = 0
        self.gave_up = False  # the next call tries once, not for the whole time again


class _Gone(Exception):
    """The server went away, or cannot be reached yet: the transaction left nothing; try a new connection."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Call:
    """One hook call waiting for, or done by, a group commit."""

    __slots__ = ("done", "error", "idempotent", "op", "result", "savepoint")

    def __init__(self, op: Callable[[PgView], Any], savepoint: bool, idempotent: bool = False) -> None:
        self.op = op
        self.savepoint = savepoint  # it may write before it raises: run it in a savepoint of its own
        # running it twice is running it once (a read, a renewal): a lost commit runs it again; and it
        # reads every record afresh, as a read of kept ones would check each of them for nothing
        self.idempotent = idempotent
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


#: How long the server lets a transaction of this connection sit idle before it ends the session.
#: A transaction here runs its statements back to back and commits at once, so only a process that
#: stopped inside one (SIGSTOP, a debugger, a frozen VM) is ever idle in it; ending its session
#: releases its row locks, so another worker can take its runs over once their leases run out (the
#: stopped one, resumed, finds its connection gone and its lease lost).
IDLE_IN_TRANSACTION_SECONDS = 5
#: How long a statement of this connection waits for a row lock (or the schema lock) another
#: session holds before it gives up; the transaction is then run again as a conflict is. Locks here
#: are held for one short transaction, so a longer wait means the holder stopped: no statement waits
#: on it past a lease, and a takeover goes on as soon as the server ended the stopped session.
LOCK_TIMEOUT_SECONDS = 1
#: How long one statement may run: well past any of the ledger's own, short of holding a run's rows
#: for ever if the server got stuck. A statement cancelled so is :class:`~ledger.LedgerServerError`.
STATEMENT_TIMEOUT_SECONDS = 30

#: The session settings the ledger's connections make, where the URL (or the server's or role's
#: configuration) did not set them: each keeps a value set anywhere but PostgreSQL's defaults.
SESSION_TIMEOUTS: Final = {
    "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_SECONDS}s",
    "lock_timeout": f"{LOCK_TIMEOUT_SECONDS}s",
    "statement_timeout": f"{STATEMENT_TIMEOUT_SECONDS}s",
}


def _set_session_timeouts(conn: Any) -> None:
    conn.execute(
        "SELECT set_config(s.name, t.value, false) FROM pg_settings s"
        " JOIN unnest(%s::text[], %s::text[]) AS t(name, value) ON s.name = t.name"
        " WHERE s.source = 'default'",
        (list(SESSION_TIMEOUTS), list(SESSION_TIMEOUTS.values())),
    ).fetchall()


def set_default_isolation(conn: Any, level: psycopg.IsolationLevel) -> None:
    """Make ``level`` the session's default isolation (past its checks of the schema).

    A statement sent alone (autocommit: :mod:`ledger.postgres._alone`) runs
    at ``level``, as the transactions psycopg begins do: at the server's
    default, read committed, a lone write whose row another transaction
    changed after the statement began would wait for it, then overwrite its
    change (its check of kept records read the snapshot before). At
    ``level`` it fails instead, and runs again from records read afresh.
    """
    conn.execute(
        "SELECT set_config('default_transaction_isolation', %s, false)",
        (level.name.replace("_", " ").lower(),),
    ).fetchall()


class PgConnection(ServesWrites["_Call"]):
    """A ledger's connection, and its group commit.

    Calls made while a transaction is in flight wait and then share the next
    one (:mod:`ledger._committer`): each runs in a savepoint of its own, so a
    call its rules refuse leaves nothing and fails alone, and one COMMIT (one
    WAL flush) confirms the others together. The transactions run on the
    committer's writer thread, and reads in worker threads, so the event loop
    never waits on the server (nor on a server that went away).
    """

    #: Transactions committed by every connection of this process: what an idle member or worker
    #: costs, for benchmarks and tests.
    committed_in_process: ClassVar[int] = 0

    def __init__(
        self,
        url: str,
        *,
        reconnect_seconds: float = RECONNECT_SECONDS,
        isolation: psycopg.IsolationLevel = psycopg.IsolationLevel.SERIALIZABLE,
    ) -> None:
        if reconnect_seconds < 0:
            raise ValueError("reconnect_seconds must not be negative")
        self.url = url
        #: The ledger's records are written in serializable transactions; a connection that only
        #: reads them, or writes the group members' rows (each statement one row's), needs less.
        self.isolation = isolation
        self.where = describe_url(url)
        self.reconnect_seconds = reconnect_seconds
        self._conn: Any = None
        self._using = threading.Lock()  # the connection is used by one batch, or one read, at a time
        self._closing = threading.Event()  # set by close: a wait for the server stops at once
        self._outage: _Outage | None = None  # the server is away since, and tried so often
        self._ids: dict[StreamRef, int] = {}
        #: Streams as this connection's last calls confirmed them (their descriptors and frontiers),
        #: used instead of reading them again and checked by each write (:class:`PgView`); forgotten
        #: whenever a transaction fails (but one a call's refused write failed: :class:`_WriteRefused`),
        #: and once there are too many.
        self._kept: dict[StreamRef, Kept] = {}
        #: What the open transaction's calls changed in ``_kept``, each ref with what it kept before
        #: (None: nothing), to undo if the transaction rolls back; None once it forgot them all.
        self._kept_undo: list[tuple[StreamRef, Kept | None]] | None = []
        self._committer = None  # while serving
        #: Transactions committed and the calls they confirmed, for benchmarks and tests.
        self.transactions = 0
        self.calls = 0
        #: Connections made after the first, once the server went away, for tests.
        self.reconnects = 0
        #: Called on the writer thread after each batch with ``time.perf_counter()`` readings: when the
        #: loop handed it over, when the writer thread began it and when it was committed (bench).
        self.batch_timer: BatchTimer | None = None

    def connect(self) -> None:
        """Connect (blocking) and check or make the schema, waiting for a server that is away."""
        self._closing.clear()
        self._persist(lambda: None)

    def close(self) -> None:
        self._closing.set()
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def _open(self) -> None:
        """One attempt at a connection with its session settings and a checked (or made) schema."""
        try:
            conn = LedgerConnection.connect(self.url, autocommit=True)
        except psycopg.Error as exc:
            if refused_for_good(exc):
                raise unreachable(exc, self.where) from None
            raise _Gone(exc) from None
        try:
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE  # the checks read one snapshot
            _set_session_timeouts(conn)
            ensure_schema(conn, self.where)  # checks, or makes: running it again is harmless
            verify_streams(conn, self.where)
            conn.isolation_level = self.isolation
            set_default_isolation(conn, self.isolation)
        except psycopg.Error as exc:
            gone = server_gone(exc, conn) or isinstance(exc, CONFLICTS)  # the schema lock's holder stopped
            conn.close()
            if gone:
                raise _Gone(exc) from None
            raise ledger_error(exc, self.where) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _persist(self, attempt: Callable[[], None]) -> None:
        """Run ``attempt`` on a connection, a new one each time the server went away, until the time is up."""
        backoff: ReconnectBackoff | None = None
        while True:
            try:
                if self._conn is None or self._conn.broken:
                    self._drop()
                    self._open()
                    if backoff is not None:
                        self.reconnects += 1
                attempt()
            except _Gone as gone:
                self._drop()
                if self._outage is None:
                    self._outage = _Outage(time.monotonic())
                self._outage.attempts += 1
                if backoff is None:  # once it gave up, a call tries once, not for the whole time again
                    backoff = ReconnectBackoff(
                        0.0 if self._outage.gave_up else self.reconnect_seconds, stop=self._closing
                    )
                if not backoff.wait():
                    self._outage.gave_up = True
                    waited = time.monotonic() - self._outage.began
                    raise LedgerUnreachableError(
                        f"{self.where} cannot be reached: {reason(gone.error)}; gave up after "
                        f"{self._outage.attempts} attempt(s) in {waited:.1f} s. "
                        "Nothing unconfirmed was kept: start the server and run the command again, it "
                        "resumes from what the ledger confirmed"
                    ) from None
                continue
            self._outage = None
            return

    async def call(self, op: Callable[[PgView], T], *, buffered: bool = True, idempotent: bool = False) -> T:
        """Run ``op`` over a view of the next transaction; return once it committed.

        ``buffered`` says that ``op`` writes only through its view, which
        writes at its end: one that raises wrote nothing, so it needs no
        savepoint. Others (the node hooks) run in a savepoint.
        ``idempotent`` says that running ``op`` twice is running it once (a
        read, a lease renewal): one whose commit was lost with the server
        runs again, instead of raising :class:`~ledger.OutcomeUnknownError`.

        The calls share transactions as every ledger's writes do
        (:mod:`ledger._committer`): those made in one step of the event loop
        leave together, and a call cancelled before its transaction began is
        never run.
        """
        committer = self._committer
        if committer is None:
            raise LedgerClosedError(
                f"{self.where} is not serving writes; open it with `async with open_postgres(...)`"
            )
        result: T = await committer.write(_Call(op, savepoint=not buffered, idempotent=idempotent))
        return result

    def _new_committer(self, before_commit: BeforeCommit | None) -> GroupCommitter[_Call]:
        """The committer :meth:`serve` runs: one serializable transaction a batch, on its writer thread."""
        return GroupCommitter(
            self._commit,
            where=self.where,
            attributes={ATTR.LEDGER: database_name(self.url)},
            timer=lambda: self.batch_timer,
            before_commit=before_commit,
        )

    def _commit(self, batch: Batch[_Call]) -> Answer:
        """The committer's writer thread: one transaction for the batch's calls, each answered."""
        calls = batch.writes
        self._run_batch(calls)
        return Answer([(True, call.result) if call.error is None else (False, call.error) for call in calls])

    async def read(self, op: Callable[[PgView], T]) -> T:
        """Run ``op`` in a transaction of its own, in a worker thread: the event loop never waits on it.

        It runs as soon as no batch holds the connection, beside the group
        commit's queue (a read needs no durable commit). Cancelled, it still
        runs to its end in its thread and its answer is dropped.
        """
        call = _Call(op, savepoint=False, idempotent=True)
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
        for call in batch:  # a psycopg error never leaves the ledger
            if call.error is not None:
                call.error = ledger_error(call.error, self.where)

    def _transaction(self, batch: list[_Call]) -> None:
        """Run the calls of ``batch`` not done yet, on a new connection each time the server went away."""
        self._persist(lambda: self._attempt([call for call in batch if not call.done]))

    def _attempt(self, batch: list[_Call]) -> None:
        if not batch:
            return
        conn = self._conn
        shared = len(batch) > 1
        # calls that share a transaction send BEGIN, their writes and COMMIT in one pipeline, unless
        # one of them needs a savepoint (which an aborted pipeline cannot roll back to)
        pipelined = shared and not any(call.savepoint for call in batch)
        use_kept = True
        for attempt in range(MAX_CONFLICT_RETRIES + 1):
            outcomes: list[tuple[_Call, Any, BaseException | None, dict[StreamRef, int]]] = []
            committing = False
            # a call alone in its batch begins its transaction with its first statement but its write:
            # one whose only statement is its write (its streams kept) sends that alone, one round trip
            lazy = None if shared else LazyTransaction(conn)
            block: Any = lazy
            if lazy is None:
                block = PipelinedTransaction(conn) if pipelined else conn.transaction()
            self._kept_undo = []
            try:
                try:
                    with block:
                        for call in batch:
                            outcomes.append(self._one(conn, call, shared, use_kept))
                        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                            # the server aborted the transaction: its COMMIT would be a silent ROLLBACK
                            raise _WriteRefused
                        committing = True  # the block's end sends COMMIT
                except (_WriteRefused, PipelineFailed):
                    self._undo_kept()  # nothing they kept was changed: what was kept before holds
                    raise
                except BaseException:
                    self._kept.clear()  # the calls' kept streams were never committed, or went stale
                    raise
            except KeptStale:  # another process wrote a stream this one kept: read it again
                use_kept = False  # a transaction run again reads every record afresh
                continue
            except PipelineFailed:  # again, a statement at a time: each failure is then its call's
                pipelined = False
                continue
            except CONFLICTS:
                if attempt == MAX_CONFLICT_RETRIES:
                    raise
                use_kept = False
                # a little apart, so two workers that keep colliding stop doing so in step
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
                continue
            except _WriteRefused as refused:
                if refused.lease_lost is not None:  # that call's outcome: it is not run again
                    refused.lease_lost[0].error, refused.lease_lost[0].done = refused.lease_lost[1], True
                for call in batch:  # one call's writes failed and aborted the others': each on its own
                    try:
                        self._transaction([call])
                    except Exception as exc:
                        call.error, call.done = exc, True
                return
            except psycopg.Error as exc:
                if not server_gone(exc, conn):
                    raise
                # it may have landed (a write that went alone is its own commit): only a call that may
                # run twice runs again
                if committing or (lazy is not None and lazy.wrote_alone):
                    for call in batch:
                        if not call.idempotent:
                            call.error, call.done = self._outcome_unknown(exc), True
                raise _Gone(exc) from None
            self.transactions += 1
            PgConnection.committed_in_process += 1
            self.calls += len(batch)
            for call, result, error, ids in outcomes:
                if error is None:
                    self._ids.update(ids)
                call.result, call.error, call.done = result, error, True
            return
        raise AssertionError("not reached: the last attempt's conflict is raised")

    def _outcome_unknown(self, exc: BaseException) -> OutcomeUnknownError:
        return OutcomeUnknownError(
            f"{self.where} went away while a commit was in flight ({reason(exc)}): whether it "
            "landed is unknown; the ledger holds the answer, resume the run to read it"
        )

    def _one(
        self, conn: Any, call: _Call, shared: bool, use_kept: bool
    ) -> tuple[_Call, Any, BaseException | None, dict[StreamRef, int]]:
        """Run one call of a transaction; an error of its own is its outcome, unless it must abort all.

        A call that used streams kept from earlier calls and raised is not
        believed: its kept records may be what made it fail, so the
        transaction runs again from records read afresh (:class:`KeptStale`).
        """
        # a read uses no kept record: another connection of the process (the one its commits go
        # through) may have changed them since, and a read that found them stale would run again
        view = PgView(conn, self._ids, self._kept if use_kept and not call.idempotent else None)
        try:
            outcome = self._run_one(conn, call, shared, view)
        except (KeptStale, LeaseLostError, _LeaseRefused, PipelineFailed, *CONFLICTS):
            raise  # a lease lost: whatever it kept
        except Exception as exc:
            if view.used_kept and not server_gone(exc, conn):
                raise KeptStale from exc
            raise
        finally:
            conn.pending_check = None  # a fenced call's lease check never outlives it
        if outcome[2] is not None and view.used_kept:
            raise KeptStale from outcome[2]
        if outcome[2] is None:
            self._keep(view)
        return outcome

    def _keep(self, view: PgView) -> None:
        """Keep the streams ``view`` confirmed, for the next calls (the transaction's next ones too)."""
        kept, forgotten = view.keep()
        before, undo = self._kept, self._kept_undo
        if undo is not None:
            undo.extend((ref, before.get(ref)) for ref in (*forgotten, *kept))
        for ref in forgotten:
            before.pop(ref, None)
        if len(before) + len(kept) > MAX_KEPT_STREAMS:
            before.clear()
            self._kept_undo = None
        before.update(kept)

    def _undo_kept(self) -> None:
        """Keep again what the rolled-back transaction's calls changed of the kept streams."""
        undo, self._kept_undo = self._kept_undo, []
        if undo is None:
            self._kept.clear()
            return
        for ref, was in reversed(undo):
            if was is None:
                self._kept.pop(ref, None)
            else:
                self._kept[ref] = was

    def _run_one(
        self, conn: Any, call: _Call, shared: bool, view: PgView
    ) -> tuple[_Call, Any, BaseException | None, dict[StreamRef, int]]:
        if not shared:  # alone in its transaction: whatever it raises rolls the transaction back
            result = call.op(view)
            view.flush()
            return call, result, None, view.ids
        if call.savepoint:
            try:
                with conn.transaction():
                    result = call.op(view)
                    view.flush()
            except (KeptStale, *CONFLICTS):
                raise
            except Exception as exc:  # its savepoint left nothing
                if server_gone(exc, conn):
                    raise
                return call, None, exc, {}
            return call, result, None, view.ids
        try:
            result = call.op(view)
        except CONFLICTS:
            raise
        except psycopg.Error as exc:  # the server failed a read: it aborted the whole transaction
            if server_gone(exc, conn):
                raise
            if conn.deferred:  # or an earlier call's queued write did, and its failure came back here
                raise PipelineFailed(str(exc)) from exc
            raise _WriteRefused from exc
        except Exception as exc:  # refused by the rules before it wrote anything
            return call, None, exc, {}
        try:
            view.flush()
        except (KeptStale, *CONFLICTS):
            raise
        except LeaseLostError as exc:  # its write checked its lease, and aborted the transaction
            raise _LeaseRefused(call, exc) from exc
        except Exception as exc:  # the server refused a write: the transaction is aborted
            if server_gone(exc, conn):
                raise
            if conn.deferred:  # maybe an earlier call's queued write: whose is told a statement at a time
                raise PipelineFailed(str(exc)) from exc
            raise _WriteRefused from exc
        return call, result, None, view.ids


class _WriteRefused(Exception):
    """A shared transaction's write failed: run its calls again, each in a transaction of its own."""

    #: The call whose write found its lease lost, and the error that is its outcome.
    lease_lost: tuple[_Call, LeaseLostError] | None = None


class _LeaseRefused(_WriteRefused):
    """A shared transaction's write found its call's lease lost: the others run again, each alone."""

    def __init__(self, call: _Call, error: LeaseLostError) -> None:
        super().__init__(str(error))
        self.lease_lost = (call, error)


@asynccontextmanager
async def connected(connection: PgConnection) -> AsyncIterator[PgConnection]:
    """``connection`` connected (in a thread: the event loop never waits on the server) and serving
    its calls for the block, then closed."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(connection.connect)
    try:
        async with serving(connection):
            yield connection
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(connection.close)
