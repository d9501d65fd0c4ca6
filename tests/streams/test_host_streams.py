"""Host streams: declarations, validation and ordinary mode.

Checkpoint mode and crashes: the node conformance suite
(``streams/_conformance/host_streams.py``) and
``tests/ledger/test_host_streams_crash.py``.
"""

from __future__ import annotations

import re

import anyio
import pytest

from streams import (
    Execution,
    Graph,
    GraphError,
    Key,
    MessageTx,
    NodeContext,
    Stream,
    handle_messages,
)

ORDERS = Key("orders", Stream[int])
INVOICES = Key("invoices", Stream[int])
TOTAL = Key("total", int)
N = Key("n", int)


def desk(*, outlets: bool = True) -> Graph:
    graph = Graph("desk", inputs=[ORDERS], outlets=[INVOICES] if outlets else [])

    @graph.node(requires=[ORDERS], provides=[INVOICES, TOTAL])
    async def billing(ctx: NodeContext) -> None:
        invoices = ctx.writer(INVOICES)

        async def bill(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)
            tx.send(invoices, order * 10)

        await ctx.handle_messages(ORDERS, bill, initial_state=0)

    return graph


def problems_of(graph: Graph) -> list[str]:
    with pytest.raises(GraphError) as caught:
        graph.validate()
    return list(caught.value.problems)


async def test_a_host_feeds_a_running_graph_and_reads_its_outlet() -> None:
    mailed: list[int] = []
    execution = Execution(desk(), {}, host_readers={INVOICES: ["mailer"]})

    async def feed() -> None:
        writer = await execution.host_writer(ORDERS)
        for order in (1, 2, 3):
            await writer.send(order)
        await writer.finish()

    async def mail() -> None:
        async def one(tx: MessageTx[None], invoice: int) -> None:
            mailed.append(invoice)

        await handle_messages(await execution.host_reader(INVOICES, "mailer"), one)

    async with execution, anyio.create_task_group() as host:
        host.start_soon(feed)
        host.start_soon(mail)
        result = await execution.wait()
    assert result[TOTAL] == 6
    assert mailed == [10, 20, 30]


def test_a_declared_outlet_needs_no_reader_node_but_an_execution_needs_a_reader() -> None:
    desk().validate()  # the outlet awaits a host: no missing-reader problem
    assert problems_of(desk(outlets=False)) == [
        "node 'billing' writes stream Key('invoices', streams.Stream[int]), which no node reads: add a node "
        "that requires it (its messages wait for every reader), or declare it among the root graph's "
        "outlets for a host to read"
    ]
    with pytest.raises(GraphError, match=re.escape("outlet Key('invoices', streams.Stream[int]) of graph")):
        Execution(desk(), {})  # started with no host group for it: nobody would read it


def test_outlets_and_host_readers_are_checked() -> None:
    graph = Graph("g", inputs=[N], outlets=[TOTAL, INVOICES])
    graph.add_node("sum", _noop, requires=[N], provides=[TOTAL])
    assert problems_of(graph) == [
        "outlet Key('total', int) of graph 'g' is not a stream: only streams have host readers",
        "outlet Key('invoices', streams.Stream[int]) of graph 'g' is provided by no node of the graph",
    ]
    with pytest.raises(GraphError, match="which is not an outlet of graph 'desk'"):
        Execution(desk(), {}, host_readers={ORDERS: ["mailer"]})
    with pytest.raises(GraphError, match="named twice") as twice:
        Execution(desk(), {}, host_readers={INVOICES: ["mailer", "mailer"]})
    assert len(twice.value.problems) == 1
    with pytest.raises(GraphError, match="has no reader"):
        Execution(desk(), {}, host_readers={INVOICES: []})
    with pytest.raises(GraphError, match="is not a stream input of graph 'desk'"):
        Execution(desk(), {}, host_readers={INVOICES: ["mailer"]}, resumable_inputs=[INVOICES])


async def test_host_endpoints_are_only_those_declared() -> None:
    execution = Execution(desk(), {}, host_readers={INVOICES: ["mailer"]})
    with pytest.raises(RuntimeError, match="start the execution first"):
        await execution.host_writer(ORDERS)
    async with execution:
        with pytest.raises(GraphError, match="is not a stream input"):
            await execution.host_writer(INVOICES)
        with pytest.raises(GraphError, match="has no host group 'other'"):
            await execution.host_reader(INVOICES, "other")
        execution.cancel()


async def test_a_host_waiting_for_an_outlet_gets_the_failure_that_ended_the_run_first() -> None:
    graph = Graph("g", inputs=[N], outlets=[INVOICES])

    @graph.node(requires=[N], provides=[TOTAL])
    async def broken(ctx: NodeContext) -> None:
        raise ValueError("no total")

    @graph.node(requires=[TOTAL], provides=[INVOICES])
    async def invoices(ctx: NodeContext) -> None:  # never runs: its stream is never open
        await ctx.writer(INVOICES).send(ctx[TOTAL])

    execution = Execution(graph, {N: 1}, host_readers={INVOICES: ["mailer"]})
    async with execution:
        with pytest.raises(ValueError, match="no total"):
            await execution.host_reader(INVOICES, "mailer")
        with pytest.raises(ValueError, match="no total"):
            await execution.wait()


def test_a_stream_input_nobody_reads_is_a_problem() -> None:
    graph = Graph("g", inputs=[ORDERS, N])
    graph.add_node("sum", _noop, requires=[N], provides=[TOTAL])
    assert problems_of(graph) == [
        "the host writes stream Key('orders', streams.Stream[int]), an input of the root graph, which no "
        "node reads: add a node that requires it"
    ]


async def _noop(ctx: NodeContext) -> None:
    pass
