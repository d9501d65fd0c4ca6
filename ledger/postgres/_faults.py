"""What a psycopg error means to the ledger, and how long a lost server is waited for.

Every psycopg error is one of four things, and only the first two are ever
handled here rather than raised:

- the server went away (stopped, restarted, crashed, ended this session):
  the connection is broken, and a transaction it had not asked to commit
  left nothing, so it is run again once a new connection is made, with
  :class:`ReconnectBackoff` between attempts, up to a bounded total time; one lost
  while its ``COMMIT`` was in flight may have landed or not
  (:class:`~ledger.OutcomeUnknownError`);
- a conflict with another worker's transaction (a serialization failure, a
  deadlock, a lock wait past ``lock_timeout``): it left nothing, and is run
  again at once;
- the server cannot be connected to, or refuses to be
  (:class:`~ledger.LedgerUnreachableError`): a server starting up or going
  down is tried again like a lost one, a refusal (no such database or
  role, failed authentication) is not;
- anything else the server failed (a full disk, a statement timeout, ...)
  is :class:`~ledger.LedgerServerError`, naming the SQLSTATE and never a
  record's values.

Library users catch the ledger's errors; a psycopg exception never leaves
the PostgreSQL ledger.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors

from .._errors import LedgerConflictError, LedgerError, LedgerServerError, LedgerUnreachableError

__all__ = [
    "CONFLICTS",
    "ReconnectBackoff",
    "find_cause",
    "ledger_error",
    "reason",
    "refused_for_good",
    "server_gone",
    "translated",
    "unreachable",
]

E = TypeVar("E", bound=BaseException)

#: Errors of a transaction that another worker's transaction beat: it left nothing; run it again.
CONFLICTS: Final = (errors.SerializationFailure, errors.DeadlockDetected, errors.LockNotAvailable)

#: SQLSTATEs the server sends as it ends a session: shutdown, crash, a session timeout, starting up.
_GOING_AWAY: Final = frozenset(("57P01", "57P02", "57P03", "57P05", "25P03"))

#: What a server that refuses for good says (it is up, and will say so again): no such database or
#: role, failed authentication, no pg_hba.conf entry. Other connection failures are tried again.
_REFUSALS: Final = (
    "does not exist",
    "authentication failed",
    "pg_hba.conf",
    "permission denied",
    "password",
    "not permitted to log in",
    "invalid",
    "unrecognized",
)


def find_cause(exc: BaseException, kind: type[E]) -> E | None:
    """The first ``kind`` in ``exc``, its causes, contexts and (for a group) members; None if none is.

    Each exception is looked at once: the graph of causes and contexts can
    have cycles (an error raised out of the group holding it has that group
    as its context, as :func:`streams.store.single_error` makes), which a
    plain recursive walk would follow until ``RecursionError``.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(reversed(current.exceptions))
        for linked in (current.__context__, current.__cause__):
            if linked is not None:
                todo.append(linked)
    return None


def server_gone(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc``, raised by a statement on ``conn``, says the server or the connection went away."""
    if not isinstance(exc, psycopg.Error):
        return False
    if conn is not None and conn.broken:
        return True
    state = exc.sqlstate or ""
    return state in _GOING_AWAY or state.startswith("08")


def reason(exc: BaseException) -> str:
    """Why a connection failed, in libpq's words, on one line: ``Connection refused (Is the server ...)``.

    libpq names the server's address before its reason, and hints on the
    lines after; the URL (and its password) is never part of it.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0].rsplit("failed: ", 1)[-1].removeprefix("FATAL:").strip()
    return f"{first} ({' '.join(lines[1:])})" if lines[1:] else first


def refused_for_good(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt is the server's refusal, which trying again cannot change."""
    if isinstance(exc, psycopg.ProgrammingError):  # a URL libpq cannot parse
        return True
    text = str(exc).lower()
    if "no password supplied" in text:  # libpq's own: the server asked for one the URL does not give
        return True
    if "fatal:" not in text:  # no server answered: it is down, restarting, or not there yet
        return False
    told = text.rsplit("fatal:", 1)[1]
    return any(refusal in told for refusal in _REFUSALS)


def unreachable(exc: psycopg.Error, where: str) -> LedgerUnreachableError:
    """A failed connection attempt as the ledger's error."""
    if isinstance(exc, psycopg.ProgrammingError):
        return LedgerUnreachableError(f"{where}: the URL does not parse ({reason(exc)})")
    return LedgerUnreachableError(f"{where} cannot be reached: {reason(exc)}")


def ledger_error(exc: BaseException, where: str) -> BaseException:
    """``exc`` as the ledger raises it: a psycopg error becomes a :class:`LedgerError` (caused by it)."""
    if not isinstance(exc, psycopg.Error):
        return exc
    mapped = _mapped(exc, where)
    mapped.__cause__ = exc
    return mapped


def _mapped(exc: psycopg.Error, where: str) -> LedgerError:
    state = exc.sqlstate
    said = f"{exc.diag.message_primary or reason(exc)} (SQLSTATE {state})" if state else reason(exc)
    if isinstance(exc, CONFLICTS):
        return LedgerConflictError(
            f"{where}: a transaction kept conflicting with other workers' and was given up: {said}; "
            "nothing of it was confirmed, run the command again"
        )
    if state in _GOING_AWAY or (state or "").startswith("08"):
        return LedgerUnreachableError(f"{where} went away: {said}")
    if state is None and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return LedgerUnreachableError(f"{where}: the connection was lost: {said}")
    if state == "53100":
        return LedgerServerError(
            f"{where}: the server's disk is full ({said}); nothing of the failed call was confirmed: "
            "free space on the server and run the command again"
        )
    if state == "57014":
        return LedgerServerError(f"{where}: a statement ran out of time ({said}); nothing was confirmed")
    return LedgerServerError(f"{where}: the server failed a statement: {said}; nothing of it was confirmed")


@contextmanager
def translated(where: str) -> Iterator[None]:
    """Raise any psycopg error of the block as the ledger's error (:func:`ledger_error`)."""
    try:
        yield
    except psycopg.Error as exc:
        raise ledger_error(exc, where) from exc


class ReconnectBackoff:
    """Waits between attempts to reach a server that went away: bounded, jittered, for a bounded total.

    The n-th wait is a random time between half and all of ``first * 2**n``,
    at most ``longest``: workers that lost one server do not come back in
    step. :meth:`wait` returns False, without waiting, once ``total`` seconds
    passed since the first failure: the caller gives up then. ``stop`` (an
    event) cuts a wait short, as closing the connection does.
    """

    def __init__(
        self,
        total: float,
        *,
        first: float = 0.05,
        longest: float = 2.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.deadline = time.monotonic() + total
        self._next = first
        self._longest = longest
        self._stop = stop or threading.Event()
        self.attempts = 0

    def wait(self) -> bool:
        """Wait before the next attempt; False (at once) if the time is up or the wait was stopped."""
        left = self.deadline - time.monotonic()
        if left <= 0 or self._stop.is_set():
            return False
        pause = min(left, random.uniform(self._next / 2, self._next))
        self._next = min(self._longest, self._next * 2)
        self.attempts += 1
        return not self._stop.wait(pause)
