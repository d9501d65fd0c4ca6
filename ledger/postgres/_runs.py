"""The runs of a PostgreSQL ledger: ``ledger.run`` and ``ledger.resume`` with records in a table."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from .._format import run_id_bytes
from .._runs import RunDeleted, RunRecord, cancelled_meanwhile, run_exists
from ._delete import delete_run
from ._nodes import PgNodeHooks
from ._notify import CHANNEL, RUNS, cancelled_topic
from ._store import Calls
from ._view import decode_row, keyed, run_row, sound_digest

__all__ = ["PgRunBook"]

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(RunRecord)


#: A run's record written again. A run made running again (retried) is due for a worker, and the
#: worker holding a run cancelled should stop it: either tells the listeners
#: (:mod:`ledger.postgres._notify`) when it commits; a record written with its status unchanged
#: (a run resumed, say) tells nobody. ``old`` reads the row as it was before the statement.
_UPDATE: Final = f"""
WITH old AS (SELECT status FROM streamledger_runs WHERE run_id = %(run_id)s),
written AS (
    INSERT INTO streamledger_runs (run_id, id_digest, status, graph, version, record)
    VALUES (%(run_id)s, md5(%(run_id)s), %(status)s, %(graph)s, %(version)s, %(record)s)
    ON CONFLICT (run_id) DO UPDATE SET status = EXCLUDED.status, record = EXCLUDED.record
)
SELECT pg_notify('{CHANNEL}', %(told)s) FROM old
WHERE old.status <> %(status)s AND %(status)s IN ('running', 'cancelled')
"""


#: A run's record written again unless the run was cancelled since it was read (a row it finds, or none).
_UPDATE_UNLESS_CANCELLED: Final = (
    "UPDATE streamledger_runs SET status = %s, record = %s WHERE run_id = %s AND status <> 'cancelled'"
    " RETURNING 1"
)


def _record(run_id: str, raw: bytes) -> RunRecord:
    what = f"the record of run {run_id!r}"
    record = decode_row(_decoder, raw, what)
    return keyed(record, record.run_id, run_id, what)


class PgRunBook:
    """:class:`~ledger.RunBook` over the ``streamledger_runs`` table."""

    def __init__(self, connection: Calls, nodes: PgNodeHooks) -> None:
        self._connection = connection
        self._nodes = nodes

    @property
    def where(self) -> str:
        return self._connection.where

    @property
    def nodes(self) -> PgNodeHooks:
        return self._nodes

    async def read(self, run_id: str) -> RunRecord | None:
        def read(view: Any) -> RunRecord | None:
            row = run_row(view.connection, "streamledger_runs", "record", run_id)
            return None if row is None else _record(run_id, row[0])

        return await self._connection.call(read, idempotent=True)

    async def write(self, record: RunRecord, *, new: bool, unless_cancelled: bool = False) -> None:
        run_id_bytes(record.run_id)  # the same run ids as on LMDB, or InvalidRunIdError
        raw = _encoder.encode(record)

        def write(view: Any) -> None:
            conn = view.connection
            if new:
                if run_row(conn, "streamledger_runs", "run_id", record.run_id) is not None:
                    raise run_exists(record.run_id)  # (a row moved under another id is damage, above)
                inserted = conn.execute(
                    "INSERT INTO streamledger_runs (run_id, id_digest, status, graph, version, record)"
                    " VALUES (%s, md5(%s), %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
                    (record.run_id, record.run_id, record.status, record.graph, record.version, raw),
                ).fetchone()
                if inserted is None:
                    raise run_exists(record.run_id)
                if record.status == "running":  # submitted: due for a worker
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, RUNS))
            elif unless_cancelled:  # its status stays: nobody is told
                if not conn.execute(_UPDATE_UNLESS_CANCELLED, (record.status, raw, record.run_id)).fetchall():
                    raise cancelled_meanwhile(record.run_id)
            else:
                conn.execute(
                    _UPDATE,
                    {
                        "run_id": record.run_id,
                        "status": record.status,
                        "graph": record.graph,
                        "version": record.version,
                        "record": raw,
                        "told": RUNS if record.status == "running" else cancelled_topic(record.run_id),
                    },
                ).fetchall()

        await self._connection.call(write, buffered=False)

    async def records(self) -> list[RunRecord]:
        def read(view: Any) -> list[RunRecord]:
            rows = view.connection.execute(
                "SELECT run_id, id_digest = md5(run_id), record FROM streamledger_runs ORDER BY run_id"
            ).fetchall()
            found = []
            for run_id, sound, raw in rows:
                sound_digest(sound, run_id, "streamledger_runs")
                found.append(_record(run_id, raw))
            return found

        return await self._connection.read(read)

    async def delete(self, record: RunRecord) -> RunDeleted:
        return await self._connection.call(lambda view: delete_run(view.connection, record), buffered=False)
