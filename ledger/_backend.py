"""What a ledger's storage gives the backend-neutral services: one typed protocol, async throughout.

A backend is one open ledger's storage: an LMDB environment
(:class:`ledger.LmdbBackend`) or a PostgreSQL database
(:class:`ledger.postgres.PgBackend`). The services written once above it
(:class:`~ledger.Ledger` with its runs, durable graph runs, groups and the
demo) reach it only through this protocol, whose every read and write is a
coroutine: a backend on a server runs its round trips off the event loop's
thread, and one on a local file reads inline and writes through its writer
thread. Neither backend imports the other.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

from streams import StreamHooks
from streams.store import CheckpointHooks, NodeCheckpoint

from ._graph_runs import GraphRunBook
from ._runs import RunBook

__all__ = ["Backend", "NodeStore"]


class NodeStore(CheckpointHooks, Protocol):
    """A backend's store of node checkpoints: the engine's hooks, and the two reads a resume makes."""

    async def node_records(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        """The confirmed nodes of execution scope ``scope``, for a restore plan."""
        ...

    async def scope_failed(self, scope: str) -> bool:
        """Whether a final failure was confirmed in execution scope ``scope``."""
        ...


class Backend(Protocol):
    """One open ledger's storage, as :class:`~ledger.Ledger` and the other services use it."""

    @property
    def where(self) -> str:
        """The ledger as messages name it: its path, or its database and host (never a password)."""
        ...

    @property
    def streams(self) -> StreamHooks:
        """The managed-stream store."""
        ...

    @property
    def nodes(self) -> NodeStore: ...

    @property
    def graph_runs(self) -> GraphRunBook: ...

    @property
    def run_book(self) -> RunBook: ...

    def holding(self, run_id: str) -> AbstractAsyncContextManager[RunBook]:
        """Where run ``run_id`` executes in this process, for the block: the run book to run it with.

        A backend shared by processes holds the run for the block (a lease,
        renewed while it runs, every write fenced by it) and raises
        :class:`~ledger.RunActiveError` when another process holds it; one
        process owns a local ledger, so the book is its own.
        """
        ...
