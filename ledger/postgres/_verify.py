"""What a PostgreSQL ledger verifies when it is opened: its streams and their groups, whole.

Both tables are small beside the ledger's history (a row per stream, a row
per consumer group), and they are what every reopened stream is found by:
a stream whose row was moved to another scope, node or key would be
created anew, and a group whose row moved would start again from the first
message. So every open (a program's, a worker's, ``inspect``'s) reads both
whole, in the snapshot it opens, and refuses the ledger with
:class:`~ledger.CorruptRecordError` when a row does not name its key, when a
group's row belongs to no stream that lists it, or when a stream lists a
group with no row. Keyed state is checked the same way, by its owners only:
a group's keys are deleted with it, in the same transaction, so a key of a
group no stream lists is damage (and a group made again with that name
would find it as its own). The owners are read from the keyed table's
index, one step per group, never its rows. Nothing is written. The rest
(messages, budgets, runs, nodes, keyed values) is checked where it is read
(``keyed`` in ``_view.py``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from streams import GroupFrontier, StreamRef
from streams.store import StreamDescriptor, group_problems

from .._errors import CorruptRecordError
from ._view import decode_row

__all__ = ["keyed_owner_problem", "verify_streams"]

_descriptor: Final = msgspec.msgpack.Decoder(StreamDescriptor)
_frontier: Final = msgspec.msgpack.Decoder(GroupFrontier)

#: Every group that keeps keyed state, as ``(stream_id, grp)``, in order: one descent of the
#: primary key's index per group (a skip scan), whatever the number of keys.
_KEYED_OWNERS: Final = """
WITH RECURSIVE owners (stream_id, grp) AS (
    (SELECT stream_id, grp FROM streamledger_keyed ORDER BY stream_id, grp LIMIT 1)
    UNION ALL
    SELECT next.stream_id, next.grp FROM owners, LATERAL (
        SELECT k.stream_id, k.grp FROM streamledger_keyed k
        WHERE (k.stream_id, k.grp) > (owners.stream_id, owners.grp)
        ORDER BY k.stream_id, k.grp LIMIT 1
    ) AS next
)
SELECT stream_id, grp FROM owners
"""


def verify_streams(conn: Any, where: str) -> None:
    """Refuse the ledger if its streams, groups and keyed state do not agree with each other.

    All are read in one transaction (a savepoint inside the caller's): two
    snapshots could see a stream another worker created between them.
    """
    with conn.transaction():
        _verify(conn, where)


def _verify(conn: Any, where: str) -> None:
    streams: dict[int, StreamDescriptor] = {}
    for stream_id, scope, node, key, raw in conn.execute(
        "SELECT id, scope, node, key, descriptor FROM streamledger_streams WHERE descriptor IS NOT NULL"
    ):
        ref = StreamRef(scope, node, key)
        desc = decode_row(_descriptor, raw, f"the descriptor of stream {ref}")
        if desc.ref != ref:
            raise _damaged(
                where, f"the row of stream {ref} (id {stream_id}) holds the descriptor of {desc.ref}"
            )
        streams[stream_id] = desc
    frontiers: dict[int, dict[str, GroupFrontier]] = {stream_id: {} for stream_id in streams}
    for stream_id, name, raw in conn.execute("SELECT stream_id, name, frontier FROM streamledger_groups"):
        frontier = decode_row(_frontier, raw, f"the frontier of group {name!r} of stream id {stream_id}")
        if stream_id not in streams:
            raise _damaged(where, f"group {name!r} belongs to stream id {stream_id}, which has no descriptor")
        if frontier.group != name:
            raise _damaged(where, f"the row of group {name!r} holds the frontier of group {frontier.group!r}")
        frontiers[stream_id][name] = frontier
    for stream_id, desc in streams.items():
        problems = group_problems(desc, frontiers[stream_id])  # the rule LMDB's open applies too
        if problems:
            raise _damaged(where, problems[0])
    for stream_id, group in conn.execute(_KEYED_OWNERS):
        if group not in frontiers.get(stream_id, {}):
            raise _damaged(where, keyed_owner_problem(streams.get(stream_id), stream_id, group))


def keyed_owner_problem(desc: StreamDescriptor | None, stream_id: int, group: str) -> str:
    """What is wrong with keyed state kept for a group its stream does not have (or of no stream)."""
    if desc is None:
        return f"keyed state of group {group!r} belongs to stream id {stream_id}, which has no descriptor"
    return f"stream {desc.ref} holds keyed state of group {group!r}, which it does not list"


def _damaged(where: str, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{where}: {what}; the ledger is damaged: restore it from a backup (nothing was changed)"
    )
