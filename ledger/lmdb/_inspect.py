"""``inspect`` and ``messages`` of an LMDB ledger: the neutral reports, from one read-only environment.

Both read beside a running owner (the environment opened read-only) and
write nothing.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from streams import GroupFrontier, StreamRef

from .._errors import StreamNotFoundError
from .._inspect import graph_runs_report, node_runs_report, stream_entry
from .._messages import KeyFilter, keys_of, messages_of
from .._progress import SILENT, Progress
from ._backend import list_runs as list_node_runs
from ._env import LedgerEnv
from ._graph_runs import list_runs
from ._layout import DESCRIPTOR_PREFIX
from ._nodes import node_attempts, node_record
from ._owner import read_owner
from ._view import LmdbView, decode_descriptor, decode_frontier

__all__ = ["inspect_ledger", "view_messages"]


def inspect_ledger(env: LedgerEnv, *, values: bool = False) -> dict[str, Any]:
    """Every stream of the ledger with its groups, and every graph run, as plain JSON values.

    Committed states are decoded to plain values; bytes inside them become
    base64 strings. Graph runs hold no values of the graph unless ``values``
    is true, when each run's latest checkpoint adds its state, graph inputs,
    next task's inputs and output as the JSON they were saved as. Reads one
    consistent snapshot per part; writes nothing.
    """
    streams: list[dict[str, Any]] = []
    if not (env.has_db("streams") and env.has_db("groups")):  # a creation interrupted before them
        return _report(env, streams, values=values)
    streams_db, groups_db = env.db("streams"), env.db("groups")
    with env.read() as txn, txn.cursor(db=streams_db) as cursor:
        found = cursor.set_range(DESCRIPTOR_PREFIX)
        while found:
            key, value = (bytes(b) for b in cursor.item())
            if not key.startswith(DESCRIPTOR_PREFIX):
                break
            desc = decode_descriptor(key, value)
            frontiers: list[tuple[GroupFrontier, str]] = []
            prefix = key[len(DESCRIPTOR_PREFIX) :]
            with txn.cursor(db=groups_db) as group_cursor:
                group_found = group_cursor.set_range(prefix)
                while group_found:
                    gkey, gvalue = (bytes(b) for b in group_cursor.item())
                    if not gkey.startswith(prefix):
                        break
                    frontiers.append(
                        (decode_frontier(gkey, gvalue), f"record {gkey.hex()} of database 'groups'")
                    )
                    group_found = group_cursor.next()
            streams.append(stream_entry(desc, frontiers))
            found = cursor.next()
    return _report(env, streams, values=values)


def _report(env: LedgerEnv, streams: list[dict[str, Any]], *, values: bool) -> dict[str, Any]:
    owner = read_owner(env.path)  # the process that has it open for writing, as it said
    return {
        "path": str(env.path),
        "owner": owner,
        "streams": streams,
        "runs": _node_runs(env, values=values, unowned=owner is None or owner["running"] is False),
        "graph_runs": _graph_runs(env, values=values),
    }


def _node_runs(env: LedgerEnv, *, values: bool, unowned: bool) -> list[dict[str, Any]]:
    """The runs of ``ledger.run``; ``unowned``: no process owns the ledger (it closed it, or was killed;
    one of another host is taken to run), so a run recorded running is interrupted."""
    runs = list(list_node_runs(env))
    if not runs:
        return []
    return node_runs_report(
        runs, list(node_attempts(env)), partial(node_record, env), values=values, unowned=unowned
    )


def _graph_runs(env: LedgerEnv, *, values: bool) -> list[dict[str, Any]]:
    return graph_runs_report(list_runs(env), values=values)


def view_messages(
    env: LedgerEnv,
    ref: StreamRef,
    *,
    start: int = 1,
    limit: int | None = None,
    last: int | None = None,
    key: KeyFilter | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    """The confirmed messages of ``ref`` in the LMDB ledger ``env`` (:func:`messages_of`)."""
    if not (env.has_db("streams") and env.has_db("messages")):
        raise StreamNotFoundError(f"the ledger at {env.path} holds no stream {ref}")
    dbs = {name: env.db(name) for name in ("streams", "messages")}
    where = f"the ledger at {env.path}"
    with env.read() as txn:
        view = LmdbView(txn, dbs, {})
        return messages_of(view, ref, where, start=start, limit=limit, last=last, key=key, progress=progress)


def view_keys(
    env: LedgerEnv,
    ref: StreamRef,
    group: str,
    *,
    start: bytes = b"",
    stop: bytes | None = None,
    limit: int = 100,
) -> dict[str, Any]:
    """The confirmed keyed state of ``group`` on ``ref`` in the LMDB ledger ``env`` (:func:`keys_of`)."""
    if not (env.has_db("streams") and env.has_db("groups")):
        raise StreamNotFoundError(f"the ledger at {env.path} holds no stream {ref}")
    dbs = {name: env.db(name) for name in ("streams", "groups", "keyed", "keyed_log") if env.has_db(name)}
    with env.read() as txn:
        view = LmdbView(txn, dbs, {}, logs=env.keyed_logs)  # decoded logs, where its snapshot agrees
        return keys_of(view, ref, group, f"the ledger at {env.path}", start=start, stop=stop, limit=limit)
