"""A shared transaction in pipeline mode: BEGIN, the calls' writes and COMMIT in one round trip.

Calls that share a transaction (:mod:`ledger._committer`) each write their
records in one statement that fetches nothing: it checks what it must
(kept records, a lease) by failing (:mod:`ledger.postgres._view`). So
nothing need wait for its answer before the next is sent. In psycopg's
pipeline mode a statement is queued, and a read that fetches sends the
queue before it; a batch whose calls read nothing (their streams kept)
leaves as BEGIN, its writes, COMMIT and one Sync: one round trip where
it took one a statement and two more.

A statement that fails aborts the pipeline: the server skips everything
after it up to the Sync, COMMIT too, so a failed write never commits with
the others. Its error comes back at the next fetch, a later call's read or
the COMMIT's Sync, not at the write that caused it; so a failure is told
by what it says, not by where it came back (:meth:`PipelinedTransaction.failed`),
and one that names no call (a lease lost, a refused row) makes the batch
run again as it did before pipelines, a statement at a time, where each
call meets its own outcome: the failure path pays, the batch that commits
does not.

A call that writes before it may raise (a node hook: ``buffered=False``)
needs a savepoint to roll back to, which an aborted pipeline cannot reach:
a batch with one runs as before (``conn.transaction()``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import psycopg

from ._faults import CONFLICTS, server_gone
from ._view import KeptStale, kept_stale

__all__ = ["PipelineFailed", "PipelinedTransaction"]


class PipelineFailed(Exception):
    """A statement of the pipeline failed, and which call's is not known: run the batch again with its
    statements sent one at a time, where each failure is its own call's, and what they kept as before."""


class PipelinedTransaction:
    """BEGIN on entry; COMMIT and the Sync on a clean exit; on any other, the transaction rolled back.

    A failure the exit finds is raised as the shared transaction's
    outcomes are: :class:`KeptStale` (run again from records read afresh),
    a conflict (run again), the server gone (as it is), anything else
    :class:`PipelineFailed`.
    """

    __slots__ = ("_conn", "_pipeline")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._pipeline: Any = None

    @property
    def connection(self) -> Any:
        """The connection the transaction runs on (as psycopg's ``Transaction.connection``)."""
        return self._conn

    def __enter__(self) -> PipelinedTransaction:
        self._pipeline = self._conn.pipeline()
        self._pipeline.__enter__()
        self._conn.deferred = True
        try:
            self._conn.execute("BEGIN")  # queued: it leaves with the first statement that must
        except BaseException:
            self._end(failed=True)
            raise
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> Literal[False]:
        if error is not None:
            self._end(failed=True)
            return False
        try:
            try:
                # queuing it may fetch an earlier statement's failure: the pipeline still ends
                self._conn.execute("COMMIT")
            except BaseException:
                self._end(failed=True)
                raise
            self._end(failed=False)  # the Sync: every queued statement, COMMIT last, in one flight
        except psycopg.Error as exc:
            failure = self.failed(exc)
            if failure is exc:  # raised as it is: never an error caused by itself
                raise
            raise failure from exc
        return False

    def failed(self, exc: psycopg.Error) -> BaseException:
        """What the transaction's failure ``exc`` (back at a fetch or the Sync) means for its calls."""
        if server_gone(exc, self._conn) or isinstance(exc, CONFLICTS):
            return exc
        if kept_stale(exc):
            return KeptStale()
        return PipelineFailed(str(exc))

    def _end(self, *, failed: bool) -> None:
        """Leave pipeline mode (the Sync); after a failure, roll back whatever the server still holds."""
        pipeline, self._pipeline = self._pipeline, None
        self._conn.deferred = False
        try:
            pipeline.__exit__(None, None, None)
        except psycopg.Error:
            if not failed:  # a failure of the statements themselves: the caller tells it
                self._rollback()
                raise
        if failed:
            self._rollback()

    def _rollback(self) -> None:
        conn = self._conn
        if conn.broken or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            return
        with contextlib.suppress(psycopg.Error):  # the server went away: the transaction went with it
            conn.execute("ROLLBACK")
