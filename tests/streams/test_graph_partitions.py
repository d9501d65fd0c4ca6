"""Partitioned streams on graph nodes: declarations, validation, fingerprints and ordinary mode.

Checkpoint mode, restores and Sub aliases on every store: the node
conformance suite (``streams/_conformance/node_partitions.py``).
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from streams import (
    Execution,
    Graph,
    GraphError,
    Key,
    KeyedState,
    MemoryStore,
    MessageTx,
    NodeContext,
    PartitionedStream,
    PartitionError,
    Stream,
    handle_messages,
    open_scope,
)

CUSTOMERS = 11


def _customer(order: int) -> int:
    return order % CUSTOMERS


ORDERS = Key("orders", Stream[int], partitions=4, partition_key=_customer)
INVOICES = Key("invoices", Stream[int], partitions=2, partition_key=_customer)
N = Key("n", int)
TOTAL = Key("total", int)
TOTALS = KeyedState(int, int)


def _totals(n: int) -> dict[int, int]:
    expected: dict[int, int] = {}
    for order in range(1, n + 1):
        expected[_customer(order)] = expected.get(_customer(order), 0) + order
    return expected


def shop(
    key: Key[Stream[int]] = ORDERS, *, concurrency: int | None = 2
) -> tuple[Graph, list[int], list[int]]:
    """``orders`` sends 1..n on partitioned ``key``; ``totals`` sums them per customer with members."""
    graph = Graph("partitioned", inputs=[N])
    handled: list[int] = []
    in_flight = [0, 0]  # now, most

    @graph.node(requires=[N], provides=[key])
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.partitioned_writer(key)
        for order in range(1, ctx[N] + 1):
            await writer.send(order)

    @graph.node(requires=[key], provides=[TOTAL])
    async def totals(ctx: NodeContext) -> None:
        async def add(tx: MessageTx[int], order: int) -> None:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            await anyio.lowlevel.checkpoint()
            store = TOTALS.of(tx)
            store.put(_customer(order), await store.get(_customer(order), 0) + order)
            tx.set_state(tx.state + order)
            handled.append(order)
            in_flight[0] -= 1

        result = await ctx.handle_partitions(key, add, concurrency=concurrency, initial_state=0, keyed=TOTALS)
        assert len(result.partitions) == key.partitions
        ctx.set(TOTAL, sum(part.state for part in result.partitions))

    return graph, handled, in_flight


async def test_a_graph_node_handles_a_partitioned_stream_with_members() -> None:
    graph, handled, in_flight = shop()
    execution = Execution(graph, {N: 200})
    async with execution:
        result = await execution.wait()
    assert result[TOTAL] == sum(range(1, 201))
    assert sorted(handled) == list(range(1, 201))
    assert in_flight[1] == 2  # two members: two handler calls at once, never more
    streams = execution.streams()
    assert sorted(ref.key for ref in streams) == [f"orders#{p}" for p in range(4)]
    appended = [0] * 4
    for order in range(1, 201):
        appended[_partition_of(execution, order)] += 1
    for ref, stream in streams.items():
        snapshot = stream.snapshot()
        assert snapshot.finished and snapshot.appended == appended[int(ref.key.rpartition("#")[2])]
        assert [g.acked_through for g in snapshot.groups] == [snapshot.appended]


def _partition_of(execution: Execution, order: int) -> int:
    """The partition ``order`` went to, as the writer's endpoint computes it."""
    [stream] = execution._endpoints.values()
    assert isinstance(stream, PartitionedStream)
    return stream.partition_of(order)


async def test_each_key_keeps_its_order_in_its_partition() -> None:
    graph, handled, _ = shop(concurrency=None)
    async with Execution(graph, {N: 300}) as execution:
        await execution.wait()
    for customer in range(CUSTOMERS):
        mine = [order for order in handled if _customer(order) == customer]
        assert mine == sorted(mine)
    assert len(handled) == 300


def test_a_key_declares_partitions_only_for_a_stream_with_a_key_function() -> None:
    with pytest.raises(TypeError, match="only a stream key"):
        Key("n", int, partitions=2, partition_key=_customer)
    with pytest.raises(PartitionError, match="1 to 4096 partitions"):
        Key("o", Stream[int], partitions=0, partition_key=_customer)
    with pytest.raises(PartitionError, match="partition_key"):
        Key("o", Stream[int], partitions=2)
    assert Key("o", Stream[int], partitions=2, partition_key=_customer) == Key(
        "o", Stream[int], partitions=2, partition_key=lambda order: order
    )  # the key function is not the key's identity
    assert Key("o", Stream[int], partitions=2, partition_key=_customer) != Key("o", Stream[int])
    assert repr(ORDERS) == "Key('orders', streams.Stream[int], partitions=4)"


