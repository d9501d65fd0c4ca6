"""What a PostgreSQL ledger verifies when it is opened: its streams and their groups, whole.

Both tables are small beside the ledger's history (a row per stream, a row
per consumer group), and they are what every reopened stream is found by:
a stream whose row was moved to another scope, node or key would be
created anew, and a group whose row moved would start again from the first
message. So every open (a program's, a worker's, ``inspect``'s) reads both
whole, in the snapshot it opens, and refuses the ledger with
:class:`~ledger.CorruptRecordError` when a row does not name its key, when a
group's row belongs to no stream that lists it, or when a stream lists a
group with no row. Nothing is written. The rest (messages, budgets, runs,
nodes) is checked where it is read (``keyed`` in ``_view.py``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from streams import GroupFrontier, StreamRef
from streams.store import StreamDescriptor, group_problems

from .._errors import CorruptRecordError
from ._view import decode_row

__all__ = ["verify_streams"]

_descriptor: Final = msgspec.msgpack.Decoder(StreamDescriptor)
_frontier: Final = msgspec.msgpack.Decoder(GroupFrontier)


def verify_streams(conn: Any, where: str) -> None:
    """Refuse the ledger if its streams or groups tables do not agree with each other (reads both).

    Both are read in one transaction (a savepoint inside the caller's): two
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


def _damaged(where: str, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{where}: {what}; the ledger is damaged: restore it from a backup (nothing was changed)"
    )
