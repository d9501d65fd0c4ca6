"""The one ledger handle: the services of a ledger over its backend, whichever backend it is."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from streams import Aspect, Graph, Key, KeyedState, StreamHooks, StreamRef

from ._backend import Backend, NodeStore
from ._graph_runs import GraphRunBook
from ._messages import parse_ref
from ._runs import RunDeleted, RunRecord, RunResult, Runs

__all__ = ["Ledger"]

B = TypeVar("B", bound=Backend, covariant=True)


class Ledger(Generic[B]):
    """An open ledger: :func:`~ledger.connect`, :func:`~ledger.open_ledger` or ``open_postgres`` gives one.

    ``Ledger[LmdbBackend]`` for a directory, ``Ledger[PgBackend]`` for a
    PostgreSQL URL: the same services on both, over :attr:`backend`.
    """

    def __init__(self, backend: B) -> None:
        #: The storage: ``LmdbBackend`` (``.env``, ``.path``) or ``PgBackend`` (``.connection``, ``.url``).
        self.backend = backend
        self._runs = Runs(backend.run_book)

    @property
    def where(self) -> str:
        """The ledger as messages name it: its path, or its database and host (never a password)."""
        return self.backend.where

    @property
    def streams(self) -> StreamHooks:
        """The managed-stream store on this ledger (:class:`~streams.StreamHooks`)."""
        return self.backend.streams

    @property
    def nodes(self) -> NodeStore:
        """The node-checkpoint store on this ledger (:class:`~streams.store.CheckpointHooks`)."""
        return self.backend.nodes

    @property
    def graph_runs(self) -> GraphRunBook:
        """Durable pydantic-graph runs' records and checkpoints, for :class:`~ledger.graphs.DurableGraph`."""
        return self.backend.graph_runs

    async def keyed_state(
        self,
        stream: StreamRef | str,
        group: str,
        key: Any,
        *,
        state: KeyedState[Any, Any] | None = None,
        default: Any = None,
    ) -> Any:
        """The confirmed value of ``key`` in ``group``'s keyed state on ``stream``, or ``default``.

        Kafka Streams' interactive query: what a web handler or an operator
        asks while the group runs ("what is customer 42's total now"). It
        reads what the ledger confirmed, never a write a handler staged, and
        changes nothing. ``stream`` is a :class:`~streams.StreamRef` or
        ``"scope/node/key"``. Given ``state`` (the group's
        :class:`~streams.KeyedState`), the key is encoded and the value decoded
        as its types; without it a ``str``, ``int`` or ``bytes`` key is looked
        up and the value read as its MessagePack reads (dicts, lists, numbers).
        A stream or group the ledger does not hold is
        :class:`~streams.UnknownStreamError`.
        """
        ref = parse_ref(stream) if isinstance(stream, str) else stream
        if state is None:
            state = KeyedState(type(key) if type(key) in (str, int, bytes) else Any, Any)
        return await state.get(self.streams, ref, group, key, default)

    async def run(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, **options: Any
    ) -> RunResult:
        """Start run ``run_id`` of ``graph`` in checkpoint mode and run it to its end (:meth:`Runs.run`).

        On a ledger processes share, the run is held for its length (no
        worker claims it; a run another process holds is
        :class:`~ledger.RunActiveError`).
        """
        async with self.backend.holding(run_id) as book:
            return await self._runs.on(book).run(graph, inputs, run_id=run_id, **options)

    async def start(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, **options: Any
    ) -> RunResult:
        """Run ``run_id`` to its end, new or known (:meth:`Runs.start`): start-or-continue by id, held as
        ``run`` is; a known run must be given its graph and inputs (``RunMismatchError`` names what
        differs)."""
        async with self.backend.holding(run_id) as book:
            return await self._runs.on(book).start(graph, inputs, run_id=run_id, **options)

    async def resume(self, run_id: str, graph: Graph, **options: Any) -> RunResult:
        """Continue run ``run_id`` from what the ledger confirmed (:meth:`Runs.resume`), held as ``run``."""
        async with self.backend.holding(run_id) as book:
            return await self._runs.on(book).resume(run_id, graph, **options)

    async def cancel(self, run_id: str, *, reason: str, by: str | None = None) -> RunRecord:
        """Cancel run ``run_id`` (:meth:`Runs.cancel`): recorded with ``by`` (default: this host and
        process) and ``reason``; stopped here if it runs here, and by its worker at its next renewal."""
        return await self._runs.cancel(
            run_id, reason=reason, by=by or f"{socket.gethostname()}:{os.getpid()}"
        )

    async def retry(self, run_id: str, *, reason: str, by: str | None = None) -> RunRecord:
        """Record a new root attempt of run ``run_id``, which failed for good or was cancelled
        (:meth:`Runs.retry`), with ``by`` (default: this host and process) and ``reason``; then
        :meth:`resume` (or a worker that claims it) runs the graph again from its start."""
        return await self._runs.retry(run_id, reason=reason, by=by or f"{socket.gethostname()}:{os.getpid()}")

    async def delete(self, run_id: str) -> RunDeleted:
        """Remove run ``run_id``, every attempt's records and the streams they own (:meth:`Runs.delete`);
        refused while it runs."""
        return await self._runs.delete(run_id)

    async def submit(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, aspects: Iterable[Aspect] = ()
    ) -> RunRecord:
        """Record run ``run_id`` without running it: a worker that claims it, or :meth:`resume`, runs it."""
        return await self._runs.submit(graph, inputs, run_id=run_id, aspects=aspects)

    async def runs(self) -> list[RunRecord]:
        """Every run of the ledger, by run id."""
        return await self._runs.runs()