def _problems(graph: Graph) -> list[str]:
    with pytest.raises(GraphError) as caught:
        graph.validate()
    return list(caught.value.problems)


def test_a_reader_declaring_other_partitions_than_the_writer_is_refused() -> None:
    graph = Graph("mismatch", inputs=[N])
    graph.add_node("orders", _never, requires=[N], provides=[ORDERS])
    other = Key("orders", Stream[int], partitions=3, partition_key=_customer)
    graph.add_node("totals", _never, requires=[other], provides=[TOTAL])
    [problem, *_] = _problems(graph)
    assert "requires Key('orders', streams.Stream[int], partitions=3)" in problem
    assert "the partitions differ" in problem


def test_sub_wiring_of_a_partitioned_stream_keeps_its_partitions() -> None:
    child = Graph("child", inputs=[ORDERS])
    child.add_node("totals", _never, requires=[ORDERS], provides=[TOTAL])
    parent = Graph("parent", inputs=[N])
    plain = Key("orders", Stream[int])
    parent.add_node("orders", _never, requires=[N], provides=[plain])
    parent.sub("tally", child, inlets={ORDERS: plain}, outlets={TOTAL: TOTAL})
    problems = _problems(parent)
    assert any("the partitions differ (not partitioned into 4 partitions)" in p for p in problems)


def test_the_partitions_of_a_stream_are_in_the_fingerprint_and_plain_fingerprints_stay() -> None:
    four = shop()[0].topology().fingerprint
    eight = shop(Key("orders", Stream[int], partitions=8, partition_key=_customer))[0].topology().fingerprint
    assert four != eight  # another layout of the store: another topology
    plain = Graph("plain", inputs=[N])
    plain.add_node("orders", _never, requires=[N], provides=[Key("orders", Stream[int])])
    plain.add_node("totals", _never, requires=[Key("orders", Stream[int])], provides=[TOTAL])
    # the fingerprint releases before partitions gave this graph (types named with their modules):
    # runs in flight stay resumable, as its legacy fingerprint
    topology = plain.topology()
    assert topology.legacy_fingerprint == "1879119573139acce5f17837bb42a6990ba0f8c8a3c5b036e79fbce7ad84b2db"
    assert topology.fingerprint == "a261582ab38ceef47653e1b01eb3f85fbd4991ab79c625e0a3cced4fc0bf63fb"


async def _never(ctx: NodeContext) -> None:
    raise AssertionError("not run")


async def test_a_host_writes_a_partitioned_input_and_reads_a_partitioned_outlet() -> None:
    graph = Graph("desk", inputs=[ORDERS], outlets=[INVOICES])

    @graph.node(requires=[ORDERS], provides=[INVOICES])
    async def billing(ctx: NodeContext) -> None:
        invoices = ctx.partitioned_writer(INVOICES)

        async def bill(tx: MessageTx[None], order: int) -> None:
            await invoices.send(order * 10)

        await ctx.handle_partitions(ORDERS, bill)

    mailed: list[int] = []
    execution = Execution(graph, {}, host_readers={INVOICES: ["mailer"]})

    async def feed() -> None:
        with pytest.raises(PartitionError, match="host_partitioned_writer, not host_writer"):
            await execution.host_writer(ORDERS)
        writer = await execution.host_partitioned_writer(ORDERS)
        for order in range(1, 31):
            await writer.send(order)
        await writer.finish()

    async def mail() -> None:
        async def one(tx: MessageTx[None], invoice: int) -> None:
            mailed.append(invoice)

        with pytest.raises(PartitionError, match="host_partitioned_reader, not host_reader"):
            await execution.host_reader(INVOICES, "mailer")
        await handle_messages(await execution.host_partitioned_reader(INVOICES, "mailer"), one)

    async with execution, anyio.create_task_group() as host:
        host.start_soon(feed)
        host.start_soon(mail)
        await execution.wait()
    assert sorted(mailed) == [order * 10 for order in range(1, 31)]


async def test_a_scope_opens_a_partitioned_stream_from_its_keys_declaration() -> None:
    async with open_scope(MemoryStore(), scope="declared") as scope:
        orders = await scope.open_partitioned(ORDERS, node="src")
        assert len(orders.partitions) == 4 and orders.partition_key is _customer
        with pytest.raises(PartitionError, match="declares 4 partitions, not 2"):
            await scope.open_partitioned(ORDERS, node="other", partitions=2)
