"""An open PostgreSQL ledger: its connection and the stores, runs and submissions on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from .._runs import Runs
from ._graph_runs import PgGraphRuns
from ._nodes import PgNodeHooks
from ._runs import PgRunBook
from ._store import PgConnection
from ._streams import PgStreamHooks

__all__ = ["PostgresLedger", "open_postgres"]


class PostgresLedger:
    """An open PostgreSQL ledger. Obtain one with :func:`open_postgres`."""

    def __init__(self, connection: PgConnection) -> None:
        self._connection = connection
        #: The managed-stream store on this ledger (:class:`~streams.StreamHooks`).
        self.streams = PgStreamHooks(connection)
        #: The node-checkpoint store on this ledger (:class:`~streams.CheckpointHooks`).
        self.nodes = PgNodeHooks(connection, self.streams)
        self._runs = Runs(PgRunBook(connection, self.nodes))
        #: ``await ledger.run(graph, inputs, run_id=...)``: a run in checkpoint mode (:class:`~ledger.Runs`).
        self.run = self._runs.run
        #: ``await ledger.resume(run_id, graph)``: continue a run from what the ledger confirmed.
        self.resume = self._runs.resume
        #: ``ledger.runs()``: every run's :class:`~ledger.RunRecord`.
        self.runs = self._runs.runs
        #: ``await ledger.submit(graph, inputs, run_id=...)``: record a run for a worker to run.
        self.submit = self._runs.submit
        #: Durable pydantic-graph runs' records and checkpoints, for :class:`~ledger.graphs.DurableGraph`.
        self.graph_runs = PgGraphRuns(connection)

    @property
    def url(self) -> str:
        return self._connection.url

    @property
    def connection(self) -> PgConnection:
        """The ledger's connection (its group commit): what workers claim and renew leases through."""
        return self._connection


@asynccontextmanager
async def open_postgres(url: str) -> AsyncIterator[PostgresLedger]:
    """Connect to the PostgreSQL ledger at ``url`` (making its tables in an empty database).

    Refuses a database holding another schema or codec version with
    :class:`~ledger.SchemaVersionError`. ``url`` is libpq's: a
    ``postgresql://`` URL or a ``key=value`` string.
    """
    connection = PgConnection(url)
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(connection.connect)
    try:
        yield PostgresLedger(connection)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(connection.close)
