"""The node hooks on LMDB: :class:`~streams.store.CheckpointHooks` over the ledger's ``nodes`` database.

Every call is one write of the group committer (``open_child`` too: it
records the child's identity the first time), so node commits of concurrent
nodes share one transaction and one fsync. The rules are
:mod:`streams.store`'s, over :class:`LmdbNodeView`.

Keys of the ``nodes`` database (see :mod:`ledger.lmdb._layout`):

* ``a`` + a boundary's ``(parent, node, position)``: its :class:`~streams.store.NodeAttemptRecord`;
* ``s`` + a scope: its :class:`~streams.store.ScopeRecord`;
* ``n`` + a scope + a node: the node's confirmed :class:`~streams.store.NodeCheckpoint`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar

import lmdb
import msgspec

from streams import StoreDamagedError, store
from streams.store import (
    COMPLETE_CHAIN,
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    NodeAttemptRecord,
    NodeCheckpoint,
    ScopeRecord,
    parse_attempt_scope,
)

from ._env import LedgerEnv
from ._layout import NODE_ATTEMPT_PREFIX, node_attempt_key, node_record_key, node_scope_key, node_scope_prefix
from ._manifest import KeyTally, write_tally
from ._seal import decode_record, seal

__all__ = ["LmdbNodeHooks", "LmdbNodeView", "node_attempts", "node_record", "put_record", "scan"]

T = TypeVar("T")
DB: Final = "nodes"
_encoder: Final = msgspec.msgpack.Encoder()
_attempt_decoder: Final = msgspec.msgpack.Decoder(NodeAttemptRecord)
_scope_decoder: Final = msgspec.msgpack.Decoder(ScopeRecord)
_node_decoder: Final = msgspec.msgpack.Decoder(NodeCheckpoint)


class LmdbNodeView:
    """One node-hook call's records, inside one LMDB transaction (:class:`~streams.store.NodeView`)."""

    def __init__(self, txn: lmdb.Transaction, db: Any, meta: Any = None) -> None:
        self._txn = txn
        self._db = db
        self._meta = meta  # the ``meta`` database, where a new key is counted in the manifest
        self._added = KeyTally()  # the keys this call added, counted by settle() once

    def _get(self, key: bytes, decoder: msgspec.msgpack.Decoder[T]) -> T | None:
        raw = self._txn.get(key, db=self._db)
        return None if raw is None else decode_record(bytes(raw), decoder, db=DB, key=key)

    def _put(self, key: bytes, record: object) -> None:
        if self._txn.replace(key, seal(DB, key, _encoder.encode(record)), db=self._db) is None:
            self._added.added(key)

    def settle(self) -> None:
        """Count the keys this call added in the manifest: one update a call, not one a key."""
        write_tally(self._txn, self._meta, DB, self._added)
        self._added = KeyTally()

    def get_attempt(self, parent: str, node: str, position: int) -> NodeAttemptRecord | None:
        return self._get(node_attempt_key(parent, node, position), _attempt_decoder)

    def put_attempt(self, record: NodeAttemptRecord) -> None:
        self._put(node_attempt_key(record.parent, record.node, record.position), record)

    def get_scope(self, scope: str) -> ScopeRecord | None:
        return self._get(node_scope_key(scope), _scope_decoder)

    def put_scope(self, scope: str, record: ScopeRecord) -> None:
        self._put(node_scope_key(scope), record)

    def nodes(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        return tuple(self._scan(scope))

    def _scan(self, scope: str) -> Iterator[NodeCheckpoint]:
        prefix = node_scope_prefix(scope)
        with self._txn.cursor(db=self._db) as cursor:
            found = cursor.set_range(prefix)
            while found:
                key = bytes(cursor.key())
                if not key.startswith(prefix):
                    return
                yield decode_record(bytes(cursor.value()), _node_decoder, db=DB, key=key)
                found = cursor.next()

    def get_node(self, scope: str, node: str) -> NodeCheckpoint | None:
        return self._get(node_record_key(scope, node), _node_decoder)

    def put_node(self, scope: str, checkpoint: NodeCheckpoint) -> None:
        self._put(node_record_key(scope, checkpoint.node), checkpoint)

    def commit_first(self, commit: CheckpointCommit) -> bool:
        """:func:`streams.store.commit_node` of a first attempt the ledger holds no record of, or False.

        The common commit (a node's first attempt concluded, ending no
        stream) by the same rules, with each key built once and no record
        read: the boundary's committed record is put only if it has none
        (``overwrite=False``), the node's record with ``replace``, and one
        already there is the same damage ``commit_node`` reports (the call's
        nested transaction rolls back what it put). Anything else (a
        boundary with a record, a commit that ends streams or is not a first
        attempt's) returns False having written nothing, for the general rules.
        """
        if commit.streams:
            return False
        checkpoint = commit.checkpoint
        parent, node = commit.parent, checkpoint.node
        # the engine's scope (a limit of 1), which parses back to these very parts
        if "/" not in node and "@" not in node and commit.scope == f"{parent}/{node}@{COMPLETE_CHAIN}.1.0":
            position, limit, index = COMPLETE_CHAIN, 1, 0
        else:
            parsed = parse_attempt_scope(commit.scope)
            if parsed is None:
                return False
            parent, node, position, limit, index = parsed
        if (
            index
            or limit < 1
            or position != COMPLETE_CHAIN
            or parent != commit.parent
            or node != checkpoint.node
        ):
            return False
        txn, db = self._txn, self._db
        attempt_key = node_attempt_key(parent, node, position)
        attempt = NodeAttemptRecord(
            parent,
            node,
            position,
            limit,
            0,
            commit.scope,
            committed=True,
            started_at=commit.started_at,
            ended_at=commit.ended_at,
        )
        # put only where the boundary has no record: one look-up of its key, not a get and a put
        if not txn.put(attempt_key, seal(DB, attempt_key, _encoder.encode(attempt)), db=db, overwrite=False):
            return False  # nothing written: the boundary's record decides, by the general rules
        record_key = node_record_key(parent, node)
        if txn.replace(record_key, seal(DB, record_key, _encoder.encode(checkpoint)), db=db) is not None:
            raise StoreDamagedError(
                f"commit: node {node!r} in {parent!r} has a record its attempt does not know"
            )
        self._added.added(record_key)
        self._added.added(attempt_key)
        return True


class LmdbNodeHooks:
    """:class:`~streams.store.CheckpointHooks` on an open :class:`~ledger.LedgerEnv`: ``ledger.nodes``."""

    def __init__(self, env: LedgerEnv, streams: Any) -> None:
        self.env = env
        self._streams = streams
        self._db = env.db(DB)
        self._meta = env.db("meta")

    @property
    def streams(self) -> Any:
        """The ledger's :class:`~streams.StreamHooks`."""
        return self._streams

    async def _write(self, op: Callable[[LmdbNodeView], T]) -> T:
        db, meta = self._db, self._meta

        def write(txn: lmdb.Transaction) -> T:
            view = LmdbNodeView(txn, db, meta)
            result = op(view)
            view.settle()
            return result

        return await self.env.write(write)

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        """A read, never a write: a first attempt's record is written with its first failure or commit."""
        with self.env.read() as txn:
            return store.open_attempt(LmdbNodeView(txn, self._db), request)

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        return await self._write(lambda view: store.fail_attempt(view, scope, failure))

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        return await self._write(lambda view: store.open_child(view, child))

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        """The nodes' records and their streams' successful ends, in one transaction."""
        streams, db, meta = self._streams, self._db, self._meta
        if not any(commit.streams for commit in commits):

            def records(txn: lmdb.Transaction) -> None:
                view = LmdbNodeView(txn, db, meta)
                for commit in commits:
                    if not view.commit_first(commit):
                        store.commit_node(view, commit)
                view.settle()

            await self.env.write(records)
            return

        def write(txn: lmdb.Transaction) -> Any:
            nodes, view = LmdbNodeView(txn, db, meta), streams.bind(txn)
            for commit in commits:
                store.commit_node(nodes, commit)
                for finish in commit.streams:
                    store.finish(view, finish)
            nodes.settle()
            view.flush()
            return view

        streams.learn(await self.env.write(write))

    # -- reading (no write, no wait on the writer) -----------------------------------------

    async def node_records(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        """The confirmed nodes of execution scope ``scope``, for a restore plan."""
        with self.env.read() as txn:
            return LmdbNodeView(txn, self._db).nodes(scope)

    async def scope_failed(self, scope: str) -> bool:
        """Whether a final failure was confirmed in execution scope ``scope``."""
        with self.env.read() as txn:
            record = LmdbNodeView(txn, self._db).get_scope(scope)
        return record is not None and record.failed


def put_record(txn: Any, db: Any, meta: Any, key: bytes, body: bytes) -> None:
    """Put a record of the ``nodes`` database; a key it did not hold is counted in its manifest."""
    if txn.replace(key, seal(DB, key, body), db=db) is None:
        tally = KeyTally()
        tally.added(key)
        write_tally(txn, meta, DB, tally)


def scan(env: LedgerEnv, prefix: bytes, decoder: msgspec.msgpack.Decoder[T]) -> Iterator[T]:
    """Every record of the ``nodes`` database under ``prefix``, decoded, from one snapshot."""
    if not env.has_db(DB):
        return
    with env.read() as txn, txn.cursor(db=env.db(DB)) as cursor:
        found = cursor.set_range(prefix)
        while found:
            key = bytes(cursor.key())
            if not key.startswith(prefix):
                return
            yield decode_record(bytes(cursor.value()), decoder, db=DB, key=key)
            found = cursor.next()


def node_attempts(env: LedgerEnv) -> Iterator[NodeAttemptRecord]:
    """Every retry boundary of the ledger (for inspection)."""
    return scan(env, NODE_ATTEMPT_PREFIX, _attempt_decoder)


def node_record(env: LedgerEnv, scope: str, node: str) -> NodeCheckpoint | None:
    """The confirmed record of ``node`` in ``scope``, if any."""
    with env.read() as txn:
        return LmdbNodeView(txn, env.db(DB)).get_node(scope, node)
