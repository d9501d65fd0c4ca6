"""Checkpoint and run records of durable graph runs, and how they sit in the ledger.

This module needs no pydantic-graph: ``python -m ledger inspect`` lists graph
runs with it. ``ledger.graphs._checkpoint`` turns pydantic-graph tasks into
:class:`SavedTask` and back.

A backend keeps two records per run id (:class:`GraphRunBook`): a
:class:`GraphRunRecord`, the run's attempts and progress, and a
:class:`GraphCheckpoint`, the latest checkpoint (LMDB: the ``graph_runs``
database, ``ledger/lmdb/_graph_runs.py``; PostgreSQL: one table).

Values of the graph (state, inputs, output) are stored as the JSON their
``TypeAdapter`` wrote, so a checkpoint is read back through the types of the
graph that resumes it. The checkpoint's format version is 1; a checkpoint of
another version, or that is not a checkpoint, is discarded with reason
``format`` (a record whose checksum fails is a damaged ledger and raises
:class:`ledger.CorruptRecordError` instead).
"""

from __future__ import annotations

from typing import Final, Protocol

import msgspec

__all__ = [
    "FORMAT_VERSION",
    "GraphCheckpoint",
    "GraphRunBook",
    "GraphRunRecord",
    "HoldsGraphRuns",
    "SavedForkFrame",
    "SavedTask",
    "decode_checkpoint_body",
]

#: The version of :class:`GraphCheckpoint`'s layout and meaning.
FORMAT_VERSION: Final = 1


class SavedForkFrame(msgspec.Struct, frozen=True, array_like=True):
    """One frame of a task's fork stack."""

    fork_id: str
    node_run_id: str
    thread_index: int


class SavedTask(msgspec.Struct, frozen=True):
    """A pending task: its node, its inputs as JSON, and its fork stack."""

    node_id: str
    inputs: bytes
    fork_stack: tuple[SavedForkFrame, ...]


class GraphCheckpoint(msgspec.Struct, frozen=True):
    """The latest checkpoint of a run: what a resumed attempt starts from.

    ``tasks`` holds the one task that comes next (checkpoints are taken only at
    quiescent boundaries); a finished checkpoint holds no task and the
    graph's ``output``.
    """

    format_version: int
    graph_fingerprint: str
    sequence: int
    attempt: int
    last_step: str
    state: bytes
    inputs: bytes
    tasks: tuple[SavedTask, ...] = ()
    finished: bool = False
    output: bytes = b"null"


class GraphRunRecord(msgspec.Struct, frozen=True):
    """A run's attempts and progress.

    ``graph`` is the graph's name; ``discarded`` the reason the run's
    latest discarded checkpoint was not resumed (``format``,
    ``graph_changed``, ``untyped``, ``invalid``); ``error`` the exception type
    the last attempt failed with, None while an attempt runs or once one
    finished. Fields after ``finished`` were added without a new
    format version: records without them read as their defaults.
    """

    format_version: int
    run_id: str
    attempt: int
    checkpoints: int = 0
    last_step: str | None = None
    finished: bool = False
    graph: str = ""
    discarded: str | None = None
    error: str | None = None


class _Header(msgspec.Struct):
    format_version: int


_header_decoder: Final = msgspec.msgpack.Decoder(_Header)
_checkpoint_decoder: Final = msgspec.msgpack.Decoder(GraphCheckpoint)


def decode_checkpoint_body(body: bytes) -> GraphCheckpoint | str:
    """A checkpoint's msgpack, or ``"format"`` if it is not one of ours (another version, or not one)."""
    try:
        if _header_decoder.decode(body).format_version != FORMAT_VERSION:
            return "format"
        return _checkpoint_decoder.decode(body)
    except msgspec.DecodeError:
        return "format"


class GraphRunBook(Protocol):
    """Where a ledger keeps its durable graph runs: a record and the latest checkpoint per run id."""

    @property
    def where(self) -> str: ...

    @property
    def owner(self) -> object: ...

    async def read(self, run_id: str) -> tuple[GraphRunRecord | None, GraphCheckpoint | str | None]:
        """The run's record (None if the ledger never saw it) and its checkpoint (None if it has
        none, ``"format"`` if it is not one of ours), both from one snapshot of the ledger."""
        ...

    async def write_run(
        self,
        record: GraphRunRecord,
        *,
        checkpoint: GraphCheckpoint | None = None,
        delete_checkpoint: bool = False,
    ) -> None:
        """Write a run's record, with its new checkpoint or without its old one, in one durable commit."""
        ...

    async def delete_run(self, run_id: str) -> None: ...


class HoldsGraphRuns(Protocol):
    """A ledger, of either kind: what :class:`~ledger.graphs.DurableGraph` runs on."""

    @property
    def graph_runs(self) -> GraphRunBook: ...
