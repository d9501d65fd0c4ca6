"""Workers: processes, on any machines, that claim the runs that are due and run them under a lease.

``await work(url, graphs)`` is one worker: it claims a run that is due (one
submitted, or one whose worker died or stopped renewing: its lease
expired), resumes it from the ledger with the graph of its name, renews the
lease while it runs, and gives it up when the run ended. Every write it
makes for the run is fenced by its lease (:mod:`ledger.postgres._leases`),
so a worker paused past its lease can confirm nothing once another took
the run over. Claims skip rows other workers hold (``SKIP LOCKED``), so N
workers never run one run at a time.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import msgspec

from streams import ConfirmedFailureError, Graph

from .._runs import Runs
from ._leases import FencedConnection, Lease, LeaseLostError, claim_due, release, renew
from ._ledger import PostgresLedger, open_postgres
from ._nodes import PgNodeHooks
from ._runs import PgRunBook
from ._streams import PgStreamHooks

__all__ = ["WorkerReport", "print_report", "work"]

#: A worker's report of what it did with one claimed run: (run id, outcome), the outcome one of
#: "claimed" (before it runs it), then "completed", "failed" (for good), "lost" (its lease was taken
#: over), "error (...)" (it gave the run up: another worker resumes it) or "unknown graph".
WorkerReport = Callable[[str, str], None]

DEFAULT_LEASE_SECONDS: Final = 10.0


def print_report(run_id: str, outcome: str) -> None:
    """A report as one line on standard output: ``run ID: OUTCOME``."""
    print(f"run {run_id}: {outcome}", flush=True)


async def work(
    url: str,
    graphs: Mapping[str, Graph],
    *,
    owner: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    poll_seconds: float = 0.5,
    until_idle: bool = False,
    report: WorkerReport = print_report,
) -> int:
    """Claim and run due runs of ``graphs`` (by graph name) until cancelled; returns the runs it ended.

    ``until_idle`` returns once no run of the ledger is still running (none
    due, none leased by another worker). ``owner`` names the worker in its
    leases (default host and pid).
    """
    if lease_seconds <= 0 or poll_seconds <= 0:
        raise ValueError("lease_seconds and poll_seconds must be positive")
    owner = owner or f"{socket.gethostname()}:{os.getpid()}"
    unknown: set[str] = set()
    ended = 0
    async with open_postgres(url) as ledger:
        while True:
            lease = await ledger.connection.call(
                lambda view: claim_due(view.connection, owner, lease_seconds)
            )
            if lease is None or lease.run_id in unknown:
                if lease is not None:
                    await _release(ledger, lease)
                if until_idle and not await _anything_running(ledger):
                    return ended
                await anyio.sleep(poll_seconds)
                continue
            report(lease.run_id, "claimed")
            try:
                outcome = await _run_leased(ledger, lease, graphs, lease_seconds)
            except LeaseLostError:  # lost between its steps (the worker was paused): nothing confirmed
                outcome = "lost"
            report(lease.run_id, outcome)
            if outcome == "unknown graph":
                unknown.add(lease.run_id)
            if outcome in ("completed", "failed"):
                ended += 1


async def _anything_running(ledger: PostgresLedger) -> bool:
    def running(view: Any) -> bool:
        row = view.connection.execute(
            "SELECT 1 FROM streamledger_runs WHERE status = 'running' LIMIT 1"
        ).fetchone()
        return row is not None

    return await ledger.connection.call(running)


async def _run_leased(
    ledger: PostgresLedger, lease: Lease, graphs: Mapping[str, Graph], seconds: float
) -> str:
    """Run the leased run to its end (or until the lease is lost); its outcome."""
    fenced = FencedConnection(ledger.connection, lease)
    streams = PgStreamHooks(fenced)
    nodes = PgNodeHooks(fenced, streams)
    runs = Runs(PgRunBook(fenced, nodes))
    record = await PgRunBook(ledger.connection, nodes).read(lease.run_id)  # a read needs no fence
    graph = None if record is None else graphs.get(record.graph)
    if graph is None:
        return "unknown graph"
    lost = False
    outcome = "error"
    async with anyio.create_task_group() as tg:

        async def keep_lease() -> None:
            nonlocal lost
            while True:
                await anyio.sleep(seconds / 3)
                if not await ledger.connection.call(lambda view: renew(view.connection, lease, seconds)):
                    lost = True
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(keep_lease)
        try:
            await runs.resume(lease.run_id, graph)
            outcome = "completed"
        except ConfirmedFailureError:  # its failure was confirmed before: the record says so now
            if record is not None and record.status != "failed":
                await PgRunBook(fenced, nodes).write(
                    msgspec.structs.replace(record, status="failed"), new=False
                )
            outcome = "failed"
        except Exception as exc:
            outcome = "lost" if lost or _lease_lost(exc) else f"error ({type(exc).__qualname__})"
            if outcome != "lost":
                after = await PgRunBook(ledger.connection, nodes).read(lease.run_id)
                if after is not None and after.status == "failed":
                    outcome = "failed"
        finally:
            tg.cancel_scope.cancel()
    if lost:
        return "lost"
    if outcome != "lost":
        await _release(ledger, lease)
    return outcome


async def _release(ledger: PostgresLedger, lease: Lease) -> None:
    await ledger.connection.call(lambda view: release(view.connection, lease))


def _lease_lost(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, LeaseLostError):
            return True
        if isinstance(seen, BaseExceptionGroup):
            return any(_lease_lost(e) for e in seen.exceptions)
        seen = seen.__cause__ or seen.__context__
    return False
