"""The public ledger handle: an open environment, its committer, and the stores on it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio

from streams.store import single_error

from ._env import LedgerEnv
from ._graph_runs import LmdbGraphRuns
from ._nodes import LmdbNodeHooks
from ._runs import LmdbRunBook, Runs
from ._streams import LmdbStreamHooks

__all__ = ["Ledger", "open_ledger"]


class Ledger:
    """An open ledger. Obtain one with :func:`open_ledger`."""

    def __init__(self, env: LedgerEnv) -> None:
        self.env = env
        #: The managed-stream store on this ledger (:class:`~streams.StreamHooks`).
        self.streams = LmdbStreamHooks(env)
        #: The node-checkpoint store on this ledger (:class:`~streams.CheckpointHooks`).
        self.nodes = LmdbNodeHooks(env, self.streams)
        self._runs = Runs(LmdbRunBook(self))
        #: Durable pydantic-graph runs' records and checkpoints, for :class:`~ledger.graphs.DurableGraph`.
        self.graph_runs = LmdbGraphRuns(env)
        #: ``await ledger.run(graph, inputs, run_id=...)``: a run in checkpoint mode (:class:`~ledger.Runs`).
        self.run = self._runs.run
        #: ``await ledger.resume(run_id, graph)``: continue a run from what the ledger confirmed.
        self.resume = self._runs.resume
        #: ``ledger.runs()``: every run's :class:`~ledger.RunRecord`.
        self.runs = self._runs.runs

    @property
    def path(self) -> Path:
        return self.env.path


@asynccontextmanager
async def open_ledger(
    path: str | os.PathLike[str],
    *,
    create: bool = True,
    sync: bool = True,
    map_size: int = 64 << 20,
    max_map_size: int = 1 << 40,
) -> AsyncIterator[Ledger]:
    """Open the ledger at ``path`` (creating it if needed) and serve its writes.

    ``sync=False`` skips the fsync of each commit batch: a killed process
    loses nothing, a power loss may lose the last batches. Everything written
    before the block exits is committed before the ledger closes.
    """
    opening = partial(
        LedgerEnv.open, path, create=create, sync=sync, map_size=map_size, max_map_size=max_map_size
    )
    with anyio.CancelScope(shield=True):  # an environment opened is always closed below
        env = await anyio.to_thread.run_sync(opening)  # files, locks and fsyncs: off the event loop
    try:
        with single_error():
            async with anyio.create_task_group() as tg:
                await tg.start(env.serve)
                try:
                    yield Ledger(env)
                finally:
                    # serve() ignores cancellation: the block may still write while it unwinds
                    env.stop_serving()
    finally:
        env.close()
