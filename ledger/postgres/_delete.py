"""Delete a run from a PostgreSQL ledger: its record, its node records and its streams, in one transaction.

What belongs to the run is what :mod:`ledger.lmdb._delete` says: every scope
of its attempts (:func:`ledger._runs.in_root_scope`), their retry
boundaries, scope records and confirmed nodes, and the streams of those
scopes with their messages, group frontiers, budgets, keyed state, members
and partition leases. A deleted stream keeps its row with no descriptor (a
stream whose descriptor is not written yet, as a new one is), so an id
another process still remembers for that stream names the same row: a new
run under the same run id opens it as a new stream. The run's row is locked
first, so a worker claiming it waits, and one that claimed it since it was
read makes the delete refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from streams import StreamRef
from streams.store import ScopeRecord, StreamDescriptor, child_scope

from .._errors import UnknownRunError
from .._runs import RunDeleted, RunRecord, in_root_scope, not_ended
from ._view import decode_row

__all__ = ["delete_run"]

_run_decoder: Final = msgspec.msgpack.Decoder(RunRecord)
_scope_decoder: Final = msgspec.msgpack.Decoder(ScopeRecord)
_descriptor_decoder: Final = msgspec.msgpack.Decoder(StreamDescriptor)
#: The tables of a stream's records, keyed by its id.
_BY_STREAM_ID: Final = (
    "streamledger_messages",
    "streamledger_groups",
    "streamledger_attempts",
    "streamledger_keyed",
)


def _under(roots: tuple[str, ...]) -> tuple[str, list[str]]:
    """A SQL condition on ``{column}`` for the scopes that may belong to ``roots``, and its parameters."""
    clause = " OR ".join("({column} = %s OR left({column}, %s) = %s)" for _ in roots)
    params: list[Any] = []
    for root in roots:
        params.extend((root, len(root) + 1, root + "/"))
    return clause, params


def delete_run(conn: Any, record: RunRecord) -> RunDeleted:
    """Remove run ``record`` in the transaction of ``conn``."""
    row = conn.execute(
        "SELECT record FROM streamledger_runs WHERE run_id = %s FOR UPDATE", (record.run_id,)
    ).fetchone()
    if row is None:
        raise UnknownRunError(f"the ledger has no run {record.run_id!r}")
    current = decode_row(_run_decoder, row[0], f"the record of run {record.run_id!r}")
    if current.status == "running" and record.status != "running":  # claimed since it was read
        raise not_ended(record.run_id)
    roots = record.scopes

    def belongs(scope: str) -> bool:
        return any(in_root_scope(scope, root) for root in roots)

    clause, params = _under(roots)
    boundaries = [
        (parent, node, position)
        for parent, node, position in conn.execute(
            "SELECT parent, node, position FROM streamledger_node_attempts WHERE "
            + clause.format(column="parent"),
            params,
        ).fetchall()
        if belongs(parent)
    ]
    scopes = set(roots) | {parent for parent, _, _ in boundaries}
    records = len(boundaries)
    for scope, raw in conn.execute(
        "SELECT scope, record FROM streamledger_scopes WHERE " + clause.format(column="scope"), params
    ).fetchall():
        child = decode_row(_scope_decoder, raw, f"the record of scope {scope!r}").child
        if scope in roots or (child is not None and belongs(child_scope(child.parent, child.mount))):
            scopes.add(scope)
    if boundaries:
        conn.execute(
            "DELETE FROM streamledger_node_attempts WHERE (parent, node, position) IN"
            " (SELECT * FROM unnest(%s::text[], %s::text[], %s::integer[]))",
            ([b[0] for b in boundaries], [b[1] for b in boundaries], [b[2] for b in boundaries]),
        )
    for table in ("streamledger_scopes", "streamledger_nodes"):
        records += conn.execute(f"DELETE FROM {table} WHERE scope = ANY(%s)", (sorted(scopes),)).rowcount
    streams, messages = _delete_streams(conn, clause, params, belongs)
    conn.execute("DELETE FROM streamledger_leases WHERE run_id = %s", (record.run_id,))
    conn.execute("DELETE FROM streamledger_runs WHERE run_id = %s", (record.run_id,))
    return RunDeleted(record.run_id, len(streams), messages, records)


def _delete_streams(
    conn: Any, clause: str, params: list[Any], belongs: Callable[[str], bool]
) -> tuple[list[StreamRef], int]:
    found = [
        (stream_id, decode_row(_descriptor_decoder, raw, f"the descriptor of stream id {stream_id}"))
        for stream_id, scope, raw in conn.execute(
            "SELECT id, scope, descriptor FROM streamledger_streams WHERE descriptor IS NOT NULL AND ("
            + clause.format(column="scope")
            + ")",
            params,
        ).fetchall()
        if belongs(scope)
    ]
    if not found:
        return [], 0
    ids = [stream_id for stream_id, _ in found]
    messages = conn.execute(
        "SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM streamledger_messages"
        " WHERE stream_id = ANY(%s)",
        (ids,),
    ).fetchone()[0]
    for table in _BY_STREAM_ID:
        conn.execute(f"DELETE FROM {table} WHERE stream_id = ANY(%s)", (ids,))
    names = sorted({str(desc.ref) for _, desc in found} | {_whole(desc) for _, desc in found})
    for table in ("streamledger_partition_leases", "streamledger_members"):
        conn.execute(f"DELETE FROM {table} WHERE stream = ANY(%s)", (names,))
    conn.execute("UPDATE streamledger_streams SET descriptor = NULL WHERE id = ANY(%s)", (ids,))
    return [desc.ref for _, desc in found], int(messages)


def _whole(desc: StreamDescriptor) -> str:
    """The name of the partitioned stream a partition's descriptor is of (members and leases name it)."""
    if not desc.partitions:
        return str(desc.ref)
    key = desc.ref.key.rpartition("#")[0]
    return str(StreamRef(desc.ref.scope, desc.ref.node, key))
