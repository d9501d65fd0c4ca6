"""Node-hook conformance for partitioned stream ports: a graph node writes a partitioned stream, another
handles its partitions with members, in checkpoint mode.

Every partition (``orders#p``) is a stream of its own in the store; the
writer's record names the partitioned stream once, with its number of
partitions, and ends every partition in the same transaction. A restored
writer reopens every partition and its readers continue from each
partition's frontier; an interrupted one resumes from its position and
appends nothing twice; a failed one fails every partition; a Sub exposes a
partitioned stream and its record is verified partition by partition on
resume. Registered in :data:`NODE_CHECKS`.
"""

from __future__ import annotations

from typing import Any, Final

import anyio
import anyio.lowlevel

from .._aspects import Retry
from .._checkpoint import ExecCheckpoint
from .._context import NodeContext
from .._errors import CheckpointError, OutputError, PartitionError, StreamFailedError
from .._execution import Execution
from .._graph import Graph
from .._handle import MessageTx
from .._keyed import KeyedState
from .._keys import Key, Stream
from .._store._node_records import (
    CheckpointAttemptRequest,
    CheckpointCommit,
    CheckpointOutput,
    NodeCheckpoint,
)
from .._store._records import StreamFinish, StreamOpen, StreamRef
from .._type_names import type_name
from . import node_streams
from ._support import raises
from .node_streams import _CountingOpens, _crash_when, _finished_event
from .nodes import node_check, resumed

__all__: list[str] = []

#: Customers of the orders: order ``i`` is customer ``i % CUSTOMERS``'s.
CUSTOMERS: Final = 7
PARTITIONS: Final = 3
N = Key("n", int)


def _customer(order: int) -> int:
    return order % CUSTOMERS


ORDERS = Key("orders", Stream[int], partitions=PARTITIONS, partition_key=_customer)
FORWARDED = Key("forwarded", Stream[int], partitions=PARTITIONS, partition_key=_customer)
TOTAL = Key("total", int)
TOTALS: Final = KeyedState(int, int)
REF: Final = StreamRef("run", "orders", "orders")


def _expected(n: int) -> dict[int, int]:
    totals: dict[int, int] = {}
    for order in range(1, n + 1):
        totals[order % CUSTOMERS] = totals.get(order % CUSTOMERS, 0) + order
    return totals


class Shop(node_streams.Shop):
    """``orders`` writes 1..n on a partitioned stream; ``totals`` keeps a total per customer with two members.

    As the plain stream's shop; ``hold_at`` makes the handler wait (forever)
    at that order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.handled: list[int] = []
        self.hold_at: int | None = None
        self.in_flight = 0
        self.most_in_flight = 0

    async def write_orders(self, ctx: NodeContext, key: Key[Stream[int]] = ORDERS) -> None:
        await self.write(ctx, ctx.partitioned_writer(key))

    async def add(self, tx: MessageTx[int], order: int) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if order == self.hold_at:
                self.holding.set()
                await anyio.sleep_forever()
            await anyio.lowlevel.checkpoint()  # another member may run here; this one's partitions wait
            totals = TOTALS.of(tx)
            customer = order % CUSTOMERS
            totals.put(customer, await totals.get(customer, 0) + order)
            tx.set_state(tx.state + order)
            self.handled.append(order)
        finally:
            self.in_flight -= 1

    async def total(self, ctx: NodeContext, key: Key[Stream[int]] = ORDERS) -> None:
        result = await ctx.handle_partitions(key, self.add, concurrency=2, initial_state=0, keyed=TOTALS)
        ctx.set(TOTAL, sum(part.state for part in result.partitions))

    def graph(self, *, resumable: bool = False) -> Graph:
        shop = Graph("partitioned-shop", version="1", inputs=[N])
        shop.add_node("orders", self.write_orders, requires=[N], provides=[ORDERS], resumable=resumable)
        shop.add_node("totals", self.total, requires=[ORDERS], provides=[TOTAL])
        return shop


async def _ends(store: Any, ref: StreamRef) -> list[tuple[bool, bool]]:
    """(finished, failed) of every partition of ``ref`` as the store holds it."""
    ends = []
    for p in range(PARTITIONS):
        held = await store.streams.describe(ref.partition(p))
        assert held is not None and held.partitions == PARTITIONS
        ends.append((held.finished, held.failed))
    return ends


async def _appended(store: Any) -> int:
    """The messages appended to every partition of run ``run``'s orders."""
    appended = 0
    for p in range(PARTITIONS):
        held = await store.streams.describe(REF.partition(p))
        assert held is not None
        appended += held.appended
    return appended


