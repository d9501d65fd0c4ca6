"""Checkpoint mode: the node-hook conformance suite on three stores, and what needs no store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger import open_ledger
from streams import ExecCheckpoint, Execution, Graph, Key, MemoryStore, NodeContext, RestorePlanError, Stream
from streams.testing import FaultyNodeHooks, node_store_checks

URL = Key("url", str)


class MemoryWorld:
    def __init__(self) -> None:
        self.store = MemoryStore()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        yield self.store


class LedgerWorld:
    def __init__(self, path: Path) -> None:
        self.path = path

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        async with open_ledger(self.path) as ledger:
            yield ledger.nodes


class PostgresWorld:
    def __init__(self, url: str) -> None:
        self.url = url

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        from ledger.postgres import open_postgres

        async with open_postgres(self.url) as ledger:
            yield ledger.nodes


@pytest.mark.parametrize("kind", ["memory", "lmdb", "postgres"])
@pytest.mark.parametrize(
    ("name", "check"), node_store_checks(), ids=[name for name, _ in node_store_checks()]
)
async def test_node_store_conformance(
    kind: str,
    name: str,
    check: Callable[[Any], Awaitable[None]],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if kind == "postgres":
        world: Any = PostgresWorld(request.getfixturevalue("postgres_url"))
    else:
        world = MemoryWorld() if kind == "memory" else LedgerWorld(tmp_path / "ledger")
    await check(world)


async def _noop(ctx: NodeContext) -> None:
    pass


def test_checkpoint_mode_needs_complete_hooks_and_a_scope() -> None:
    class NoChild:
        streams = MemoryStore()

        async def open_attempt(self, request: Any) -> Any: ...
        async def fail_attempt(self, scope: str) -> Any: ...
        async def commit_nodes(self, commits: Any) -> None: ...

    with pytest.raises(TypeError, match="lack open_child"):
        ExecCheckpoint("run", NoChild())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        ExecCheckpoint("", MemoryStore())
    with pytest.raises(RestorePlanError, match="needs checkpoint mode"):
        Execution(_one_node(), {URL: "x"}).restore_nodes([])


async def test_four_hooks_without_stream_hooks_run_a_graph_without_streams_and_are_checked_by_call() -> None:
    store = MemoryStore()

    class FourHooks:  # the node hooks only: no ``streams``
        open_attempt = store.open_attempt
        fail_attempt = store.fail_attempt
        open_child = store.open_child
        commit_nodes = store.commit_nodes

    execution = Execution(_one_node(), {URL: "x"}, checkpoint=ExecCheckpoint("run", FourHooks()))  # type: ignore[arg-type]
    async with execution:
        await execution.wait()
    assert [r.node for r in store.node_records("run")] == ["noop"]

    orders = Key("orders", Stream[int])
    streaming = Graph("streaming", inputs=[URL])
    streaming.add_node("write", _noop, requires=[URL], provides=[orders])
    streaming.add_node("read", _noop, requires=[orders])
    with pytest.raises(TypeError, match="stream hooks None lack open"):
        Execution(streaming, {URL: "x"}, checkpoint=ExecCheckpoint("run", FourHooks()))  # type: ignore[arg-type]

    class NotCallable(FourHooks):
        open_child = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="lack open_child"):
        ExecCheckpoint("run", NotCallable())  # type: ignore[arg-type]


def _one_node() -> Graph:
    g = Graph("one", inputs=[URL])
    g.add_node("noop", _noop, requires=[URL])
    return g


def test_faulty_node_hooks_name_only_node_hooks() -> None:
    with pytest.raises(ValueError, match="no such node hook: \\['commit'\\]"):
        FaultyNodeHooks(MemoryStore(), fail={"commit": 1})  # the stream hooks' commit is FaultyHooks'
