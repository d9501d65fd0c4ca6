"""The durable graph runs of an LMDB ledger: its ``graph_runs`` database, sealed like every value.

* ``run/<run id>``: :class:`~ledger._graph_runs.GraphRunRecord`;
* ``checkpoint/<run id>``: :class:`~ledger._graph_runs.GraphCheckpoint`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import lmdb
import msgspec

from .._graph_runs import GraphCheckpoint, GraphRunRecord, decode_checkpoint_body
from ._env import LedgerEnv
from ._layout import CHECKPOINT_PREFIX, RUN_PREFIX, checkpoint_key, run_key
from ._manifest import KeyTally, write_tally
from ._seal import decode_record, seal, unseal

__all__ = [
    "LmdbGraphRuns",
    "checkpoint_key",
    "delete_run",
    "list_runs",
    "read_run",
    "run_key",
    "write_run",
]

DB: Final = "graph_runs"
_run_decoder: Final = msgspec.msgpack.Decoder(GraphRunRecord)
_encoder: Final = msgspec.msgpack.Encoder()


def read_run(env: LedgerEnv, run_id: str) -> tuple[GraphRunRecord | None, GraphCheckpoint | str | None]:
    """The run's record and checkpoint (``"format"`` if it is not one of ours), from one read."""
    key, ckey = run_key(run_id), checkpoint_key(run_id)
    with env.read() as txn:
        raw, raw_checkpoint = txn.get(key, db=env.db(DB)), txn.get(ckey, db=env.db(DB))
    record = None if raw is None else decode_record(bytes(raw), _run_decoder, db=DB, key=key)
    return record, None if raw_checkpoint is None else _decode_checkpoint(ckey, bytes(raw_checkpoint))


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

    async def read(self, run_id: str) -> tuple[GraphRunRecord | None, GraphCheckpoint | str | None]:
        return read_run(self.env, run_id)

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
