"""Checkpoint mode: the node-hook conformance suite on three stores, and what needs no store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger import open_ledger
from streams import (
    ExecCheckpoint,
    Execution,
    Graph,
    GraphError,
    Key,
    MemoryStore,
    NodeContext,
    RestorePlanError,
    Stream,
    run_graph,
)
from streams.store import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
)
from streams.testing import FaultyNodeHooks, PassThroughNodeHooks, node_store_checks

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
        async def fail_attempt(self, scope: str, failure: Any = None) -> Any: ...
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
    assert [r.node for r in await store.node_records("run")] == ["noop"]

    orders = Key("orders", Stream[int])
    streaming = Graph("streaming", inputs=[URL])
    streaming.add_node("write", _noop, requires=[URL], provides=[orders])
    streaming.add_node("read", _noop, requires=[orders])
    with pytest.raises(TypeError, match="stream hooks None lack "):
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


A = Key("a", int)
B = Key("b", int)
C = Key("c", int)
D = Key("d", int)
C_OUT = Key("c_out", int)
D_OUT = Key("d_out", int)
A_CHILD = Key("a_child", int)
B_CHILD = Key("b_child", int)


class Recording(PassThroughNodeHooks):
    """MemoryStore's node hooks, with the name of every call made."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.calls: list[str] = []

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        self.calls.append("open_attempt")
        return await super().open_attempt(request)

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        self.calls.append("fail_attempt")
        return await super().fail_attempt(scope, failure)

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        self.calls.append("open_child")
        return await super().open_child(child)

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        self.calls.append("commit_nodes")
        await super().commit_nodes(commits)


def two_inlets(*, with_b: bool = True) -> Graph:
    """c from a_child at once; d only once b_child came in (the child of the ordinary-mode test)."""
    child = Graph("child", inputs=[A_CHILD, B_CHILD])

    @child.node(requires=[A_CHILD], provides=[C])
    async def uses_a(ctx: NodeContext) -> None:
        ctx.set(C, ctx[A_CHILD] + 1)

    if with_b:
        child.add_node("uses_b", _double_b, requires=[B_CHILD], provides=[D])
    return child


async def _double_b(ctx: NodeContext) -> None:
    ctx.set(D, ctx[B_CHILD] * 2)


async def _after_c(ctx: NodeContext) -> None:
    ctx.set(B, ctx[C_OUT] + 100)


def fed_back(child: Graph) -> Graph:
    """A parent node computes b from the mount's own outlet c_out and feeds it back into the mount."""
    parent = Graph("parent", inputs=[A])
    outlets = {C: C_OUT, D: D_OUT} if any(D in m.provides for m in child._members) else {C: C_OUT}
    parent.sub("mount", child, inlets={A_CHILD: A, B_CHILD: B}, outlets=outlets)
    parent.add_node("after_c", _after_c, requires=[C_OUT], provides=[B])
    return parent


async def test_checkpoint_mode_refuses_a_cycle_through_a_mounts_commit_before_any_hook_call() -> None:
    graph = fed_back(two_inlets())
    result = await run_graph(graph, {A: 1})  # ordinary mode publishes c_out as the child sets it
    assert (result[C_OUT], result[D_OUT]) == (2, 204)
    hooks = Recording()
    with pytest.raises(GraphError) as caught:
        Execution(graph, {A: 1}, checkpoint=ExecCheckpoint("run", hooks))
    [problem] = caught.value.problems
    assert problem.startswith(
        "checkpoint mode cannot run the cycle c_out (Sub 'mount', at its commit) <- b (node 'after_c') <- "
        "c_out: Sub 'mount' publishes outlet c_out only once its record is committed, after its child "
        "finished, and 'mount/uses_b' waits for b (inlet b_child)."
    )
    assert str(caught.value).startswith("graph 'parent' cannot run: checkpoint mode cannot run the cycle")
    with pytest.raises(GraphError, match="the cycle c_out"):  # the same check, asked for
        graph.validate(checkpoint=True)
    graph.validate()
    # a deeper one: the node that waits for b is in a mount inside the mount
    wrapping = Graph("wrapping", inputs=[A_CHILD, B_CHILD])
    wrapping.sub("inner", two_inlets(), inlets={A_CHILD: A_CHILD, B_CHILD: B_CHILD}, outlets={C: C, D: D})
    with pytest.raises(GraphError, match="'mount/inner/uses_b' waits for b \\(inlet b_child\\)"):
        Execution(fed_back(wrapping), {A: 1}, checkpoint=ExecCheckpoint("run", hooks))
    # and the whole of it mounted once more: found at its mount path
    outer = Graph("outer", inputs=[A])
    outer.sub("top", graph, inlets={A: A})
    with pytest.raises(GraphError, match="top: checkpoint mode cannot run the cycle c_out"):
        Execution(outer, {A: 1}, checkpoint=ExecCheckpoint("run", hooks))
    assert hooks.calls == []


