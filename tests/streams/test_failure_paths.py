"""Failure paths in ordinary mode (checkpoint mode: ``streams/_conformance/failure_paths.py``)."""

from __future__ import annotations

import anyio
import pytest

from streams import (
    Execution,
    ExecutionCancelledError,
    Graph,
    Key,
    MessageExhaustedError,
    MessageTx,
    NodeContext,
    Retry,
    Stream,
    run_graph,
)

N = Key("n", int)
ORDERS = Key("orders", Stream[int])
TOTAL = Key("total", int)
OUT = Key("out", str)


async def test_a_retried_reader_gets_a_budget_of_its_own_and_recovers() -> None:
    failures = {"left": 2}  # the message fails its whole budget once, then succeeds
    graph = Graph("g", inputs=[N])

    @graph.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        for order in range(1, ctx[N] + 1):
            await ctx.writer(ORDERS).send(order)

    @graph.node(requires=[ORDERS], provides=[TOTAL], aspects=[Retry(2)])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[int], order: int) -> None:
            if order == 2 and failures["left"]:
                failures["left"] -= 1
                raise ValueError("billing hiccup")
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, bill, initial_state=0, attempts=2)

    result = await run_graph(graph, {N: 3})
    # the new attempt handled 2 and 3 from the initial state: order 1's ack stays, but a failed
    # attempt's state never reaches the next one (as in checkpoint mode)
    assert result[TOTAL] == 5
    assert failures["left"] == 0


async def test_a_reader_whose_retries_all_exhaust_fails_with_the_exhaustion() -> None:
    graph = Graph("g", inputs=[N])

    @graph.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        await ctx.writer(ORDERS).send(1)

    @graph.node(requires=[ORDERS], provides=[TOTAL], aspects=[Retry(2)])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[int], order: int) -> None:
            raise ValueError("always")

        await ctx.handle_messages(ORDERS, bill, initial_state=0)

    with pytest.raises(MessageExhaustedError):
        await run_graph(graph, {N: 1})


async def test_a_retried_writer_sends_nothing_twice() -> None:
    sent: list[int] = []
    received: list[int] = []
    broke = {"once": True}
    graph = Graph("g", inputs=[N])

    @graph.node(requires=[N], provides=[ORDERS], aspects=[Retry(3)])
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        for order in range((writer.position or 0) + 1, ctx[N] + 1):
            await writer.send(order, send_at=order)
            sent.append(order)
            if order == 30 and broke["once"]:
                broke["once"] = False
                raise ValueError("the source broke")  # sent without a flush

    @graph.node(requires=[ORDERS], provides=[TOTAL])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[int], order: int) -> None:
            received.append(order)
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, bill, initial_state=0)

    result = await run_graph(graph, {N: 60})
    assert sent == received == list(range(1, 61))
    assert result[TOTAL] == sum(range(1, 61))


@pytest.mark.parametrize("how", ["raises", "returns"])
async def test_a_node_ending_after_a_host_cancellation_is_cancelled_and_not_retried(how: str) -> None:
    runs: list[int] = []
    holding = anyio.Event()
    graph = Graph("g", inputs=[N])

    @graph.node(requires=[N], provides=[OUT], aspects=[Retry(3)])
    async def work(ctx: NodeContext) -> None:
        runs.append(1)
        holding.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            if how == "raises":
                raise ValueError("cleanup broke") from None

    execution = Execution(graph, {N: 1})
    async with execution:
        await holding.wait()
        execution.cancel()
        with pytest.raises(ExecutionCancelledError):
            await execution.wait()
    assert runs == [1]  # never retried
    # ordinary mode confirms nothing: a node that returns completed (what it set was published at once);
    # one that raises after the cancellation is cancelled, not failed (checkpoint mode: no record either way)
    expected = "completed" if how == "returns" else "cancelled"
    assert execution.result().statuses[("work",)] == expected
