"""An open PostgreSQL ledger: its connection, the stores on it, and its runs held under leases."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._errors import LeaseLostError, RunActiveError
from .._format import run_id_bytes
from .._graph_runs import GraphRunBook
from .._ledger import Ledger
from .._runs import RunBook
from ._graph_runs import PgGraphRuns
from ._leased import holding
from ._leases import claim_run
from ._nodes import PgNodeHooks
from ._runs import PgRunBook
from ._store import RECONNECT_SECONDS, PgConnection, connected
from ._streams import PgStreamHooks

__all__ = ["PgBackend", "open_postgres"]


class PgBackend:
    """A PostgreSQL database many processes share, and the stores on it (``ledger.backend``)."""

    #: How long this process's lease on a run it runs itself lasts (renewed every third of it).
    lease_seconds: float = 10.0

    def __init__(self, connection: PgConnection) -> None:
        self._connection = connection
        self._streams = PgStreamHooks(connection)
        self._nodes = PgNodeHooks(connection, self._streams)
        self._graph_runs = PgGraphRuns(connection)
        self._book = PgRunBook(connection, self._nodes)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def where(self) -> str:
        return self._connection.where

    @property
    def url(self) -> str:
        return self._connection.url

    @property
    def connection(self) -> PgConnection:
        """The ledger's connection (its group commit): what workers claim and renew leases through."""
        return self._connection

    @property
    def streams(self) -> PgStreamHooks:
        return self._streams

    @property
    def nodes(self) -> PgNodeHooks:
        return self._nodes

    @property
    def graph_runs(self) -> GraphRunBook:
        return self._graph_runs

    @property
    def run_book(self) -> RunBook:
        return self._book

    @asynccontextmanager
    async def holding(self, run_id: str) -> AsyncIterator[PgRunBook]:
        """Run ``run_id`` under a lease, as a worker holds one: its fenced book, renewed while it runs.

        No worker claims the run while this process runs it; a run another
        process holds is :class:`~ledger.RunActiveError`. A lease lost while
        the block runs cancels it and raises :class:`LeaseLostError`.
        """
        run_id_bytes(run_id)  # a run id the ledger can key, or InvalidRunIdError before anything
        owner, seconds = self.owner, self.lease_seconds
        claimed = await self._connection.call(lambda view: claim_run(view.connection, run_id, owner, seconds))
        if isinstance(claimed, str):
            raise RunActiveError(f"run {run_id!r} is being run by {claimed} (it holds the run's lease)")
        async with holding(self._connection, claimed, seconds) as held:
            yield held.book
        if held.lost:
            raise LeaseLostError(
                f"this process lost its lease on run {run_id!r} (it could not renew it in time) and "
                "another worker took the run over: nothing was confirmed after"
            )


@asynccontextmanager
async def open_postgres(
    url: str, *, reconnect_seconds: float = RECONNECT_SECONDS
) -> AsyncIterator[Ledger[PgBackend]]:
    """Connect to the PostgreSQL ledger at ``url`` (making its tables in an empty database).

    Refuses a database holding another schema or codec version with
    :class:`~ledger.SchemaVersionError`, a ``search_path`` naming no schema
    that exists with :class:`~ledger.MissingSchemaError`. ``url`` is
    libpq's: a ``postgresql://`` URL or a ``key=value`` string. A server
    that is away, or goes away later, is waited for up to
    ``reconnect_seconds`` each time; then the call waiting raises
    :class:`~ledger.LedgerUnreachableError`. A refusal (no such database or
    role, failed authentication) raises it at once.
    """
    async with connected(PgConnection(url, reconnect_seconds=reconnect_seconds)) as connection:
        yield Ledger(PgBackend(connection))
