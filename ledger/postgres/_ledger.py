"""An open PostgreSQL ledger: its connection and the stores, runs and submissions on it."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio

from streams import Graph, Key

from .._layout import node_run_key
from .._runs import RunActiveError, RunResult, Runs
from ._graph_runs import PgGraphRuns
from ._leased import Held, holding
from ._leases import LeaseLostError, claim_run
from ._nodes import PgNodeHooks
from ._runs import PgRunBook
from ._store import RECONNECT_SECONDS, PgConnection
from ._streams import PgStreamHooks

__all__ = ["PostgresLedger", "open_postgres"]


class PostgresLedger:
    """An open PostgreSQL ledger. Obtain one with :func:`open_postgres`."""

    #: How long this process's lease on a run it runs itself lasts (renewed every third of it).
    lease_seconds: float = 10.0

    def __init__(self, connection: PgConnection) -> None:
        self._connection = connection
        #: The managed-stream store on this ledger (:class:`~streams.StreamHooks`).
        self.streams = PgStreamHooks(connection)
        #: The node-checkpoint store on this ledger (:class:`~streams.CheckpointHooks`).
        self.nodes = PgNodeHooks(connection, self.streams)
        self._runs = Runs(PgRunBook(connection, self.nodes))
        self._owner = f"{socket.gethostname()}:{os.getpid()}"
        #: ``ledger.runs()``: every run's :class:`~ledger.RunRecord`.
        self.runs = self._runs.runs
        #: ``await ledger.submit(graph, inputs, run_id=...)``: record a run for a worker to run.
        self.submit = self._runs.submit
        #: Durable pydantic-graph runs' records and checkpoints, for :class:`~ledger.graphs.DurableGraph`.
        self.graph_runs = PgGraphRuns(connection)

    async def run(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, **options: Any
    ) -> RunResult:
        """:meth:`Runs.run <ledger.Runs.run>` under a lease on ``run_id``, as a worker holds one.

        No worker claims the run while this process runs it; a run another
        process holds is :class:`~ledger.RunActiveError`.
        """
        async with self._held(run_id) as held:
            return await held.runs.run(graph, inputs, run_id=run_id, **options)
        raise self._lost(run_id)

    async def resume(self, run_id: str, graph: Graph, **options: Any) -> RunResult:
        """:meth:`Runs.resume <ledger.Runs.resume>` under a lease on ``run_id``, as :meth:`run`."""
        async with self._held(run_id) as held:
            return await held.runs.resume(run_id, graph, **options)
        raise self._lost(run_id)

    @asynccontextmanager
    async def _held(self, run_id: str) -> AsyncIterator[Held]:
        node_run_key(run_id)  # a run id the ledger can key, or InvalidRunIdError before anything
        owner, seconds = self._owner, self.lease_seconds
        claimed = await self._connection.call(lambda view: claim_run(view.connection, run_id, owner, seconds))
        if isinstance(claimed, str):
            raise RunActiveError(f"run {run_id!r} is being run by {claimed} (it holds the run's lease)")
        async with holding(self._connection, claimed, seconds) as held:
            yield held

    def _lost(self, run_id: str) -> LeaseLostError:
        return LeaseLostError(
            f"this process lost its lease on run {run_id!r} (it could not renew it in time) and another "
            "worker took the run over: nothing was confirmed after"
        )

    @property
    def url(self) -> str:
        return self._connection.url

    @property
    def connection(self) -> PgConnection:
        """The ledger's connection (its group commit): what workers claim and renew leases through."""
        return self._connection


@asynccontextmanager
async def open_postgres(
    url: str, *, reconnect_seconds: float = RECONNECT_SECONDS
) -> AsyncIterator[PostgresLedger]:
    """Connect to the PostgreSQL ledger at ``url`` (making its tables in an empty database).

    Refuses a database holding another schema or codec version with
    :class:`~ledger.SchemaVersionError`, a ``search_path`` naming no schema
    that exists with :class:`~ledger.postgres.MissingSchemaError`. ``url`` is
    libpq's: a ``postgresql://`` URL or a ``key=value`` string. A server
    that is away, or goes away later, is waited for up to
    ``reconnect_seconds`` each time; then the call waiting raises
    :class:`~ledger.LedgerUnreachableError`. A refusal (no such database or
    role, failed authentication) raises it at once.
    """
    connection = PgConnection(url, reconnect_seconds=reconnect_seconds)
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(connection.connect)
    try:
        yield PostgresLedger(connection)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(connection.close)
