"""An LMDB ledger opened by its owner: the environment, its committer, and the stores on it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec

from .._committer import serving
from .._graph_runs import GraphRunBook
from .._ledger import Ledger
from .._runs import RunDeleted, RunRecord, cancelled_meanwhile, run_exists
from ._delete import delete_run
from ._env import LedgerEnv
from ._graph_runs import LmdbGraphRuns
from ._layout import NODE_RUN_PREFIX, node_run_key
from ._nodes import LmdbNodeHooks, put_record, scan
from ._seal import decode_record
from ._streams import LmdbStreamHooks

__all__ = ["LmdbBackend", "LmdbRunBook", "list_runs", "open_ledger"]

DB: Final = "nodes"
_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(RunRecord)


def list_runs(env: LedgerEnv) -> Iterator[RunRecord]:
    """Every business run of the ledger, by run id, from one snapshot."""
    return scan(env, NODE_RUN_PREFIX, _decoder)


class LmdbRunBook:
    """The runs of an LMDB ledger: records in its ``nodes`` database, keyed by run id."""

    def __init__(self, env: LedgerEnv, nodes: LmdbNodeHooks) -> None:
        self._env = env
        self._nodes = nodes

    @property
    def where(self) -> str:
        return f"ledger {self._env.path}"

    @property
    def nodes(self) -> LmdbNodeHooks:
        return self._nodes

    async def read(self, run_id: str) -> RunRecord | None:
        env = self._env
        key = node_run_key(run_id)
        with env.read() as txn:
            raw = txn.get(key, db=env.db(DB))
        return None if raw is None else decode_record(bytes(raw), _decoder, db=DB, key=key)

    async def write(self, record: RunRecord, *, new: bool, unless_cancelled: bool = False) -> None:
        env = self._env
        db, meta = env.db(DB), env.db("meta")
        key = node_run_key(record.run_id)
        body = _encoder.encode(record)

        def write(txn: Any) -> None:
            held = txn.get(key, db=db) if new or unless_cancelled else None
            if new and held is not None:
                raise run_exists(record.run_id)
            was = decode_record(bytes(held), _decoder, db=DB, key=key) if unless_cancelled and held else None
            if was is not None and was.status == "cancelled":
                raise cancelled_meanwhile(record.run_id)
            put_record(txn, db, meta, key, body)

        await env.write(write)

    async def records(self) -> list[RunRecord]:
        return list(list_runs(self._env))

    async def delete(self, record: RunRecord) -> RunDeleted:
        dbs = self._env.databases()
        deleted, gone = await self._env.write(lambda txn: delete_run(txn, dbs, record))
        self._nodes.streams.forget(gone)  # a new run under this id opens new streams
        return deleted


class LmdbBackend:
    """An LMDB environment its process owns, and the stores on it (``ledger.backend``)."""

    def __init__(self, env: LedgerEnv) -> None:
        self.env = env
        self._streams = LmdbStreamHooks(env)
        self._nodes = LmdbNodeHooks(env, self._streams)
        self._graph_runs = LmdbGraphRuns(env)
        self._book = LmdbRunBook(env, self._nodes)

    @property
    def path(self) -> Path:
        return self.env.path

    @property
    def where(self) -> str:
        return str(self.env.path)

    @property
    def streams(self) -> LmdbStreamHooks:
        return self._streams

    @property
    def nodes(self) -> LmdbNodeHooks:
        return self._nodes

    @property
    def graph_runs(self) -> GraphRunBook:
        return self._graph_runs

    @property
    def run_book(self) -> LmdbRunBook:
        return self._book

    @asynccontextmanager
    async def holding(self, run_id: str) -> AsyncIterator[LmdbRunBook]:
        """The ledger's own book: its one owning process runs its runs (one execution per id at a time)."""
        yield self._book


@asynccontextmanager
async def open_ledger(
    path: str | os.PathLike[str],
    *,
    create: bool = True,
    sync: bool = True,
    map_size: int = 64 << 20,
    max_map_size: int = 1 << 40,
) -> AsyncIterator[Ledger[LmdbBackend]]:
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
        async with serving(env):
            yield Ledger(LmdbBackend(env))
    finally:
        env.close()
