"""Durable pydantic-graph runs on PostgreSQL: a run's record and latest checkpoint in one row."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from .._format import run_id_bytes
from .._graph_runs import GraphCheckpoint, GraphRunRecord, decode_checkpoint_body
from ._store import PgConnection
from ._view import decode_row, keyed, run_row

__all__ = ["PgGraphRuns"]

_encoder: Final = msgspec.msgpack.Encoder()
_run_decoder: Final = msgspec.msgpack.Decoder(GraphRunRecord)


class PgGraphRuns:
    """:class:`~ledger.GraphRunBook` over ``streamledger_graph_runs``: ``ledger.graph_runs``."""

    def __init__(self, connection: PgConnection) -> None:
        self._connection = connection

    @property
    def where(self) -> str:
        return self._connection.where

    @property
    def owner(self) -> object:
        return self._connection

    async def _row(self, run_id: str) -> tuple[bytes, bytes | None] | None:
        run_id_bytes(run_id)  # the same run ids as on LMDB, or InvalidRunIdError

        def read(view: Any) -> tuple[bytes, bytes | None] | None:
            row = run_row(view.connection, "streamledger_graph_runs", "record, checkpoint", run_id)
            return None if row is None else (row[0], row[1])

        return await self._connection.read(read)

    async def read(self, run_id: str) -> tuple[GraphRunRecord | None, GraphCheckpoint | str | None]:
        row = await self._row(run_id)  # one row holds both: one statement, one snapshot
        if row is None:
            return None, None
        what = f"the record of graph run {run_id!r}"
        record = decode_row(_run_decoder, row[0], what)
        checkpoint = None if row[1] is None else decode_checkpoint_body(row[1])
        return keyed(record, record.run_id, run_id, what), checkpoint

    async def write_run(
        self,
        record: GraphRunRecord,
        *,
        checkpoint: GraphCheckpoint | None = None,
        delete_checkpoint: bool = False,
    ) -> None:
        raw = _encoder.encode(record)
        saved = None if checkpoint is None else _encoder.encode(checkpoint)

        def write(view: Any) -> None:
            if saved is not None or delete_checkpoint:
                view.connection.execute(
                    "INSERT INTO streamledger_graph_runs (run_id, id_digest, record, checkpoint)"
                    " VALUES (%s, md5(%s), %s, %s) ON CONFLICT (run_id)"
                    " DO UPDATE SET record = EXCLUDED.record, checkpoint = EXCLUDED.checkpoint",
                    (record.run_id, record.run_id, raw, saved),
                )
            else:
                view.connection.execute(
                    "INSERT INTO streamledger_graph_runs (run_id, id_digest, record)"
                    " VALUES (%s, md5(%s), %s) ON CONFLICT (run_id) DO UPDATE SET record = EXCLUDED.record",
                    (record.run_id, record.run_id, raw),
                )

        await self._connection.call(write, buffered=False)

    async def delete_run(self, run_id: str) -> None:
        await self._connection.call(
            lambda view: view.connection.execute(
                "DELETE FROM streamledger_graph_runs WHERE run_id = %s", (run_id,)
            ),
            buffered=False,
        )
