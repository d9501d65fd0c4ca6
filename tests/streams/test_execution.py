"""Executions in ordinary mode: immediate Set/Skip, skip rules, aspects, Sub mounts, events, cancellation."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from streams import (
    Child,
    Execution,
    ExecutionCancelledError,
    ExecutionEvent,
    Finished,
    Graph,
    GraphError,
    GraphStarted,
    Key,
    NodeContext,
    NoValue,
    OutputError,
    PayloadTypeError,
    Proceed,
    Retry,
    Running,
    SkippedInputError,
    StrayCancellationError,
    Timeout,
    Waiting,
    run_graph,
)

A = Key("a", int)
B = Key("b", int)
C = Key("c", int)
D = Key("d", int)
N = Key("n", int)


class Flaky(Exception):
    pass


async def test_a_set_key_reaches_its_readers_before_its_producer_returns() -> None:
    g = Graph("g", inputs=[N])
    seen = anyio.Event()

    @g.node(requires=[N], provides=[A, B])
    async def produce(ctx: NodeContext) -> None:
        ctx.set(A, ctx[N] + 1)
        with anyio.fail_after(5):
            await seen.wait()  # only a published A lets consume run
        ctx.set(B, 0)

    @g.node(requires=[A], provides=[C])
    async def consume(ctx: NodeContext) -> None:
        ctx.set(C, ctx[A] * 10)
        seen.set()

    result = await run_graph(g, {N: 1})
    assert (result[A], result[B], result[C]) == (2, 0, 20)
    assert set(result.statuses.values()) == {"completed"}


async def test_unset_provides_are_skipped_and_all_skipped_inputs_skip_a_node_without_running_it() -> None:
    g = Graph("g", inputs=[N])
    ran: list[str] = []

    @g.node(requires=[N], provides=[A, B])
    async def half(ctx: NodeContext) -> None:  # returns without setting b: completed, b skipped
        ran.append("half")
        ctx.set(A, 1)

    @g.node(requires=[B], provides=[C])
    async def only_b(ctx: NodeContext) -> None:
        ran.append("only_b")

    @g.node(requires=[A, B], provides=[D])
    async def both(ctx: NodeContext) -> None:
        ran.append("both")
        assert ctx.get(B) is NoValue
        with pytest.raises(SkippedInputError, match="input Key\\('b', int\\) was skipped"):
            ctx[B]
        ctx.set(D, ctx[A])

    events: list[ExecutionEvent] = []
    result = await run_graph(g, {N: 0}, on_event=events.append)
    assert sorted(ran) == ["both", "half"]
    assert result.statuses == {("half",): "completed", ("only_b",): "skipped", ("both",): "completed"}
    assert result.get(B) is NoValue and result.get(C) is NoValue and result[D] == 1
    assert Running((), "only_b") not in events and Finished((), "only_b", "skipped") in events
    with pytest.raises(SkippedInputError):
        result[C]


async def test_a_skipped_input_skips_what_depends_only_on_it() -> None:
    g = Graph("g", inputs=[N])
    g.add_node("never", _fail_if_run, requires=[N], provides=[A])
    result = await run_graph(g, {N: NoValue})
    assert result.statuses == {("never",): "skipped"} and result.get(A) is NoValue


async def _fail_if_run(ctx: NodeContext) -> None:
    raise AssertionError("a node whose inputs were all skipped ran")


async def test_skip_node_keeps_what_was_set_and_is_not_retried() -> None:
    g = Graph("g", inputs=[N])
    calls = 0

    @g.node(requires=[N], provides=[A, B], aspects=[Retry(3)])
    async def partial(ctx: NodeContext) -> None:
        nonlocal calls
        calls += 1
        ctx.set(A, 5)
        ctx.skip_node()

    result = await run_graph(g, {N: 0})
    assert calls == 1
    assert result.statuses == {("partial",): "skipped"}
    assert result[A] == 5 and result.get(B) is NoValue


async def test_contract_errors_of_set_and_skip_fail_the_node_and_name_it() -> None:
    for body, error, match in [
        (lambda ctx: ctx.set(C, 1), OutputError, "cannot set Key\\('c', int\\): it does not provide it"),
        (
            lambda ctx: (ctx.set(A, 1), ctx.skip(A)),
            OutputError,
            "cannot skip Key\\('a', int\\): it was already",
        ),
        (lambda ctx: ctx.set(A, "one"), PayloadTypeError, "Key\\('a', int\\) of node 'n1' takes int"),
        (lambda ctx: ctx[B], KeyError, "node 'n1' does not require Key\\('b', int\\)"),
    ]:
        g = Graph("g", inputs=[N])

        async def n1(ctx: NodeContext, body: Any = body) -> None:
            body(ctx)

        g.add_node("n1", n1, requires=[N], provides=[A], aspects=[Retry(3)])
        with pytest.raises(error, match=match) as caught:
            await run_graph(g, {N: 0})
        assert "in node 'n1' of graph 'g'" in caught.value.__notes__


def forever_graph() -> tuple[Graph, anyio.Event]:
    """Graph g with node 'forever', which sets the event once running and then never returns."""
    g = Graph("g", inputs=[N])
    running = anyio.Event()

    @g.node(requires=[N], provides=[A])
    async def forever(ctx: NodeContext) -> None:
        running.set()
        await anyio.sleep_forever()

    return g, running


async def test_the_first_failure_cancels_the_other_nodes_and_wait_raises_it() -> None:
    g, started = forever_graph()

    @g.node(requires=[N], provides=[B])
    async def broken(ctx: NodeContext) -> None:
        await started.wait()
        raise Flaky("down")

    async with Execution(g, {N: 0}) as execution:
        with pytest.raises(Flaky, match="down"):
            await execution.wait()
    assert execution.result().statuses == {("forever",): "cancelled", ("broken",): "failed"}
    assert execution.snapshot().status == "failed"


async def test_retry_runs_the_chain_again_until_it_succeeds_or_its_attempts_are_used() -> None:
    g = Graph("g", inputs=[N])
    calls: list[int] = []

    @g.node(requires=[N], provides=[A], aspects=[Retry(attempts=3)])
    async def flaky(ctx: NodeContext) -> None:
        calls.append(len(calls))
        if len(calls) < ctx[N]:
            raise Flaky(len(calls))
        ctx.set(A, len(calls))

    assert (await run_graph(g, {N: 3}))[A] == 3
    calls.clear()
    with pytest.raises(Flaky, match="3"):
        await run_graph(g, {N: 4})
    assert calls == [0, 1, 2]
    with pytest.raises(ValueError, match="at least one attempt"):
        Retry(0)


async def test_timeout_fails_a_slow_chain_and_an_outer_retry_runs_it_again() -> None:
    g = Graph("g", inputs=[N])
    calls = 0

    @g.node(requires=[N], provides=[A], aspects=[Retry(2), Timeout(0.05)])
    async def slow_once(ctx: NodeContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep_forever()
        ctx.set(A, calls)

    assert (await run_graph(g, {N: 0}))[A] == 2
    h = Graph("h", inputs=[N])
    h.add_node("stuck", _sleep_forever, requires=[N], provides=[A], aspects=[Timeout(0.05)])
    with pytest.raises(TimeoutError):
        await run_graph(h, {N: 0})


async def _sleep_forever(ctx: NodeContext) -> None:
    await anyio.sleep_forever()


async def test_aspects_wrap_in_order_and_a_catching_aspect_turns_a_failure_into_completion() -> None:
    trail: list[str] = []

    def named(name: str) -> Any:
        async def aspect(ctx: NodeContext, proceed: Proceed) -> None:
            trail.append(f"{name}>")
            try:
                await proceed()
            finally:
                trail.append(f"<{name}")

        return aspect

    async def forgive(ctx: NodeContext, proceed: Proceed) -> None:
        try:
            await proceed()
        except Flaky:
            ctx.set(A, -1)

    g = Graph("g", inputs=[N])

    @g.node(requires=[N], provides=[A], aspects=[named("node"), forgive])
    async def failing(ctx: NodeContext) -> None:
        trail.append("body")
        raise Flaky

    result = await run_graph(g, {N: 0}, aspects=[named("outer")])
    assert trail == ["outer>", "node>", "body", "<node", "<outer"]
    assert result[A] == -1 and result.statuses == {("failing",): "completed"}


A_CHILD = Key("a_child", int)
B_CHILD = Key("b_child", int)


def child_graph(log: list[str]) -> Graph:
    child = Graph("child", inputs=[A_CHILD, B_CHILD, Key("lang", str)])

    @child.node(requires=[A_CHILD, Key("lang", str)], provides=[C])
    async def uses_a(ctx: NodeContext) -> None:
        log.append(f"uses_a {ctx[Key('lang', str)]}")
        ctx.set(C, ctx[A_CHILD] + 1)

    @child.node(requires=[B_CHILD], provides=[D])
    async def uses_b(ctx: NodeContext) -> None:
        log.append("uses_b")
        ctx.set(D, ctx[B_CHILD] * 2)

    return child


async def test_a_sub_runs_each_child_node_when_its_own_inlets_arrive() -> None:
    log: list[str] = []
    parent = Graph("parent", inputs=[A])
    parent.sub(
        "mount",
        child_graph(log),
        inlets={A_CHILD: A, B_CHILD: B},
        outlets={C: Key("c_out", int), D: Key("d_out", int)},
        fixed={Key("lang", str): "en"},
    )

    @parent.node(requires=[Key("c_out", int)], provides=[B])
    async def after_c(ctx: NodeContext) -> None:  # b is computed from the child's own output
        log.append("after_c")
        ctx.set(B, ctx[Key("c_out", int)] + 100)

    events: list[ExecutionEvent] = []
    result = await run_graph(parent, {A: 1}, on_event=events.append)
    assert log == ["uses_a en", "after_c", "uses_b"]  # the mount did not wait for inlet b
    assert result[Key("c_out", int)] == 2 and result[Key("d_out", int)] == 204
    assert result.statuses == {
        ("mount",): "completed",
        ("after_c",): "completed",
        ("mount", "uses_a"): "completed",
        ("mount", "uses_b"): "completed",
    }
    assert events.index(Child((), "mount")) < events.index(GraphStarted(("mount",), "child"))
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == len({(e.path, e.node) for e in finished}) == 4  # once per node


async def test_without_aspects_keeps_the_executions_aspects_off_the_nodes_inside_a_mount() -> None:
    wrapped: list[tuple[tuple[str, ...], str]] = []

    async def observe(ctx: NodeContext, proceed: Proceed) -> None:
        wrapped.append((ctx.path, ctx.node))
        await proceed()

    for without in (False, True):
        wrapped.clear()
        parent = Graph("parent", inputs=[A, B])
        parent.sub(
            "mount",
            child_graph([]),
            inlets={A_CHILD: A, B_CHILD: B},
            fixed={Key("lang", str): "en"},
            without_aspects=without,
        )
        await run_graph(parent, {A: 1, B: 2}, aspects=[observe])
        inside = {((("mount",), "uses_a")), (("mount",), "uses_b")}
        assert ((), "mount") in wrapped  # the mount itself keeps them
        assert inside.isdisjoint(wrapped) == without


async def test_inputs_are_checked_before_anything_runs() -> None:
    g = Graph("g", inputs=[N])
    g.add_node("n1", _fail_if_run, requires=[N], provides=[A])
    with pytest.raises(
        GraphError, match="input Key\\('n', int\\) was not given \\(give NoValue to skip it\\)"
    ):
        Execution(g, {})
    with pytest.raises(GraphError, match="Key\\('a', int\\) is not an input of graph 'g'"):
        Execution(g, {N: 1, A: 2})
    with pytest.raises(GraphError, match="input Key\\('n', int\\) takes int"):
        Execution(g, {N: "one"})
    broken = Graph("broken")
    broken.add_node("x", _fail_if_run, requires=[A], provides=[B])
    with pytest.raises(GraphError, match="no node provides"):
        Execution(broken)


async def test_checkpoint_inputs_are_the_supplied_inputs_and_snapshots_hold_no_values() -> None:
    g = Graph("g", inputs=[N, A])
    g.add_node("copy", _copy_n, requires=[N], provides=[B])
    execution = Execution(g, {N: 41, A: NoValue})
    inputs = execution.checkpoint_inputs()
    assert inputs == {N: 41, A: NoValue}
    inputs[N] = 0  # a copy: the execution's inputs do not change
    assert execution.checkpoint_inputs()[N] == 41
    assert execution.snapshot().status == "created"
    async with execution:
        result = await execution.wait()
    assert result[B] == 42
    snapshot = execution.snapshot()
    assert snapshot.status == "completed" and [(n.node, n.status) for n in snapshot.nodes] == [
        ("copy", "completed")
    ]
    assert "42" not in repr(snapshot) and "41" not in repr(snapshot)


async def _copy_n(ctx: NodeContext) -> None:
    ctx.set(B, ctx[N] + 1)


async def test_cancel_stops_running_nodes_and_wait_says_so() -> None:
    g, running = forever_graph()

    events: list[ExecutionEvent] = []
    async with Execution(g, {N: 0}, on_event=events.append) as execution:
        await running.wait()
        execution.cancel()
        with pytest.raises(ExecutionCancelledError, match="execution of graph 'g' was cancelled"):
            await execution.wait()
    assert execution.snapshot().status == "cancelled"
    assert events[-1] == Finished((), "forever", "cancelled")
    assert [type(e) for e in events] == [GraphStarted, Waiting, Running, Finished]
    with pytest.raises(RuntimeError, match="was started already"):
        async with execution:
            pass


async def test_leaving_the_block_cancels_what_still_runs() -> None:
    g = Graph("g", inputs=[N])
    g.add_node("forever", _sleep_forever, requires=[N], provides=[A])
    async with Execution(g, {N: 0}) as execution:
        pass
    assert execution.snapshot().status == "cancelled"


async def test_an_event_observer_that_raises_fails_the_execution() -> None:
    g = Graph("g", inputs=[N])
    g.add_node("copy", _copy_n, requires=[N], provides=[B])

    def observer(event: ExecutionEvent) -> None:
        if isinstance(event, Running):
            raise RuntimeError("observer broke")

    with pytest.raises(RuntimeError, match="observer broke"):
        await run_graph(g, {N: 1}, on_event=observer)


async def test_a_host_cancellation_reaches_the_nodes_and_leaves_the_execution_cancelled() -> None:
    g, running = forever_graph()

    with anyio.CancelScope() as host:
        async with Execution(g, {N: 0}) as execution:
            await running.wait()
            host.cancel()
            await execution.wait()
    assert host.cancelled_caught
    assert execution.snapshot().status == "cancelled"
    assert execution.result().statuses == {("forever",): "cancelled"}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancellation_raised_by_node_code_while_nothing_cancelled_it_is_a_failure(
    anyio_backend: str,
) -> None:
    import asyncio  # a library raising its own CancelledError, as some RPC clients do

    g = Graph("g", inputs=[N])
    calls = 0
    failing = 1  # how many first calls fail

    @g.node(requires=[N], provides=[A], aspects=[Retry(2)])
    async def rpc(ctx: NodeContext) -> None:
        nonlocal calls
        calls += 1
        if calls <= failing:
            raise asyncio.CancelledError("the server closed the stream")
        ctx.set(A, 1)

    assert (await run_graph(g, {N: 0}))[A] == 1 and calls == 2  # a failure: Retry ran it again
    calls, failing = 0, 2
    with pytest.raises(StrayCancellationError, match="raised a cancellation while its execution was not"):
        await run_graph(g, {N: 0})
