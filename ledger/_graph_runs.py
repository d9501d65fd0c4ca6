"""Checkpoint and run records of durable graph runs, and how they sit in the ledger.

This module needs no pydantic-graph: ``python -m ledger inspect`` lists graph
runs with it. ``ledger.graphs._checkpoint`` turns pydantic-graph tasks into
:class:`SavedTask` and back.

Both live in the ``graph_runs`` database, sealed like every ledger value:

* ``run/<run id>``: :class:`GraphRunRecord`, the run's attempts and progress;
* ``checkpoint/<run id>``: :class:`GraphCheckpoint`, the latest checkpoint.

Values of the graph (state, inputs, output) are stored as the JSON their
``TypeAdapter`` wrote, so a checkpoint is read back through the types of the
graph that resumes it. The checkpoint's format version is 1; a checkpoint of
another version, or that is not a checkpoint, is discarded with reason
``format`` (a record whose checksum fails is a damaged ledger and raises
:class:`ledger.CorruptRecordError` instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Protocol

import lmdb
import msgspec

from ._env import LedgerEnv
from ._layout import CHECKPOINT_PREFIX, RUN_PREFIX, checkpoint_key, run_key
from ._manifest import KeyTally, write_tally
from ._seal import decode_record, seal, unseal

__all__ = [
    "FORMAT_VERSION",
    "GraphCheckpoint",
    "GraphRunBook",
    "HoldsGraphRuns",
    "LmdbGraphRuns",
    "decode_checkpoint_body",
    "GraphRunRecord",
    "SavedForkFrame",
    "SavedTask",
    "checkpoint_key",
    "delete_run",
    "list_runs",
    "read_checkpoint",
    "read_run",
    "run_key",
    "write_run",
]

#: The version of :class:`GraphCheckpoint`'s layout and meaning.
FORMAT_VERSION: Final = 1
DB: Final = "graph_runs"


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
_run_decoder: Final = msgspec.msgpack.Decoder(GraphRunRecord)
_encoder: Final = msgspec.msgpack.Encoder()


def read_run(env: LedgerEnv, run_id: str) -> GraphRunRecord | None:
    key = run_key(run_id)
    with env.read() as txn:
        raw = txn.get(key, db=env.db(DB))
    return None if raw is None else decode_record(bytes(raw), _run_decoder, db=DB, key=key)


def read_checkpoint(env: LedgerEnv, run_id: str) -> GraphCheckpoint | str | None:
    """The run's checkpoint, None if it has none, or ``"format"`` if it is not one of ours."""
    key = checkpoint_key(run_id)
    with env.read() as txn:
        raw = txn.get(key, db=env.db(DB))
    return None if raw is None else _decode_checkpoint(key, bytes(raw))


def list_runs(env: LedgerEnv) -> Iterator[tuple[GraphRunRecord, GraphCheckpoint | str | None]]:
    """Every run of the ledger in run-id order, with its checkpoint, from one consistent snapshot."""
    if not env.has_db(DB):
        return
    db = env.db(DB)
    with env.read() as txn, txn.cursor(db=db) as cursor:
        found = cursor.set_range(RUN_PREFIX)
        while found:
            key, value = bytes(cursor.key()), bytes(cursor.value())
            if not key.startswith(RUN_PREFIX):
                break
            record = decode_record(value, _run_decoder, db=DB, key=key)
            ckey = CHECKPOINT_PREFIX + key[len(RUN_PREFIX) :]
            raw = txn.get(ckey, db=db)
            yield record, None if raw is None else _decode_checkpoint(ckey, bytes(raw))
            found = cursor.next()


def _decode_checkpoint(key: bytes, raw: bytes) -> GraphCheckpoint | str:
    return decode_checkpoint_body(unseal(raw, db=DB, key=key))


def decode_checkpoint_body(body: bytes) -> GraphCheckpoint | str:
    """A checkpoint's msgpack, or ``"format"`` if it is not one of ours (another version, or not one)."""
    try:
        if _header_decoder.decode(body).format_version != FORMAT_VERSION:
            return "format"
        return _checkpoint_decoder.decode(body)
    except msgspec.DecodeError:
        return "format"


async def write_run(
    env: LedgerEnv,
    record: GraphRunRecord,
    *,
    checkpoint: GraphCheckpoint | None = None,
    delete_checkpoint: bool = False,
) -> None:
    """Write a run's record, with its new checkpoint or without its old one, in one durable commit."""
    db, meta = env.db(DB), env.db("meta")
    rkey, ckey = run_key(record.run_id), checkpoint_key(record.run_id)
    rvalue = seal(DB, rkey, _encoder.encode(record))
    cvalue = None if checkpoint is None else seal(DB, ckey, _encoder.encode(checkpoint))

    def write(txn: lmdb.Transaction) -> None:
        tally = KeyTally()  # the keys added and removed, for the database's manifest
        if txn.replace(rkey, rvalue, db=db) is None:
            tally.added(rkey)
        if cvalue is not None:
            if txn.replace(ckey, cvalue, db=db) is None:
                tally.added(ckey)
        elif delete_checkpoint and txn.delete(ckey, db=db):
            tally.removed(ckey)
        write_tally(txn, meta, DB, tally)

    await env.write(write)


async def delete_run(env: LedgerEnv, run_id: str) -> None:
    db, meta = env.db(DB), env.db("meta")
    rkey, ckey = run_key(run_id), checkpoint_key(run_id)

    def delete(txn: lmdb.Transaction) -> None:
        tally = KeyTally()
        for key in (rkey, ckey):
            if txn.delete(key, db=db):
                tally.removed(key)
        write_tally(txn, meta, DB, tally)

    await env.write(delete)


class GraphRunBook(Protocol):
    """Where a ledger keeps its durable graph runs: a record and the latest checkpoint per run id."""

    @property
    def where(self) -> str: ...

    @property
    def owner(self) -> object: ...

    def read_run(self, run_id: str) -> GraphRunRecord | None: ...

    def read_checkpoint(self, run_id: str) -> GraphCheckpoint | str | None: ...

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


class LmdbGraphRuns:
    """The durable graph runs of an LMDB ledger (``ledger.graph_runs``): its ``graph_runs`` database."""

    def __init__(self, env: LedgerEnv) -> None:
        self.env = env

    @property
    def where(self) -> str:
        return f"ledger {self.env.path}"

    @property
    def owner(self) -> object:
        """What identifies the ledger: a run id runs once at a time per ledger and process."""
        return self.env

    def read_run(self, run_id: str) -> GraphRunRecord | None:
        return read_run(self.env, run_id)

    def read_checkpoint(self, run_id: str) -> GraphCheckpoint | str | None:
        return read_checkpoint(self.env, run_id)

    async def write_run(
        self,
        record: GraphRunRecord,
        *,
        checkpoint: GraphCheckpoint | None = None,
        delete_checkpoint: bool = False,
    ) -> None:
        await write_run(self.env, record, checkpoint=checkpoint, delete_checkpoint=delete_checkpoint)

    async def delete_run(self, run_id: str) -> None:
        await delete_run(self.env, run_id)
