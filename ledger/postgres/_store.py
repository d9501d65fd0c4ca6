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

import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

import anyio
import psycopg
from psycopg import errors

from streams.store import StreamRef

from ._schema import ensure_schema
from ._view import PgView

__all__ = ["PgConnection", "describe_url"]

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


class PgConnection:
    """A ledger's connection: calls run one at a time, in a worker thread, each in a transaction."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = describe_url(url)
        self._conn: Any = None
        self._lock = anyio.Lock()
        self._using = threading.Lock()  # the connection is used by one call, or one read, at a time
        self._ids: dict[StreamRef, int] = {}

    def connect(self) -> None:
        """Connect (blocking) and check or make the schema."""
        conn = psycopg.connect(self.url, autocommit=True)
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        try:
            ensure_schema(conn, self.where)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def call(self, op: Callable[[PgView], T]) -> T:
        """Run ``op`` over a view of one transaction; commit it if ``op`` returned.

        Once started, a call runs to its end even if the caller is cancelled
        (as every store's calls do).
        """
        async with self._lock:
            return await anyio.to_thread.run_sync(self._run, op)

    def read(self, op: Callable[[PgView], T]) -> T:
        """Run ``op`` now, on this thread, in a transaction of its own (a read, or a call of tests)."""
        return self._run(op)

    def _run(self, op: Callable[[PgView], T]) -> T:
        with self._using:
            return self._transaction(op)

    def _transaction(self, op: Callable[[PgView], T]) -> T:
        if self._conn is None or self._conn.broken:
            self.close()
            self.connect()  # a connection lost before: its last call's outcome is in the ledger
        conn = self._conn
        for attempt in range(MAX_CONFLICT_RETRIES + 1):
            view = PgView(conn, self._ids)
            try:
                with conn.transaction():
                    result = op(view)
                    view.flush()
            except _CONFLICTS:
                if attempt == MAX_CONFLICT_RETRIES:
                    raise
                continue
            if view.ids:
                self._ids.update(view.ids)
            return result
        raise AssertionError("unreachable")
