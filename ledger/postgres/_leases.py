"""Run leases: one worker owns a run at a time, and a worker that lost its lease can confirm nothing.

A lease is a row of ``streamledger_leases``: the run, its owner, a token
and an expiry. A worker claims a run that is due (running, with no lease or
an expired one); each claim raises the token. The owner renews it well
before it expires. Every write a worker makes for a leased run reads its
lease row ``FOR SHARE`` in the same transaction, before or in its first
statement, and refuses to go on unless the token is still its own
(:class:`LeaseLostError`): a worker that
was paused or cut off past its expiry, a zombie, can never commit after
another took the run over. A takeover that races a write is serialized by
the row lock: the write commits first, or sees the new token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, Protocol, TypeVar

import msgspec

from .._errors import LeaseLostError
from ._notify import CHANNEL, RUNS
from ._store import IDLE_IN_TRANSACTION_SECONDS, PgConnection
from ._view import PgView, StatementFence

__all__ = [
    "STUCK_ON_ITS_CLIENT",
    "Fence",
    "FencedConnection",
    "Lease",
    "claim_due",
    "claim_run",
    "end_stuck_sessions",
    "held_or_lost",
    "lost_error",
    "release",
    "renew",
]

T = TypeVar("T")


class Lease(msgspec.Struct, frozen=True):
    """A worker's claim on a run: valid while the run's lease row holds this token."""

    run_id: str
    owner: str
    token: int

    def check(self, conn: Any) -> None:
        """Refuse to go on unless this lease still holds its run (locks the row until the transaction end)."""
        row = conn.execute(
            "SELECT owner, token FROM streamledger_leases WHERE run_id = %s FOR SHARE", (self.run_id,)
        ).fetchone()
        held_or_lost(row, self.token, self._lost)

    def lease_row(self) -> tuple[str, tuple[object, ...]]:
        """The lease's row for a write statement to check (:class:`~ledger.postgres._view.StatementFence`)."""
        return _RUN_LEASE_ROW, (self.run_id,)

    def lost(self, holder: tuple[str, int] | None) -> Exception:
        return lost_error(holder, self.token, self._lost)

    @property
    def _lost(self) -> str:
        return f"worker {self.owner!r} lost its lease on run {self.run_id!r}"


_RUN_LEASE_ROW: Final = "SELECT owner, token FROM streamledger_leases WHERE run_id = %b::text FOR SHARE"


def held_or_lost(row: Any, token: int, lost: str) -> None:
    """Raise :class:`~ledger.LeaseLostError` (``lost``, then who holds it) unless ``row`` holds ``token``.

    ``row`` is a lease row's ``(owner, token)``, or None if there is none.
    """
    if row is None or row[1] != token:
        raise lost_error(None if row is None else (row[0], row[1]), token, lost)


def lost_error(holder: tuple[str, int] | None, token: int, lost: str) -> LeaseLostError:
    """The error of a write refused for lease ``token`` (``lost`` says whose), ``holder`` holding it now."""
    who = "nobody" if holder is None else f"{holder[0]!r} (claim {holder[1]})"
    return LeaseLostError(f"{lost} (claim {token}); {who} holds it now: nothing was confirmed")


class Fence(StatementFence, Protocol):
    """A lease whose holder's every write checks it (a run's, or a group member's partition's).

    A fenced call checks the lease before its first statement, by
    :meth:`check`, so that whatever it locks it locks under the lease (a
    writer stopped inside it holds the lease's row, and a claim ends its
    session: :data:`STUCK_ON_ITS_CLIENT`). A call whose first statement is
    its write (its streams kept) checks the lease in that statement instead
    (:class:`~ledger.postgres._view.StatementFence`): alone, one round trip
    where BEGIN, the check, the write and COMMIT took four; in a transaction
    shared with other calls, one statement where it took two.
    """

    def check(self, conn: Any) -> None:
        """Raise :class:`~ledger.LeaseLostError` unless the lease still holds (in the write's transaction)."""
        ...


