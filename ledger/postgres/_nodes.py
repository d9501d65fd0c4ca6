"""The node hooks on PostgreSQL: :class:`~streams.store.CheckpointHooks` over three tables of the ledger.

The rules are :mod:`streams.store`'s, over :class:`PgNodeView`; a node's
record and its streams' successful ends are confirmed in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeVar

import msgspec

from streams import store
from streams.store import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    NodeAttemptRecord,
    NodeCheckpoint,
    ScopeRecord,
)

from ._store import Calls
from ._streams import PgStreamHooks
from ._view import PgView, decode_row, keyed

__all__ = ["PgNodeHooks", "PgNodeView"]

T = TypeVar("T")
_encoder: Final = msgspec.msgpack.Encoder()
_attempt_decoder: Final = msgspec.msgpack.Decoder(NodeAttemptRecord)
_scope_decoder: Final = msgspec.msgpack.Decoder(ScopeRecord)
_node_decoder: Final = msgspec.msgpack.Decoder(NodeCheckpoint)


class PgNodeView:
    """One node-hook call's records, inside one PostgreSQL transaction (:class:`~streams.store.NodeView`)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def get_attempt(self, parent: str, node: str, position: int) -> NodeAttemptRecord | None:
        row = self._conn.execute(
            "SELECT record FROM streamledger_node_attempts WHERE parent = %s AND node = %s AND position = %s",
            (parent, node, position),
        ).fetchone()
        if row is None:
            return None
        what = f"the attempt of {node!r} under {parent!r}"
        record = decode_row(_attempt_decoder, row[0], what)
        return keyed(record, (record.parent, record.node, record.position), (parent, node, position), what)

    def put_attempt(self, record: NodeAttemptRecord) -> None:
        self._conn.execute(
            "INSERT INTO streamledger_node_attempts (parent, node, position, record) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (parent, node, position) DO UPDATE SET record = EXCLUDED.record",
            (record.parent, record.node, record.position, _encoder.encode(record)),
        )

    def get_scope(self, scope: str) -> ScopeRecord | None:
        row = self._conn.execute(
            "SELECT record FROM streamledger_scopes WHERE scope = %s", (scope,)
        ).fetchone()
        return None if row is None else decode_row(_scope_decoder, row[0], f"the record of scope {scope!r}")

    def put_scope(self, scope: str, record: ScopeRecord) -> None:
        self._conn.execute(
            "INSERT INTO streamledger_scopes (scope, record) VALUES (%s, %s)"
            " ON CONFLICT (scope) DO UPDATE SET record = EXCLUDED.record",
            (scope, _encoder.encode(record)),
        )

    def nodes(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        """The confirmed nodes of ``scope``, each committed attempt's record among them (else damage)."""
        rows = self._conn.execute(
            "SELECT node, record FROM streamledger_nodes WHERE scope = %s ORDER BY node", (scope,)
        ).fetchall()
        records = tuple(self._node(scope, node, raw) for node, raw in rows)
        boundaries = []
        for node, position, raw in self._conn.execute(
            "SELECT node, position, record FROM streamledger_node_attempts WHERE parent = %s", (scope,)
        ):
            what = f"the attempt of {node!r} under {scope!r}"
            attempt = decode_row(_attempt_decoder, raw, what)
            boundaries.append(keyed(attempt, (attempt.node, attempt.position), (node, position), what))
        store.check_confirmed(scope, records, boundaries)
        return records

    def get_node(self, scope: str, node: str) -> NodeCheckpoint | None:
        row = self._conn.execute(
            "SELECT record FROM streamledger_nodes WHERE scope = %s AND node = %s", (scope, node)
        ).fetchone()
        return None if row is None else self._node(scope, node, row[0])

    @staticmethod
    def _node(scope: str, node: str, raw: bytes) -> NodeCheckpoint:
        what = f"the record of node {node!r} in scope {scope!r}"
        record = decode_row(_node_decoder, raw, what)
        return keyed(record, record.node, node, what)

    def put_node(self, scope: str, checkpoint: NodeCheckpoint) -> None:
        self._conn.execute(
            "INSERT INTO streamledger_nodes (scope, node, record) VALUES (%s, %s, %s)"
            " ON CONFLICT (scope, node) DO UPDATE SET record = EXCLUDED.record",
            (scope, checkpoint.node, _encoder.encode(checkpoint)),
        )


class PgNodeHooks:
    """:class:`~streams.store.CheckpointHooks` on a PostgreSQL ledger: ``ledger.nodes``."""

    def __init__(self, connection: Calls, streams: PgStreamHooks) -> None:
        self._connection = connection
        self._streams = streams

    @property
    def streams(self) -> PgStreamHooks:
        """The ledger's :class:`~streams.StreamHooks`."""
        return self._streams

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        return await self._connection.call(
            lambda view: store.open_attempt(PgNodeView(view.connection), request)
        )

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        return await self._connection.call(
            lambda view: store.fail_attempt(PgNodeView(view.connection), scope, failure), buffered=False
        )

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        return await self._connection.call(
            lambda view: store.open_child(PgNodeView(view.connection), child), buffered=False
        )

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        """The nodes' records and their streams' successful ends, in one transaction."""
        batch = tuple(commits)

        def write(view: PgView) -> None:
            nodes = PgNodeView(view.connection)
            for commit in batch:
                store.commit_node(nodes, commit)
                for finish in commit.streams:
                    store.finish(view, finish)

        await self._connection.call(write, buffered=False)

    # -- reading -----------------------------------------------------------------------------

    async def node_records(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        """The confirmed nodes of execution scope ``scope``, for a restore plan."""
        return await self._connection.read(lambda view: PgNodeView(view.connection).nodes(scope))

    async def scope_failed(self, scope: str) -> bool:
        """Whether a final failure was confirmed in execution scope ``scope``."""
        record = await self._connection.read(lambda view: PgNodeView(view.connection).get_scope(scope))
        return record is not None and record.failed
