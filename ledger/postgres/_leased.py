"""A run held under a lease: its fenced stores, and a task that renews the lease while it runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import anyio

from streams.store import single_error

from .._errors import LedgerUnreachableError
from .._runs import Runs
from ._faults import find_cause
from ._leases import FencedConnection, Lease, release, renew
from ._nodes import PgNodeHooks
from ._notify import Listener, Wakeup, cancelled_topic
from ._runs import PgRunBook
from ._store import PgConnection
from ._streams import PgStreamHooks

__all__ = ["Held", "holding"]


class Held:
    """A leased run's fenced :class:`~ledger.Runs`, and whether the lease was lost while it ran."""

    def __init__(self, runs: Runs, book: PgRunBook) -> None:
        self.runs = runs
        self.book = book
        self.lost = False
        #: The run was cancelled (``ledger.cancel``, ``runs cancel``): a renewal found it so and stopped it.
        self.cancelled = False
        #: Leave the lease to run out instead of giving it up: the run is tried again only then.
        self.keep_until_expiry = False


def _renewal(conn: Any, lease: Lease, seconds: float) -> str:
    """Renew ``lease``: "held", "lost" (taken over), or "cancelled" (its run was cancelled meanwhile)."""
    if not renew(conn, lease, seconds):
        return "lost"
    row = conn.execute("SELECT status FROM streamledger_runs WHERE run_id = %s", (lease.run_id,)).fetchone()
    return "cancelled" if row is not None and row[0] == "cancelled" else "held"


@asynccontextmanager
async def holding(
    connection: PgConnection, lease: Lease, seconds: float, *, listener: Listener | None = None
) -> AsyncIterator[Held]:
    """Hold ``lease`` for the block: renew it every third of ``seconds``; give it up at the end.

    With a ``listener``, it renews at once when told the run was cancelled
    (:func:`~._notify.cancelled_topic`), so the run stops then.

    Every write of the yielded stores checks the lease first. If a renewal
    finds the lease taken over, the block is cancelled and ``lost`` is set;
    a lost lease is not released (it is another worker's now), nor is one
    whose server stayed away (it runs out there).
    """
    fenced = FencedConnection(connection, lease)
    streams = PgStreamHooks(fenced)
    nodes = PgNodeHooks(fenced, streams)
    book = PgRunBook(fenced, nodes)
    held = Held(Runs(book), book)
    try:
        with single_error():  # the block's own error, never a group of one
            async with anyio.create_task_group() as tg:

                async def keep(cancelled: Wakeup | None) -> None:
                    while True:
                        if cancelled is None:
                            await anyio.sleep(seconds / 3)
                        else:  # the renewal's time, or a cancellation told
                            await cancelled.wait(seconds / 3)
                        renewed = await connection.call(
                            lambda view: _renewal(view.connection, lease, seconds), idempotent=True
                        )
                        if renewed != "held":
                            held.lost = renewed == "lost"
                            held.cancelled = renewed == "cancelled"
                            tg.cancel_scope.cancel()
                            return

                with ExitStack() as watching:
                    told = None
                    if listener is not None:
                        told = watching.enter_context(listener.watching(cancelled_topic(lease.run_id)))
                    tg.start_soon(keep, told)
                    try:
                        yield held
                    finally:
                        tg.cancel_scope.cancel()
    except Exception as exc:
        gone = find_cause(exc, LedgerUnreachableError)
        if gone is None:
            raise
        held.keep_until_expiry = True  # no release to wait for: the server is not there
        raise gone from None  # one error, however many of the run's tasks met it
    finally:
        if not (held.lost or held.keep_until_expiry):
            with anyio.CancelScope(shield=True):
                await connection.call(lambda view: release(view.connection, lease), idempotent=True)