class FencedConnection:
    """A ledger connection whose every call checks a lease: the worker's on its run, or a member's."""

    def __init__(self, connection: PgConnection, lease: Fence) -> None:
        self._connection = connection
        self.lease = lease

    @property
    def where(self) -> str:
        return self._connection.where

    async def call(self, op: Callable[[PgView], T], *, buffered: bool = True, idempotent: bool = False) -> T:
        lease = self.lease

        def fenced(view: PgView) -> T:
            conn = view.connection
            if buffered and hasattr(conn, "pending_check"):
                # the call's first statement checks the lease first; its write checks it itself if
                # it is that first statement (one that goes alone, or in a shared transaction)
                view.fence_with(lease)
                conn.pending_check = partial(lease.check, conn)
            else:
                lease.check(conn)
            return op(view)

        return await self._connection.call(fenced, buffered=buffered, idempotent=idempotent)

    async def read(self, op: Callable[[PgView], T]) -> T:
        return await self._connection.read(op)


#: The session ``a`` (of ``pg_stat_activity``) has waited on its client inside a transaction for longer
#: than ``%(idle)s`` seconds, the server's own idle timeout, which did not end it, and this role may
#: end it. PostgreSQL arms that timeout only when it told the client it is ready for a query: not in
#: the middle of a pipeline (the session shows ``active``, waiting on ``ClientRead``), and not after
#: a Flush that followed the pipeline's Sync (as psycopg ends every pipeline; the Flush disarms it).
#: A process stopped there (SIGSTOP, a debugger, a frozen VM) would hold its row locks, and what
#: they fence, for as long as it is stopped.
STUCK_ON_ITS_CLIENT: Final = """a.state IN ('idle in transaction', 'active') AND a.wait_event = 'ClientRead'
  AND a.state_change < now() - make_interval(secs => %(idle)s)
  AND pg_has_role(a.usesysid, 'MEMBER')"""

#: Ends the session stuck (:data:`STUCK_ON_ITS_CLIENT`) in a transaction that holds the lease row of
#: a run whose lease ran out: the locking transaction is the one whose id is the row's ``xmax``, and
#: ending its session rolls it back, as the server's timeout would have.
_END_STUCK: Final = f"""
SELECT pg_terminate_backend(a.pid, 1000)
FROM streamledger_leases l JOIN pg_stat_activity a ON a.backend_xid = l.xmax
WHERE l.expires_at < now() AND {STUCK_ON_ITS_CLIENT}
"""


def end_stuck_sessions(conn: Any, idle_seconds: float = IDLE_IN_TRANSACTION_SECONDS) -> int:
    """End the sessions stuck holding the lease row of a run whose lease ran out; how many."""
    return len(conn.execute(_END_STUCK, {"idle": idle_seconds}).fetchall())


_CLAIM = """
WITH due AS (
    SELECT r.run_id FROM streamledger_runs r LEFT JOIN streamledger_leases l USING (run_id)
    WHERE r.status = 'running' AND (l.run_id IS NULL OR l.expires_at < now())
      AND (r.graph, r.version) IN (SELECT * FROM unnest(%(graphs)s::text[], %(versions)s::text[]))
    ORDER BY r.run_id
    LIMIT 1
    FOR UPDATE OF r SKIP LOCKED
)
INSERT INTO streamledger_leases (run_id, owner, token, expires_at)
SELECT run_id, %(owner)s, 1, now() + make_interval(secs => %(seconds)s) FROM due
ON CONFLICT (run_id) DO UPDATE
    SET owner = EXCLUDED.owner, token = streamledger_leases.token + 1, expires_at = EXCLUDED.expires_at
    WHERE streamledger_leases.expires_at < now()
RETURNING run_id, token
"""


