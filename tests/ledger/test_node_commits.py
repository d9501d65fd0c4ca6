"""The LMDB ledger's node commits: a first attempt's commit writes what the store's rules write, no more.

``commit_nodes`` takes a shorter path for the common commit (a node's first
attempt, ending no stream, its boundary without a record); these tests pin
that it keeps every rule of :func:`streams.store.commit_node`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ledger import open_ledger
from ledger.lmdb._layout import node_record_key
from ledger.lmdb._nodes import node_attempts, node_record, put_record
from streams import CheckpointError, StoreDamagedError
from streams.store import (
    COMPLETE_CHAIN,
    CheckpointAttemptRequest,
    CheckpointCommit,
    CheckpointOutput,
    NodeAttemptRecord,
    NodeCheckpoint,
)


def _record(node: str, value: bytes = b"\x01") -> NodeCheckpoint:
    return NodeCheckpoint(node, "completed", (CheckpointOutput("k", "ready", value),))


async def test_a_first_attempts_commit_writes_its_record_and_its_committed_boundary(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        hooks = ledger.nodes
        opened = [
            await hooks.open_attempt(CheckpointAttemptRequest("run", name, COMPLETE_CHAIN, limit))
            for name, limit in (("a", 1), ("b", 3))  # the engine's limit, and another
        ]
        await hooks.commit_nodes(
            [
                CheckpointCommit("run", opened[0].scope, _record("a"), started_at=1.0, ended_at=2.0),
                CheckpointCommit("run", opened[1].scope, _record("b")),
            ]
        )
        assert sorted(r.node for r in await hooks.node_records("run")) == ["a", "b"]
        assert sorted(node_attempts(ledger.backend.env), key=lambda r: r.node) == [
            NodeAttemptRecord(
                "run",
                "a",
                COMPLETE_CHAIN,
                1,
                0,
                opened[0].scope,
                committed=True,
                started_at=1.0,
                ended_at=2.0,
            ),
            NodeAttemptRecord("run", "b", COMPLETE_CHAIN, 3, 0, opened[1].scope, committed=True),
        ]
        # the same commit again (its first answer lost) is taken as it is; another record is refused
        await hooks.commit_nodes([CheckpointCommit("run", opened[0].scope, _record("a"))])
        with pytest.raises(CheckpointError, match="committed already"):
            await hooks.commit_nodes([CheckpointCommit("run", opened[0].scope, _record("a", b"\x02"))])
    async with open_ledger(tmp_path / "l") as ledger:  # the manifest counted both keys of each node
        assert len(await ledger.nodes.node_records("run")) == 2


async def test_a_node_record_its_boundary_does_not_know_is_damage_and_the_batch_writes_nothing(
    tmp_path: Path,
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        env, hooks = ledger.backend.env, ledger.nodes
        stray = _record("b", b"\x09")
        db, meta = env.db("nodes"), env.db("meta")
        key = node_record_key("run", "b")
        await env.write(
            lambda txn: put_record(txn, db, meta, key, msgspec.msgpack.encode(_record("b", b"\x07")))
        )
        before = node_record(env, "run", "b")
        a = await hooks.open_attempt(CheckpointAttemptRequest("run", "a", COMPLETE_CHAIN, 1))
        b = await hooks.open_attempt(CheckpointAttemptRequest("run", "b", COMPLETE_CHAIN, 1))
        with pytest.raises(StoreDamagedError, match="has a record its attempt does not know"):
            await hooks.commit_nodes(
                [CheckpointCommit("run", a.scope, _record("a")), CheckpointCommit("run", b.scope, stray)]
            )
        assert node_record(env, "run", "b") == before  # not overwritten
        assert node_record(env, "run", "a") is None  # the batch is all or nothing
        assert list(node_attempts(env)) == []


async def test_a_scope_that_parses_to_other_parts_is_not_taken_for_the_nodes(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        hooks = ledger.nodes
        # the scope of node "b" under parent "run/a" reads as one of node "a/b" under "run"
        opened = await hooks.open_attempt(CheckpointAttemptRequest("run/a", "b", COMPLETE_CHAIN, 1))
        assert opened.scope == f"run/a/b@{COMPLETE_CHAIN}.1.0"
        with pytest.raises(CheckpointError, match="is not the complete-chain attempt"):
            await hooks.commit_nodes([CheckpointCommit("run", opened.scope, _record("a/b"))])
        assert await hooks.node_records("run") == ()
        assert list(node_attempts(ledger.backend.env)) == []
