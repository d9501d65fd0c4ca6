"""Workers: processes, on any machines, that claim the runs that are due and run them under a lease.

``await work(url, graphs)`` is one worker: it claims a run that is due (one
submitted, or one whose worker died or stopped renewing: its lease
expired), resumes it from the ledger with the graph of its name, renews the
lease while it runs, and gives it up when the run ended. Every write it
makes for the run is fenced by its lease (:mod:`ledger.postgres._leases`),
so a worker paused past its lease can confirm nothing once another took
the run over. Claims skip rows other workers hold (``SKIP LOCKED``), so N
workers never run one run at a time.

An idle worker claims again as soon as the server notifies it of a run made
due (submitted, retried, or given up while running:
:mod:`ledger.postgres._notify`), and when the earliest lease of a running
run runs out (its worker died, which tells nobody: the worker's claim that
found nothing due also read when that is). It polls every ``poll_seconds``
only while its listening connection is away, the time notifications are
lost; an idle worker of an idle ledger costs no queries. The worker holding a run hears
of its cancellation at once, not at its next renewal.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec

from streams import Aspect, ConfirmedFailureError, Graph

from .._errors import LeaseLostError, LedgerUnreachableError, OutcomeUnknownError, RunCancelledError
from .._ledger import Ledger
from .._runs import stamped
from ._faults import find_cause
from ._leased import holding
from ._leases import Lease, claim_due, next_due
from ._ledger import PgBackend, open_postgres
from ._notify import RUNS, Listener, open_listener
from ._store import RECONNECT_SECONDS

__all__ = ["WorkerReport", "print_report", "work"]

#: A worker's report of what it did with one claimed run: (run id, outcome), the outcome one of
#: "claimed" (before it runs it), then "completed", "failed" (for good), "lost" (its lease was taken
#: over) or "error (...)" (it gave the run up: it is tried again when its lease runs out).
WorkerReport = Callable[[str, str], None]

DEFAULT_LEASE_SECONDS: Final = 10.0
#: How long past a lease's end an idle worker claims again (seconds): the lease has run out by then
#: on the server's clock, whatever the round trip.
_SLACK_SECONDS: Final = 0.01


def print_report(run_id: str, outcome: str) -> None:
    """A report as one line on standard output: ``run ID: OUTCOME``."""
    print(f"run {run_id}: {outcome}", flush=True)


async def work(
    url: str,
    graphs: Mapping[str, Graph],
    *,
    aspects: Iterable[Aspect] = (),
    owner: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    poll_seconds: float = 0.5,
    until_idle: bool = False,
    report: WorkerReport = print_report,
    reconnect_seconds: float = RECONNECT_SECONDS,
) -> int:
    """Claim and run due runs of ``graphs`` (by graph name) until cancelled; returns the runs it ended.

    A worker claims only runs of the graphs (name and version) it was
    given. A run it gives up with an error keeps its lease until the lease
    runs out, so it is tried again (by any worker) only then. ``until_idle``
    returns once no run of the ledger that this worker could run is
    running. ``owner`` names the worker in its leases (default host and pid).
    ``aspects`` is the execution's aspect chain it resumes every run with: a
    run submitted (or started) with another chain is not run and is
    reported as ``error (RunAspectsMismatchError)``, its budgets untouched.

    A server that goes away is waited for, up to ``reconnect_seconds``
    (:mod:`ledger.postgres._faults`); what the ledger confirmed stays, and a
    run whose last commit was lost with the server is given up at once and
    resumed from the ledger (by this worker or another). Past that time the
    worker raises :class:`~ledger.LedgerUnreachableError`; its run's lease
    runs out, and another worker resumes the run.
    """
    if lease_seconds <= 0 or poll_seconds <= 0:
        raise ValueError("lease_seconds and poll_seconds must be positive")
    owner = owner or f"{socket.gethostname()}:{os.getpid()}"
    chain = tuple(aspects)
    known = [(graph.name, graph.version) for graph in graphs.values()]
    by_name = {graph.name: graph for graph in graphs.values()}
    ended = 0
    async with (
        open_postgres(url, reconnect_seconds=reconnect_seconds) as ledger,
        open_listener(url) as listener,
    ):
        connection = ledger.backend.connection
        with listener.watching(RUNS) as due:  # before the first claim: a run made due since wakes it
            while True:
                await anyio.lowlevel.checkpoint()  # cancellable between runs, whatever the runs do
                try:
                    lease, due_in = await connection.call(
                        partial(_claim, owner=owner, seconds=lease_seconds, known=known)
                    )
                except OutcomeUnknownError:  # it may have claimed a run: that lease runs out, then it is due
                    continue
                if lease is None:
                    if until_idle:
                        if due_in is None:  # nothing of its graphs is running
                            return ended
                        due_in = min(due_in, poll_seconds)  # a run that ends tells nobody
                    # a run made due, the earliest lease running out, or the poll's bound
                    await due.wait(poll_seconds, due=_SLACK_SECONDS + due_in if due_in is not None else None)
                    continue
                report(lease.run_id, "claimed")
                outcome = await _run_leased(ledger, lease, by_name, chain, lease_seconds, listener)
                report(lease.run_id, outcome)
                if outcome in ("completed", "failed"):
                    ended += 1


def _claim(
    view: Any, *, owner: str, seconds: float, known: list[tuple[str, str]]
) -> tuple[Lease | None, float | None]:
    """A run claimed, or none and how soon one of ``known`` that is running falls due (None: none runs)."""
    lease = claim_due(view.connection, owner, seconds, known)
    return lease, (None if lease is not None else next_due(view.connection, known))


async def _run_leased(
    ledger: Ledger[PgBackend],
    lease: Lease,
    graphs: Mapping[str, Graph],
    aspects: tuple[Aspect, ...],
    seconds: float,
    listener: Listener,
) -> str:
    """Run the leased run to its end (or until the lease is lost); its outcome."""
    outcome = "error"
    try:
        async with holding(ledger.backend.connection, lease, seconds, listener=listener) as held:
            record = await ledger.backend.run_book.read(lease.run_id)  # reads need no fence
            if record is None:
                return "gone"
            try:
                await held.runs.resume(lease.run_id, graphs[record.graph], aspects=aspects)
                outcome = "completed"
            except ConfirmedFailureError:  # its failure was confirmed before: the record says so now
                if record.status != "failed":
                    await held.book.write(
                        stamped(msgspec.structs.replace(record, status="failed")), new=False
                    )
                outcome = "failed"
            except RunCancelledError:  # cancelled since its claim, before its holder listened: as told
                outcome = "cancelled"
            except Exception as exc:
                if find_cause(exc, LeaseLostError) is not None:
                    raise LeaseLostError(str(exc)) from exc
                gone = find_cause(exc, LedgerUnreachableError)
                if gone is not None:  # the server stayed away: the lease runs out, another worker resumes
                    held.keep_until_expiry = True
                    raise gone from None
                if find_cause(exc, OutcomeUnknownError) is not None:
                    # a commit lost with the server: the run did not fail; given up at once, it is
                    # claimed again now and resumed from what the ledger holds
                    return "error (OutcomeUnknownError)"
                after = await ledger.backend.run_book.read(lease.run_id)
                outcome = (
                    "failed"
                    if after is not None and after.status == "failed"
                    else f"error ({type(exc).__qualname__})"
                )
                if not outcome.startswith("failed"):
                    held.keep_until_expiry = True  # tried again once the lease runs out, not at once
    except Exception as exc:  # a task group may wrap it
        if find_cause(exc, LeaseLostError) is not None:  # between its steps (paused, or cut off)
            return "lost"  # nothing was confirmed after
        raise
    if held.lost and outcome not in ("completed", "failed"):
        return "lost"
    if held.cancelled and outcome != "completed":
        return "cancelled"
    return outcome