def claim_due(conn: Any, owner: str, seconds: float, graphs: Sequence[tuple[str, str]]) -> Lease | None:
    """Claim one run that is due (running, not leased or its lease expired) of one of ``graphs``.

    ``graphs`` are the (name, version) pairs the worker can run; None if no run is due. A session
    stuck in a transaction holding an expired lease's row is ended first (:func:`end_stuck_sessions`):
    the run it holds is due, and would otherwise stay locked as long as its worker is stopped.
    """
    end_stuck_sessions(conn)
    params = {
        "owner": owner,
        "seconds": seconds,
        "graphs": [name for name, _ in graphs],
        "versions": [version for _, version in graphs],
    }
    row = conn.execute(_CLAIM, params).fetchone()
    return None if row is None else Lease(row[0], owner, row[1])


#: The seconds until the earliest lease of a running run of the graphs runs out (0 for a running run
#: with no lease: another worker is claiming it), None if no run of theirs is running.
_NEXT_DUE: Final = """
SELECT EXTRACT(EPOCH FROM min(COALESCE(l.expires_at, now())) - now())::float8
FROM streamledger_runs r LEFT JOIN streamledger_leases l USING (run_id)
WHERE r.status = 'running'
  AND (r.graph, r.version) IN (SELECT * FROM unnest(%(graphs)s::text[], %(versions)s::text[]))
"""


def next_due(conn: Any, graphs: Sequence[tuple[str, str]]) -> float | None:
    """How soon a run of ``graphs`` that is running falls due (its lease runs out), in seconds.

    None if none is running; a worker that found nothing due waits that long
    at most (a lease running out tells nobody), or until it is told of a run
    made due.
    """
    params = {"graphs": [name for name, _ in graphs], "versions": [version for _, version in graphs]}
    row = conn.execute(_NEXT_DUE, params).fetchone()
    return None if row is None or row[0] is None else max(0.0, float(row[0]))


def claim_run(conn: Any, run_id: str, owner: str, seconds: float) -> Lease | str:
    """Claim run ``run_id`` (one this process runs itself); the holder's name if another holds it."""
    row = conn.execute(
        "INSERT INTO streamledger_leases (run_id, owner, token, expires_at)"
        " VALUES (%(run_id)s, %(owner)s, 1, now() + make_interval(secs => %(seconds)s))"
        " ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, token = streamledger_leases.token + 1,"
        " expires_at = EXCLUDED.expires_at WHERE streamledger_leases.expires_at < now()"
        " RETURNING run_id, token",
        {"run_id": run_id, "owner": owner, "seconds": seconds},
    ).fetchone()
    if row is not None:
        return Lease(row[0], owner, row[1])
    holder = conn.execute("SELECT owner FROM streamledger_leases WHERE run_id = %s", (run_id,)).fetchone()
    return "another worker" if holder is None else str(holder[0])


def renew(conn: Any, lease: Lease, seconds: float) -> bool:
    """Extend ``lease`` by ``seconds`` from now; False if it was taken over."""
    row = conn.execute(
        "UPDATE streamledger_leases SET expires_at = now() + make_interval(secs => %s)"
        " WHERE run_id = %s AND token = %s RETURNING run_id",
        (seconds, lease.run_id, lease.token),
    ).fetchone()
    return row is not None


#: Gives a run's lease up, and tells the workers waiting for a due run
#: (:mod:`ledger.postgres._notify`) when the run is still running: its worker stopped, or gave it up
#: at once. A run that ended tells nobody.
_RELEASE: Final = f"""
WITH released AS (
    DELETE FROM streamledger_leases WHERE run_id = %(run_id)s AND token = %(token)s RETURNING run_id
)
SELECT pg_notify('{CHANNEL}', '{RUNS}') FROM released JOIN streamledger_runs r USING (run_id)
WHERE r.status = 'running'
"""


def release(conn: Any, lease: Lease) -> None:
    """Give the run up (its run ended, or its worker stops); another lease is left alone."""
    conn.execute(_RELEASE, {"run_id": lease.run_id, "token": lease.token}).fetchall()
