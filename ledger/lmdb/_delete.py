"""Delete a run from an LMDB ledger: its record, its node records and its streams, in one transaction.

The run's scopes are the root scope of each of its attempts and every scope
the engine opened under one (:func:`ledger._runs.in_root_scope`). Its node
records are the retry boundaries whose parent is such a scope, the scope
records, and the confirmed nodes of those scopes; its streams are those
whose scope is one, with their messages, group frontiers, budgets and keyed
state. The ``attempts``, ``nodes``, ``keyed`` and ``keyed_log`` manifests are counted down
in the same transaction.

A stream id is never freed (``check`` holds every id up to the counter to a
descriptor): a deleted stream's descriptor and index entry give way to a
tombstone, ``x`` + its id in the ``streams`` database, naming the stream
that had it. The index entry goes, so a new run under the same run id opens
new streams with new ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

import lmdb
import msgspec

from streams import StreamRef
from streams.store import NodeAttemptRecord, ScopeRecord, StreamDescriptor, child_scope

from .._errors import UnknownRunError
from .._runs import RunDeleted, RunRecord, in_root_scope, not_ended
from ._layout import (
    DESCRIPTOR_PREFIX,
    NODE_ATTEMPT_PREFIX,
    NODE_SCOPE_PREFIX,
    U64,
    deleted_key,
    descriptor_key,
    index_key,
    node_run_key,
    node_scope_key,
    node_scope_prefix,
)
from ._manifest import KeyTally, write_tally
from ._seal import decode_record, seal
from ._view import decode_run

__all__ = ["delete_run"]

_encoder: Final = msgspec.msgpack.Encoder()
_run_decoder: Final = msgspec.msgpack.Decoder(RunRecord)
_attempt_decoder: Final = msgspec.msgpack.Decoder(NodeAttemptRecord)
_scope_decoder: Final = msgspec.msgpack.Decoder(ScopeRecord)
_descriptor_decoder: Final = msgspec.msgpack.Decoder(StreamDescriptor)


def _under(txn: lmdb.Transaction, db: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every record of ``db`` whose key starts with ``prefix``, in key order."""
    with txn.cursor(db=db) as cursor:
        found = cursor.set_range(prefix)
        while found:
            key = bytes(cursor.key())
            if not key.startswith(prefix):
                return
            yield key, bytes(cursor.value())
            found = cursor.next()


def _remove(txn: lmdb.Transaction, db: Any, keys: list[bytes], tally: KeyTally | None = None) -> None:
    for key in keys:
        txn.delete(key, db=db)
        if tally is not None:
            tally.removed(key)


def delete_run(
    txn: lmdb.Transaction, dbs: dict[str, Any], record: RunRecord
) -> tuple[RunDeleted, list[StreamRef]]:
    """Remove run ``record`` in write transaction ``txn``; what went, and the streams that went."""
    nodes, meta = dbs["nodes"], dbs["meta"]
    run_key = node_run_key(record.run_id)
    raw = txn.get(run_key, db=nodes)
    if raw is None:
        raise UnknownRunError(f"the ledger has no run {record.run_id!r}")
    current = decode_record(bytes(raw), _run_decoder, db="nodes", key=run_key)
    if current.status == "running" and record.status != "running":  # resumed since it was read
        raise not_ended(record.run_id)
    roots = record.scopes

    def belongs(scope: str) -> bool:
        return any(in_root_scope(scope, root) for root in roots)

    doomed, scopes = [run_key], set(roots)
    for key, value in _under(txn, nodes, NODE_ATTEMPT_PREFIX):
        boundary = decode_record(value, _attempt_decoder, db="nodes", key=key)
        if belongs(boundary.parent):
            doomed.append(key)
            scopes.add(boundary.parent)
    root_keys = {node_scope_key(root) for root in roots}
    for key, value in _under(txn, nodes, NODE_SCOPE_PREFIX):
        child = decode_record(value, _scope_decoder, db="nodes", key=key).child
        if key in root_keys or (child is not None and belongs(child_scope(child.parent, child.mount))):
            doomed.append(key)
    for scope in scopes:
        doomed.extend(key for key, _ in _under(txn, nodes, node_scope_prefix(scope)))
    tally = KeyTally()
    _remove(txn, nodes, doomed, tally)
    write_tally(txn, meta, "nodes", tally)
    gone, messages = _delete_streams(txn, dbs, lambda desc: belongs(desc.ref.scope))
    return RunDeleted(record.run_id, len(gone), messages, len(doomed) - 1), gone


def _delete_streams(
    txn: lmdb.Transaction, dbs: dict[str, Any], chosen: Callable[[StreamDescriptor], bool]
) -> tuple[list[StreamRef], int]:
    streams = dbs["streams"]
    found = [
        (U64.unpack_from(key, 1)[0], desc)
        for key, value in _under(txn, streams, DESCRIPTOR_PREFIX)
        if len(key) == 9 and chosen(desc := decode_record(value, _descriptor_decoder, db="streams", key=key))
    ]
    messages = 0
    budgets, keyed, keyed_log = KeyTally(), KeyTally(), KeyTally()
    for stream_id, desc in found:
        prefix = U64.pack(stream_id)
        runs = list(_under(txn, dbs["messages"], prefix))
        messages += sum(len(decode_run(key, value)) for key, value in runs)
        _remove(txn, dbs["messages"], [key for key, _ in runs])
        _remove(txn, dbs["groups"], [key for key, _ in _under(txn, dbs["groups"], prefix)])
        _remove(txn, dbs["attempts"], [key for key, _ in _under(txn, dbs["attempts"], prefix)], budgets)
        if "keyed" in dbs:
            _remove(txn, dbs["keyed"], [key for key, _ in _under(txn, dbs["keyed"], prefix)], keyed)
        if "keyed_log" in dbs:
            log = dbs["keyed_log"]
            _remove(txn, log, [key for key, _ in _under(txn, log, prefix)], keyed_log)
        _remove(txn, streams, [index_key(desc.ref), descriptor_key(stream_id)])
        tombstone = deleted_key(stream_id)
        txn.put(tombstone, seal("streams", tombstone, _encoder.encode(str(desc.ref))), db=streams)
    write_tally(txn, dbs["meta"], "attempts", budgets)
    if "keyed" in dbs:
        write_tally(txn, dbs["meta"], "keyed", keyed)
    if "keyed_log" in dbs:
        write_tally(txn, dbs["meta"], "keyed_log", keyed_log)
    return [desc.ref for _, desc in found], messages
