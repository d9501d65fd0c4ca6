"""A call whose only statement is its write sends it alone: a transaction of its own, one round trip.

A call of the ledger is one transaction: BEGIN, its statements, COMMIT. A
call whose streams the connection kept reads nothing (:mod:`ledger.postgres._view`)
and writes all of its records in one statement, which checks the kept
records it used and fails if any is stale: such a statement is a whole
transaction by itself, and BEGIN and COMMIT around it would cost two more
round trips for nothing. So a call alone in its batch runs in a
:class:`LazyTransaction`: its first statement but its write begins the
transaction, as ``conn.transaction()`` would have; a write sent before any
other statement goes alone, in autocommit, and is the call's commit. A link
lost while it is in flight is then a lost commit, told as one
(:class:`~ledger.OutcomeUnknownError`), as a lost COMMIT is.

A fenced call (one made under a lease) checks its lease before its first
statement, so that whatever it locks it locks under the lease; unless that
first statement is its write, which then checks the lease itself
(:class:`~ledger.postgres._view.StatementFence`), alone or in a shared
transaction: the check costs no statement (:attr:`LedgerConnection.pending_check`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

__all__ = ["LazyTransaction", "LedgerConnection"]


class LedgerConnection(psycopg.Connection[Any]):
    """The ledger's psycopg connection: its statements can begin a :class:`LazyTransaction`."""

    #: The transaction its next statements belong to, begun by the first (:class:`LazyTransaction`).
    lazy: LazyTransaction | None = None
    #: The lease check of the fenced call being run, not made yet: made before the call's first
    #: statement, unless that statement is its write, which checks the lease itself
    #: (:meth:`write_checks_lease`). Cleared when the call ends.
    pending_check: Callable[[], None] | None = None
    #: Statements are queued in a shared pipeline (:mod:`ledger.postgres._pipelined`): a failure comes
    #: back at a later fetch, and may be another call's.
    deferred: bool = False

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        self._before_statement()
        return super().cursor(*args, **kwargs)

    @contextmanager
    def pipeline(self) -> Iterator[psycopg.Pipeline]:
        self._before_statement()
        with super().pipeline() as pipeline:
            yield pipeline

    def _before_statement(self) -> None:
        if self.lazy is not None:
            self.lazy.statement()  # the first begins its transaction
        check, self.pending_check = self.pending_check, None
        if check is not None:  # a fenced call's first statement: its lease is checked first
            check()

    def write_checks_lease(self) -> bool:
        """Whether the write about to be sent is its fenced call's first statement; it then checks the
        call's lease itself, and the check the call had pending is not made."""
        if self.pending_check is None:
            return False
        self.pending_check = None
        return True

    def write_alone(self) -> bool:
        """Whether the statement about to be sent may go alone, a transaction of its own: it is the
        only one of its :class:`LazyTransaction` (which then never begins). Nothing may follow it."""
        return self.lazy is not None and self.lazy.alone()


class LazyTransaction:
    """A transaction of ``conn`` begun by its first statement, or never, if its only one went alone.

    Any statement sent before the write begins the transaction, and then the
    write, and what follows, belong to it. A statement after a write that
    went alone is refused: it could not be part of it.
    """

    __slots__ = ("_conn", "_state", "_transaction")

    def __init__(self, conn: LedgerConnection) -> None:
        self._conn = conn
        self._transaction: Any = None
        self._state = "waiting"  # then "begun", or "alone" (its statement next) and "sent"

    @property
    def waiting(self) -> bool:
        """Nothing was sent yet: the next statement begins the transaction, or goes alone."""
        return self._state == "waiting"

    @property
    def wrote_alone(self) -> bool:
        """The write went alone: it committed, or failed, by itself (its outcome is its commit's)."""
        return self._state in ("alone", "sent")

    def statement(self) -> None:
        """A statement is about to be sent: the first begins the transaction."""
        state = self._state
        if state == "waiting":
            self._state = "begun"
            self._transaction = self._conn.transaction()
            self._transaction.__enter__()
        elif state == "alone":
            self._state = "sent"
        elif state == "sent":
            raise RuntimeError("a statement after a write that went alone cannot belong to its transaction")

    def alone(self) -> bool:
        """Let the next statement go alone, if no other was sent (:meth:`LedgerConnection.write_alone`)."""
        if self._state != "waiting":
            return False
        self._state = "alone"
        return True

    def __enter__(self) -> LazyTransaction:
        self._conn.lazy = self
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        self._conn.lazy = None
        if self._transaction is None:
            return False
        return bool(self._transaction.__exit__(kind, error, traceback))