async def test_a_cycle_made_after_the_execution_was_built_is_refused_when_it_starts() -> None:
    child = two_inlets(with_b=False)  # nothing inside waits for b_child yet: no cycle
    graph = fed_back(child)
    hooks = Recording()
    execution = Execution(graph, {A: 1}, checkpoint=ExecCheckpoint("run", hooks))
    child.add_node("uses_b", _double_b, requires=[B_CHILD], provides=[D])
    with pytest.raises(GraphError, match="'mount/uses_b' waits for b"):
        async with execution:
            pass
    assert hooks.calls == []


async def test_the_same_wiring_without_the_cycle_runs_to_completion_in_checkpoint_mode() -> None:
    store = MemoryStore()
    # nothing inside the mount waits for the b that comes back: its commit waits for nothing of it
    unused = fed_back(two_inlets(with_b=False))
    async with Execution(unused, {A: 1}, checkpoint=ExecCheckpoint("unused", store)) as execution:
        result = await execution.wait()
    assert result[C_OUT] == 2 and result[B] == 102
    assert {r.node for r in await store.node_records("unused")} == {"mount", "after_c"}
    # c_out from one mount of the child, b fed into another: the fix the refusal suggests
    split = Graph("split", inputs=[A])
    split.sub("first", two_inlets(), inlets={A_CHILD: A, B_CHILD: A}, outlets={C: C_OUT})
    split.sub("second", two_inlets(), inlets={A_CHILD: A, B_CHILD: B}, outlets={D: D_OUT})
    split.add_node("after_c", _after_c, requires=[C_OUT], provides=[B])
    async with Execution(split, {A: 1}, checkpoint=ExecCheckpoint("split", store)) as execution:
        result = await execution.wait()
    assert (result[C_OUT], result[B], result[D_OUT]) == (2, 102, 204)
    assert {r.node for r in await store.node_records("split")} == {"first", "second", "after_c"}


ITEMS = Key("items", Stream[int])
ECHOED = Key("echoed", Stream[int])
TOTAL = Key("total", int)
COUNT = Key("count", int)
USED = Key("used", int)


async def _write_three(ctx: NodeContext) -> None:
    for i in (1, 2, 3):
        await ctx.writer(ITEMS).send(i)


async def _sum_echoed(ctx: NodeContext) -> None:
    reader, total = ctx.reader(ECHOED), 0
    async for message in reader:
        total += message.value
        await reader.ack(message)
    ctx.set(TOTAL, total)


async def _use_count(ctx: NodeContext) -> None:
    ctx.set(USED, ctx[COUNT] * 10)


async def _echo(ctx: NodeContext) -> None:
    reader, count = ctx.reader(ITEMS), 0
    async for message in reader:
        await ctx.writer(ECHOED).send(message.value * 2)
        await reader.ack(message)
        count += 1
    ctx.set(COUNT, count)


async def test_a_mounts_stream_fed_back_into_it_is_no_cycle_and_runs_to_completion_in_checkpoint_mode() -> (
    None
):
    # a stream outlet is handed on as soon as its writer opens it: the parent node reads it while the
    # mount runs, and feeds back both a stream and a value the mount's nodes wait for
    child = Graph("child", inputs=[ECHOED, COUNT])
    child.add_node("write", _write_three, provides=[ITEMS])
    child.add_node("sum", _sum_echoed, requires=[ECHOED], provides=[TOTAL])
    child.add_node("use", _use_count, requires=[COUNT], provides=[USED])
    loop = Graph("loop")
    loop.sub(
        "mount",
        child,
        inlets={ECHOED: ECHOED, COUNT: COUNT},
        outlets={ITEMS: ITEMS, TOTAL: TOTAL, USED: USED},
    )
    loop.add_node("echo", _echo, requires=[ITEMS], provides=[ECHOED, COUNT])
    loop.validate(checkpoint=True)
    store = MemoryStore()
    async with Execution(loop, {}, checkpoint=ExecCheckpoint("loop", store)) as execution:
        result = await execution.wait()
    assert (result[TOTAL], result[COUNT], result[USED]) == (12, 3, 30)
    assert {r.node for r in await store.node_records("loop")} == {"mount", "echo"}