async def _totals(store: Any, ref: StreamRef, group: str) -> dict[int, int]:
    """The keyed totals of ``group`` over every partition of ``ref``, as the store confirmed them."""
    found: dict[int, int] = {}
    for p in range(PARTITIONS):
        for customer, total in await TOTALS.items(store.streams, ref.partition(p), group):
            assert customer not in found  # a key lives in one partition
            found[customer] = total
    return found


@node_check
async def a_partitioned_writer_ends_every_partition_with_its_node_record(store: Any) -> None:
    shop = Shop()
    execution = Execution(shop.graph(), {N: 60}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        result = await execution.wait()
    assert result[TOTAL] == sum(range(1, 61))
    assert sorted(shop.handled) == list(range(1, 61))
    assert shop.most_in_flight <= 2  # two members: at most two handler calls at once
    [writer] = [r for r in await store.node_records("run") if r.node == "orders"]
    assert writer.outputs == (
        CheckpointOutput("orders", "stream", stream=REF, terminal="finished", partitions=PARTITIONS),
    )
    assert await _ends(store, REF) == [(True, False)] * PARTITIONS
    assert await store.streams.describe(REF) is None  # the partitioned stream is its partitions
    assert await _totals(store, REF, "totals") == _expected(60)


@node_check
async def a_restored_partitioned_writer_reopens_every_partition_and_members_continue(store: Any) -> None:
    shop = Shop()
    shop.hold_at = 30
    confirmed, on_event = _finished_event("orders")
    first = Execution(shop.graph(), {N: 60}, checkpoint=ExecCheckpoint("run", store), on_event=on_event)
    await _crash_when(first, shop.holding, confirmed)
    before = list(shop.handled)
    assert 30 not in before

    shop.hold_at = None
    again = await resumed(shop.graph(), store, "run", {N: 60})
    async with again:
        result = await again.wait()
    assert result[TOTAL] == sum(range(1, 61))
    assert shop.writer_runs == 1  # restored: every partition reopened, its body not run
    assert sorted(shop.handled) == list(range(1, 61))  # no confirmed message handled twice, none lost
    assert await _totals(store, REF, "totals") == _expected(60)


@node_check
async def an_interrupted_partitioned_writer_resumes_from_its_position_sending_nothing_twice(
    store: Any,
) -> None:
    shop = Shop()
    shop.writer_holds_after = 20
    await _crash_when(Execution(shop.graph(), {N: 60}, checkpoint=ExecCheckpoint("run", store)), shop.holding)
    shop.writer_holds_after = None
    again = await resumed(shop.graph(resumable=True), store, "run", {N: 60})
    async with again:
        result = await again.wait()
    assert result[TOTAL] == sum(range(1, 61))
    assert shop.writer_runs == 2
    assert await _appended(store) == 60  # what the resumed writer sent again below its position was skipped
    assert await _totals(store, REF, "totals") == _expected(60)


@node_check
async def a_failed_partitioned_writer_fails_every_partition(store: Any) -> None:
    shop = Shop()
    shop.fail_writer_after = 10
    execution = Execution(shop.graph(), {N: 60}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        with raises(ValueError, match="the order source broke"):
            await execution.wait()
    assert "orders" not in {r.node for r in await store.node_records("run")}
    assert await _ends(store, REF) == [(False, True)] * PARTITIONS


def _exposed(shop: Shop) -> Graph:
    """Mount ``src`` exposes the partitioned stream its child's ``orders`` writes; ``totals`` reads it."""
    writing = Graph("partitioned-writing", version="1", inputs=[N])
    writing.add_node("orders", shop.write_orders, requires=[N], provides=[ORDERS])
    graph = Graph("partitioned-exposed", version="1", inputs=[N])
    graph.sub("src", writing, inlets={N: N}, outlets={ORDERS: FORWARDED})

    async def total(ctx: NodeContext) -> None:
        await shop.total(ctx, FORWARDED)

    graph.add_node("totals", total, requires=[FORWARDED], provides=[TOTAL])
    return graph


@node_check
async def a_sub_exposing_a_partitioned_stream_is_restored_partition_by_partition(store: Any) -> None:
    shop = Shop()
    shop.hold_at = 30
    confirmed, on_event = _finished_event("src")
    first = Execution(_exposed(shop), {N: 60}, checkpoint=ExecCheckpoint("run", store), on_event=on_event)
    await _crash_when(first, shop.holding, confirmed)
    [mount] = [r for r in await store.node_records("run") if r.node == "src"]
    source = StreamRef("run/src@0.1.0/src", "orders", "orders")
    assert mount.outputs == (
        CheckpointOutput("forwarded", "stream", stream=source, terminal="finished", partitions=PARTITIONS),
    )

    shop.hold_at = None
    again = await resumed(_exposed(shop), store, "run", {N: 60})
    async with again:
        result = await again.wait()
    assert result[TOTAL] == sum(range(1, 61))
    assert shop.writer_runs == 1  # the confirmed mount did not rerun its child
    assert sorted(shop.handled) == list(range(1, 61))
    assert await _totals(store, source, "totals") == _expected(60)


@node_check
async def a_sub_record_naming_a_partition_the_store_never_had_is_refused(store: Any) -> None:
    shop = Shop()
    source = StreamRef("run/src@0.1.0/src", "orders", "orders")
    for p in range(PARTITIONS - 1):  # the last partition is missing
        part = source.partition(p)
        await store.streams.open(StreamOpen(part, type_name(int), 8, ("totals",), partitions=PARTITIONS))
    execution = Execution(_exposed(shop), {N: 60}, checkpoint=ExecCheckpoint("run", store))
    reference = CheckpointOutput("forwarded", "stream", stream=source, terminal="", partitions=PARTITIONS)
    execution.restore_nodes([NodeCheckpoint("src", "completed", (reference,))])
    async with execution:
        with raises(CheckpointError, match=r"whose partition .*orders#2 the store never had"):
            await execution.wait()
    assert shop.writer_runs == 0 and shop.handled == []


@node_check
async def a_handler_of_a_partitioned_stream_sets_no_node_result(store: Any) -> None:
    shop = Shop()
    graph = Graph("partitioned-results", version="1", inputs=[N])
    graph.add_node("orders", shop.write_orders, requires=[N], provides=[ORDERS])

    async def total(ctx: NodeContext) -> None:
        async def add(tx: MessageTx[None], order: int) -> None:
            tx.set(TOTAL, order)

        await ctx.handle_partitions(ORDERS, add)

    graph.add_node("totals", total, requires=[ORDERS], provides=[TOTAL])
    execution = Execution(graph, {N: 5}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        with raises(OutputError, match="whose partitions have no order among them"):
            await execution.wait()


@node_check
async def plain_endpoints_of_a_partitioned_key_are_refused(store: Any) -> None:
    seen: list[str] = []
    graph = Graph("partitioned-endpoints", version="1", inputs=[N])

    @graph.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        with raises(PartitionError, match="ctx.partitioned_writer, not ctx.writer"):
            ctx.writer(ORDERS)
        seen.append("writer refused")
        await ctx.partitioned_writer(ORDERS).send(1)

    @graph.node(requires=[ORDERS], provides=[TOTAL])
    async def totals(ctx: NodeContext) -> None:
        with raises(PartitionError, match="ctx.partitioned_reader, not ctx.reader"):
            ctx.reader(ORDERS)
        with raises(PartitionError, match="ctx.handle_partitions, not ctx.handle_messages"):
            await ctx.handle_messages(ORDERS, Shop().add)
        seen.append("reader refused")
        result = await ctx.handle_partitions(ORDERS, Shop().add, initial_state=0, keyed=TOTALS)
        ctx.set(TOTAL, result.handled)

    execution = Execution(graph, {N: 1}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        assert (await execution.wait())[TOTAL] == 1
    assert seen == ["writer refused", "reader refused"]


@node_check
async def a_retried_partitioned_writer_continues_from_its_position_sending_nothing_twice(store: Any) -> None:
    shop = Shop()
    shop.fail_writer_after = 25
    graph = Graph("partitioned-retried", version="1", inputs=[N])

    async def orders(ctx: NodeContext) -> None:
        try:
            await shop.write_orders(ctx)
        finally:
            shop.fail_writer_after = None  # the second attempt goes through

    graph.add_node("orders", orders, requires=[N], provides=[ORDERS], aspects=[Retry(2)])
    graph.add_node("totals", shop.total, requires=[ORDERS], provides=[TOTAL])
    execution = Execution(graph, {N: 60}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        result = await execution.wait()
    assert result[TOTAL] == sum(range(1, 61))
    assert shop.writer_runs == 2
    assert shop.sent[:25] == list(range(1, 26)) and shop.sent[-1] == 60
    assert await _appended(store) == 60  # it went on from the lowest position kept, skipping what others had
    assert await _totals(store, REF, "totals") == _expected(60)


@node_check
async def a_restored_alias_of_a_failed_partitioned_source_fails_its_readers_without_an_open(
    store: Any,
) -> None:
    source = StreamRef("run/src@0.1.0/src", "orders", "orders")
    for p in range(PARTITIONS):  # a source that failed for good, every partition confirmed failed
        part = source.partition(p)
        opened = await store.streams.open(
            StreamOpen(part, type_name(int), 8, ("totals",), partitions=PARTITIONS)
        )
        await store.streams.finish(StreamFinish(part, opened.generation, failed=True))
    shop = Shop()
    hooks = _CountingOpens(store)
    execution = Execution(_exposed(shop), {N: 60}, checkpoint=ExecCheckpoint("run", hooks))
    reference = CheckpointOutput(
        "forwarded", "stream", stream=source, terminal="failed", partitions=PARTITIONS
    )
    execution.restore_nodes([NodeCheckpoint("src", "completed", (reference,))])
    async with execution:
        with raises(StreamFailedError, match="the writer of stream run/src@0.1.0/src/orders/orders#"):
            await execution.wait()
    assert hooks.opened == []  # the recorded failure was verified by reads: nothing was opened
    assert shop.writer_runs == 0 and shop.handled == []


@node_check
async def a_node_commit_ends_only_the_partitions_its_record_names(store: Any) -> None:
    attempt = await store.open_attempt(CheckpointAttemptRequest("run", "orders", 0, 1))
    beyond = REF.partition(PARTITIONS)  # one partition past the record's count
    opened = await store.streams.open(StreamOpen(beyond, type_name(int), 8, ("totals",), partitions=4))
    output = CheckpointOutput("orders", "stream", stream=REF, terminal="finished", partitions=PARTITIONS)
    record = NodeCheckpoint("orders", "completed", (output,))
    with raises(CheckpointError, match="does not write stream"):
        await store.commit_nodes(
            [
                CheckpointCommit(
                    "run", attempt.scope, record, (StreamFinish(beyond, opened.generation, False),)
                )
            ]
        )
    assert await store.node_records("run") == ()  # nothing of the refused commit was kept
    held = await store.streams.describe(beyond)
    assert held is not None and not held.finished
