"""Node-hook conformance for stream ports: what a store shows when graph nodes write and read streams.

A writer node's stream ends with its node record (one transaction); a
restored writer runs nothing but reopens its stream, so readers continue
from their confirmed frontiers; an interrupted writer resumes only with its
promise; a failed writer's stream fails; Sub aliases share the endpoint,
each reader in a group of its own. Registered in :data:`NODE_CHECKS`.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec

from .._aspects import Retry
from .._checkpoint import ExecCheckpoint
from .._context import NodeContext
from .._errors import CheckpointError, RestorePlanError, StreamFailedError, StreamStateError
from .._execution import Execution, ExecutionEvent, Finished
from .._graph import Graph, NodeDef, members_of
from .._handle import MessageTx
from .._keys import Key, Stream
from .._partitions import PartitionedWriter
from .._store._node_records import (
    CheckpointAttemptRequest,
    CheckpointCommit,
    CheckpointOutput,
    NodeCheckpoint,
)
from .._store._records import AppendBatch, StreamFinish, StreamOpen, StreamRef
from .._stream import StreamWriter
from .._testing import FaultyHooks, PassThroughNodeHooks
from .._type_names import type_name
from ._support import raises
from .nodes import node_check, resumed

__all__: list[str] = []

N = Key("n", int)
ORDERS = Key("orders", Stream[int])
TOTAL = Key("total", int)
COUNT = Key("count", int)
BILLED = Key("billed", int)
AUDITED = Key("audited", int)


class Shop:
    """``orders`` writes 1..n; ``billing`` sums them and ``audit`` counts them, each a message handler.

    ``writer_holds_after`` makes the writer wait (forever) once that order
    is confirmed; ``hold_billing_at`` makes billing wait at that order. The
    lists record what ran, across executions.
    """

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.billed: list[int] = []
        self.writer_runs = 0
        self.writer_holds_after: int | None = None
        self.hold_billing_at: int | None = None
        self.fail_writer_after: int | None = None
        self.holding = anyio.Event()

    async def write_orders(self, ctx: NodeContext) -> None:
        """Node ``orders``: 1..n from its writer's position, held or failed where asked."""
        await self.write(ctx, ctx.writer(ORDERS))

    async def write(self, ctx: NodeContext, writer: StreamWriter[int] | PartitionedWriter[int]) -> None:
        """1..n on ``writer`` from its position, held or failed where asked."""
        self.writer_runs += 1
        for order in range((writer.position or 0) + 1, ctx[N] + 1):
            await writer.send(order, send_at=order)
            self.sent.append(order)
            if order == self.fail_writer_after:
                raise ValueError("the order source broke")
            if order == self.writer_holds_after:
                await writer.flush()
                self.holding.set()
                await anyio.sleep_forever()

    def graph(self, *, resumable: bool = False) -> Graph:
        shop = Graph("shop", version="1", inputs=[N])

        shop.add_node("orders", self.write_orders, requires=[N], provides=[ORDERS], resumable=resumable)

        @shop.node(requires=[ORDERS], provides=[TOTAL])
        async def billing(ctx: NodeContext) -> None:
            async def bill(tx: MessageTx[int], order: int) -> None:
                if order == self.hold_billing_at:
                    self.holding.set()
                    await anyio.sleep_forever()
                self.billed.append(order)
                tx.set_state(tx.state + order)
                tx.set(TOTAL, tx.state)

            await ctx.handle_messages(ORDERS, bill, initial_state=0)

        @shop.node(requires=[ORDERS], provides=[COUNT])
        async def audit(ctx: NodeContext) -> None:
            async def count(tx: MessageTx[int], order: int) -> None:
                tx.set_state(tx.state + 1)
                tx.set(COUNT, tx.state)

            await ctx.handle_messages(ORDERS, count, initial_state=0)

        return shop


async def _crash_when(execution: Execution, *events: anyio.Event) -> None:
    """Run ``execution`` until every event is set, then cancel it as a dying host would."""
    with anyio.CancelScope() as host:
        async with execution:
            for event in events:
                await event.wait()
            host.cancel()
            await execution.wait()


async def _crash_once_confirmed(graph: Graph, store: Any, holding: anyio.Event, node: str) -> None:
    """Run ``graph`` as run ``run`` until something holds and ``node`` is confirmed, then crash it."""
    confirmed, on_event = _finished_event(node)
    execution = Execution(graph, {N: 5}, checkpoint=ExecCheckpoint("run", store), on_event=on_event)
    await _crash_when(execution, holding, confirmed)


def _finished_event(node: str) -> tuple[anyio.Event, Any]:
    done = anyio.Event()

    def on_event(event: ExecutionEvent) -> None:
        if event == Finished((), node, "completed"):
            done.set()

    return done, on_event


async def _stream_end(store: Any, ref: StreamRef) -> tuple[bool, bool]:
    """(finished, failed) of stream ``ref`` as the store confirmed it (reopening raises its generation)."""
    # groups the stream may not have yet join at its end: the probe reads nothing
    opened = await store.streams.open(
        StreamOpen(ref, type_name(int), 1024, ("billing", "audit"), True, start="latest")
    )
    return opened.finished, opened.failed


@node_check
async def a_writers_stream_ends_with_its_node_record(store: Any) -> None:
    shop = Shop()
    execution = Execution(shop.graph(), {N: 5}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        result = await execution.wait()
    assert (result[TOTAL], result[COUNT]) == (15, 5)
    [writer] = [r for r in await store.node_records("run") if r.node == "orders"]
    ref = StreamRef("run", "orders", "orders")
    assert writer.outputs == (CheckpointOutput("orders", "stream", stream=ref, terminal="finished"),)
    assert await _stream_end(store, ref) == (True, False)


@node_check
async def a_restored_writer_reopens_its_stream_and_readers_continue_from_their_frontier(
    store: Any,
) -> None:
    shop = Shop()
    shop.hold_billing_at = 4
    # orders confirmed; billing confirmed 1..3
    await _crash_once_confirmed(shop.graph(), store, shop.holding, "orders")
    assert shop.billed == [1, 2, 3]

    shop.hold_billing_at = None
    again = await resumed(shop.graph(), store, "run", {N: 5})
    async with again:
        result = await again.wait()
    assert (result[TOTAL], result[COUNT]) == (15, 5)
    assert shop.writer_runs == 1  # restored: its stream reopened, its body not run
    assert shop.billed == [1, 2, 3, 4, 5]  # no confirmed message handled twice


@node_check
async def an_interrupted_writer_resumes_only_with_its_promise_to_continue(store: Any) -> None:
    shop = Shop()
    shop.writer_holds_after = 2
    await _crash_when(Execution(shop.graph(), {N: 5}, checkpoint=ExecCheckpoint("run", store)), shop.holding)
    shop.writer_holds_after = None

    refused = await resumed(shop.graph(), store, "run", {N: 5})
    async with refused:
        with raises(CheckpointError, match="resumable=True"):
            await refused.wait()
    assert shop.writer_runs == 1  # the writer did not run again on the stream it had begun

    again = await resumed(shop.graph(resumable=True), store, "run", {N: 5})
    async with again:
        result = await again.wait()
    assert (result[TOTAL], result[COUNT]) == (15, 5)
    assert shop.sent == [1, 2, 3, 4, 5]  # continued from its position: nothing sent twice


@node_check
async def a_failed_writer_fails_its_stream_and_the_run(store: Any) -> None:
    shop = Shop()
    shop.fail_writer_after = 2
    execution = Execution(shop.graph(), {N: 5}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        with raises(ValueError, match="the order source broke"):
            await execution.wait()
    assert "orders" not in {r.node for r in await store.node_records("run")}
    assert await store.scope_failed("run")  # the run failed for good: no resume reopens its failed stream
    assert await _stream_end(store, StreamRef("run", "orders", "orders")) == (False, True)


@node_check
async def a_node_commit_ends_only_the_streams_it_owns(store: Any) -> None:
    attempt = await store.open_attempt(CheckpointAttemptRequest("run", "a", 0, 1))
    other = StreamRef("run", "b", "orders")
    opened = await store.streams.open(StreamOpen(other, type_name(int), 8, ("reader",)))
    record = NodeCheckpoint("a", "completed", ())
    with raises(CheckpointError, match="does not write stream"):
        await store.commit_nodes(
            [CheckpointCommit("run", attempt.scope, record, (StreamFinish(other, opened.generation, False),))]
        )
    assert await store.node_records("run") == ()  # nothing of the refused commit was kept
    assert await _stream_end(store, other) == (False, False)


def _fanned(shop: Shop) -> Graph:
    """One orders stream read by two mounts of the same child graph, each mount a Sub alias."""
    tally = Graph("tally", version="1", inputs=[ORDERS])

    @tally.node(requires=[ORDERS], provides=[TOTAL])
    async def add(ctx: NodeContext) -> None:
        async def add_one(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, add_one, initial_state=0)

    fan = Graph("fan", version="1", inputs=[N])

    @fan.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        shop.writer_runs += 1
        for order in range(1, ctx[N] + 1):
            await ctx.writer(ORDERS).send(order)

    fan.sub("billing", tally, inlets={ORDERS: ORDERS}, outlets={TOTAL: BILLED})
    fan.sub("audit", tally, inlets={ORDERS: ORDERS}, outlets={TOTAL: AUDITED})
    return fan


@node_check
async def sub_aliases_share_one_endpoint_each_reader_in_a_group_of_its_own(store: Any) -> None:
    shop = Shop()
    execution = Execution(_fanned(shop), {N: 4}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        result = await execution.wait()
    assert (result[BILLED], result[AUDITED]) == (10, 10)
    [stream] = execution.streams().values()
    snapshot = stream.snapshot()
    assert sorted(g.group for g in snapshot.groups) == ["audit/add", "billing/add"]
    assert all(g.acked_through == 4 for g in snapshot.groups)

    again = await resumed(_fanned(shop), store, "run", {N: 4})  # every node confirmed: nothing runs
    async with again:
        assert (await again.wait())[AUDITED] == 10
    assert shop.writer_runs == 1


FORWARDED = Key("forwarded", Stream[int])


class Relay(Shop):
    """A stream that reaches its reader ``after`` through a Sub: forwarded by one, or written inside one.

    ``shape="pass"``: root node ``orders`` writes; mount ``pass`` (a child
    with no node) forwards the stream back out as ``forwarded``.
    ``shape="inside"``: node ``orders`` inside mount ``src`` writes, and the
    mount exposes the stream. ``after`` sums what it reads, in explicit state.
    """

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape
        self.hold_after_at: int | None = None

    def graph(self, *, resumable: bool = True) -> Graph:
        relay = Graph("relay", version="1", inputs=[N])
        writing = Graph("writing", version="1", inputs=[N]) if self.shape == "inside" else relay

        writing.add_node("orders", self.write_orders, requires=[N], provides=[ORDERS], resumable=resumable)

        if self.shape == "inside":
            relay.sub("src", writing, inlets={N: N}, outlets={ORDERS: FORWARDED})
        else:
            relay.sub(
                "pass",
                Graph("passing", version="1", inputs=[ORDERS]),
                inlets={ORDERS: ORDERS},
                outlets={ORDERS: FORWARDED},
            )

        @relay.node(requires=[FORWARDED], provides=[TOTAL])
        async def after(ctx: NodeContext) -> None:
            async def add(tx: MessageTx[int], order: int) -> None:
                if order == self.hold_after_at:
                    self.holding.set()
                    await anyio.sleep_forever()
                tx.set_state(tx.state + order)
                tx.set(TOTAL, tx.state)

            await ctx.handle_messages(FORWARDED, add, initial_state=0)

        return relay


@node_check
async def a_pass_through_sub_confirmed_before_its_source_is_an_alias_of_the_resumed_source(
    store: Any,
) -> None:
    relay = Relay("pass")
    relay.writer_holds_after = 2
    # pass confirmed; its source still active
    await _crash_once_confirmed(relay.graph(), store, relay.holding, "pass")
    source = StreamRef("run", "orders", "orders")
    [record] = [r for r in await store.node_records("run") if r.node == "pass"]
    assert record.outputs == (CheckpointOutput("forwarded", "stream", stream=source),)

    relay.writer_holds_after = None
    again = await resumed(relay.graph(), store, "run", {N: 5})
    async with again:
        assert (await again.wait())[TOTAL] == 15
    assert list(again.streams()) == [source]  # the restored alias and the resumed writer share one
    assert relay.sent == [1, 2, 3, 4, 5] and relay.writer_runs == 2


@node_check
async def a_stream_written_inside_a_sub_is_exposed_by_its_mount_and_reopened_from_its_record(
    store: Any,
) -> None:
    relay = Relay("inside")
    relay.hold_after_at = 4
    # src (and its writer) confirmed, after at 4
    await _crash_once_confirmed(relay.graph(), store, relay.holding, "src")
    [record] = [r for r in await store.node_records("run") if r.node == "src"]
    [output] = record.outputs
    assert output.stream is not None and (output.stream.node, output.stream.key) == ("orders", "orders")

    relay.hold_after_at = None
    again = await resumed(relay.graph(), store, "run", {N: 5})
    async with again:
        assert (await again.wait())[TOTAL] == 15
    assert relay.writer_runs == 1  # the mount was restored: its child's writer did not run again
    assert await _stream_end(store, output.stream) == (True, False)


@node_check
async def a_readers_failed_attempt_leaves_its_acks_but_never_its_state_or_results(store: Any) -> None:
    tries: list[int] = []
    shop = Graph("retried", version="1", inputs=[N])

    @shop.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        for order in range(1, ctx[N] + 1):
            await ctx.writer(ORDERS).send(order)

    @shop.node(requires=[ORDERS], provides=[TOTAL], aspects=[Retry(2)])
    async def billing(ctx: NodeContext) -> None:
        async def add(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        tries.append(len(tries))
        if len(tries) == 1:  # the first attempt confirms two messages, then fails
            await ctx.handle_messages(ORDERS, add, initial_state=0, limit=2)
            raise ValueError("billing broke after two orders")
        result = await ctx.handle_messages(ORDERS, add, initial_state=0)
        assert result.handled == 3  # orders 1 and 2 stay acknowledged

    execution = Execution(shop, {N: 5}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        result = await execution.wait()
    assert result[TOTAL] == 3 + 4 + 5  # nothing of the failed attempt's state or results
    [record] = [r for r in await store.node_records("run") if r.node == "billing"]
    assert record.outputs[0].value == msgspec.msgpack.encode(12)


@node_check
async def a_reclaimed_reader_attempt_gets_its_confirmed_results_before_its_chain_never_published_early(
    store: Any,
) -> None:
    shop = Shop()
    shop.hold_billing_at = 3
    # billing confirmed orders 1 and 2, then died
    await _crash_once_confirmed(shop.graph(), store, shop.holding, "orders")
    seen: list[object] = []
    shop_graph = Graph("shop", version="1", inputs=[N])  # the same graph, whose billing now only returns
    for member in members_of(shop.graph()):
        if member.name != "billing":
            assert isinstance(member, NodeDef)
            shop_graph.add_node(member.name, member.fn, requires=member.requires, provides=member.provides)

    @shop_graph.node(requires=[ORDERS], provides=[TOTAL])
    async def billing(ctx: NodeContext) -> None:
        seen.append(again.result().values.get(TOTAL, "unpublished"))

    again = await resumed(shop_graph, store, "run", {N: 5})
    async with again:
        result = await again.wait()
    assert seen == ["unpublished"]  # restored into its write set, not published before its commit
    assert result[TOTAL] == 1 + 2  # what its confirmed messages set under this attempt


class _CountingOpens(PassThroughNodeHooks):
    """The store's hooks (its stream hooks, or ``streams``), noting every stream Open."""

    def __init__(self, inner: Any, streams: Any = None) -> None:
        super().__init__(inner)
        self.opened: list[StreamRef] = []
        self._streams = _OpenNoter(inner.streams if streams is None else streams, self.opened)

    @property
    def streams(self) -> Any:
        return self._streams


class _OpenNoter:
    def __init__(self, inner: Any, opened: list[StreamRef]) -> None:
        self._inner, self._opened = inner, opened

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def open(self, request: StreamOpen) -> Any:
        self._opened.append(request.ref)
        return await self._inner.open(request)


#: Where the writer of :func:`_aliased` writes in run ``run``: mount ``src``'s child scope.
FAILED_SOURCE = StreamRef("run/src@0.1.0/src", "orders", "orders")


def _aliased(shop: Shop, seen: list[str]) -> Graph:
    """Mount ``src`` exposes the stream its child's node ``orders`` writes; ``peek`` reads it."""
    writing = Graph("writing", version="1", inputs=[N])
    writing.add_node("orders", shop.write_orders, requires=[N], provides=[ORDERS])
    graph = Graph("aliased", version="1", inputs=[N])
    graph.sub("src", writing, inlets={N: N}, outlets={ORDERS: FORWARDED})
    graph.add_node("peek", _peek_failed(seen, FORWARDED), requires=[FORWARDED], provides=[COUNT])
    return graph


async def _hold(store: Any, ref: StreamRef, end: str) -> None:
    """Make the store hold stream ``ref`` as a writer leaves it: one message, then ``end``
    (``"failed"``, ``"finished"``, or ``"active"``: not ended)."""
    opened = await store.streams.open(StreamOpen(ref, type_name(int), 8, ("peek",)))
    await store.streams.append(AppendBatch(ref, opened.generation, 1, (msgspec.msgpack.encode(1),)))
    if end != "active":
        await store.streams.finish(StreamFinish(ref, opened.generation, failed=end == "failed"))


def _failed_reference(ref: StreamRef) -> NodeCheckpoint:
    """Mount ``src``'s record, naming ``ref`` as its exposed stream's source, recorded failed."""
    return NodeCheckpoint(
        "src", "completed", (CheckpointOutput("forwarded", "stream", stream=ref, terminal="failed"),)
    )


@node_check
async def a_restored_alias_of_a_failed_source_is_a_local_read_only_failed_endpoint(store: Any) -> None:
    await _hold(store, FAILED_SOURCE, "failed")  # a source that failed for good
    held = await store.streams.describe(FAILED_SOURCE)
    shop, seen = Shop(), list[str]()
    hooks = _CountingOpens(store)
    execution = Execution(_aliased(shop, seen), {N: 5}, checkpoint=ExecCheckpoint("run", hooks))
    execution.restore_nodes([_failed_reference(FAILED_SOURCE)])
    async with execution:
        await execution.wait()
    assert FAILED_SOURCE not in hooks.opened  # no Open for the recorded failure
    assert seen == ["failed", "send refused", "ack refused"]  # the business failure, not EOF; read-only
    assert shop.writer_runs == 0  # the confirmed alias did not rerun its child
    assert await store.streams.describe(FAILED_SOURCE) == held  # verified by a read: no generation raised

    plain = Graph("plain", version="1", inputs=[N])
    plain.add_node("orders", shop.write_orders, requires=[N], provides=[ORDERS])
    plain.add_node("read", _peek_failed([], ORDERS), requires=[ORDERS], provides=[COUNT])
    own = CheckpointOutput(
        "orders", "stream", stream=StreamRef("run-2", "orders", "orders"), terminal="failed"
    )
    with raises(RestorePlanError, match="only a Sub alias may carry a failed source"):
        Execution(plain, {N: 1}, checkpoint=ExecCheckpoint("run-2", store)).restore_nodes(
            [NodeCheckpoint("orders", "completed", (own,))]
        )


@node_check
async def a_failed_alias_across_deeper_sub_layers_is_verified_in_the_scope_of_its_retried_attempt(
    store: Any,
) -> None:
    # the writer is two mounts deep; the outer mount's Retry ran the child in its second attempt
    source = StreamRef("run/outer@0.1.0/outer@1.2.1/outer/inner@0.1.0/inner", "orders", "orders")
    await _hold(store, source, "failed")
    shop, seen = Shop(), list[str]()
    writing = Graph("writing", version="1", inputs=[N])
    writing.add_node("orders", shop.write_orders, requires=[N], provides=[ORDERS])
    middle = Graph("middle", version="1", inputs=[N])
    middle.sub("inner", writing, inlets={N: N}, outlets={ORDERS: ORDERS})
    graph = Graph("deep", version="1", inputs=[N])
    graph.sub("outer", middle, inlets={N: N}, outlets={ORDERS: FORWARDED}, aspects=[Retry(2)])
    graph.add_node("peek", _peek_failed(seen, FORWARDED), requires=[FORWARDED], provides=[COUNT])
    reference = CheckpointOutput("forwarded", "stream", stream=source, terminal="failed")
    hooks = _CountingOpens(store)
    execution = Execution(graph, {N: 5}, checkpoint=ExecCheckpoint("run", hooks))
    execution.restore_nodes([NodeCheckpoint("outer", "completed", (reference,))])
    async with execution:
        await execution.wait()
    assert hooks.opened == [] and shop.writer_runs == 0
    assert seen == ["failed", "send refused", "ack refused"]


async def _refused_alias(store: Any, recorded: StreamRef, match: str) -> None:
    """Restore mount ``src`` with a failed reference to ``recorded``, which the store must refuse.

    The refusal is the tree's latched failure, naming what differs: the
    restored mount runs no child (its writer never runs), ``peek`` never
    reads, nothing is restored as a failed endpoint, nothing is opened, and
    the store is as it was (no Open raised a generation).
    """
    held = await store.streams.describe(recorded)
    shop, seen = Shop(), list[str]()
    hooks = _CountingOpens(store)
    execution = Execution(_aliased(shop, seen), {N: 5}, checkpoint=ExecCheckpoint("run", hooks))
    execution.restore_nodes([_failed_reference(recorded)])
    async with execution:
        with raises(CheckpointError, match=match):
            await execution.wait()
    assert execution.result().statuses[("src",)] == "failed"
    assert shop.writer_runs == 0 and seen == []
    assert execution.streams() == {} and hooks.opened == []
    assert await store.streams.describe(recorded) == held
    if recorded != FAILED_SOURCE:
        assert await store.streams.describe(FAILED_SOURCE) is None


@node_check
async def a_failed_alias_naming_a_scope_its_wiring_does_not_lead_to_is_refused(store: Any) -> None:
    for scope in (
        "run-2/src@0.1.0/src",  # the same mount, in another run
        "run/peek@0.1.0/src",  # under another node's attempt
        "run/src@0.2.0/src",  # a complete chain has one attempt
        "run/src@0.1.0/src@1.2.2/src",  # an attempt past its boundary's limit
        "run/src@0.1.0",  # the mount's attempt, not its child
    ):
        bogus = StreamRef(scope, "orders", "orders")
        await _hold(store, bogus, "failed")  # a real failed stream: only its scope is wrong
        await _refused_alias(store, bogus, f"scope {scope!r} is not one the wiring leads to")


@node_check
async def a_failed_alias_whose_source_the_store_holds_finished_is_refused(store: Any) -> None:
    await _hold(store, FAILED_SOURCE, "finished")
    await _refused_alias(store, FAILED_SOURCE, r"\(recorded failed\), which the store holds finished")


@node_check
async def a_failed_alias_whose_source_the_store_holds_active_is_refused(store: Any) -> None:
    await _hold(store, FAILED_SOURCE, "active")
    await _refused_alias(store, FAILED_SOURCE, r"\(recorded failed\), which the store holds active")


@node_check
async def a_failed_alias_whose_store_read_fails_is_a_reliable_failure(store: Any) -> None:
    await _hold(store, FAILED_SOURCE, "failed")
    shop, seen = Shop(), list[str]()
    hooks = _CountingOpens(store, FaultyHooks(store.streams, fail={"describe": 1}))
    execution = Execution(_aliased(shop, seen), {N: 5}, checkpoint=ExecCheckpoint("run", hooks))
    execution.restore_nodes([_failed_reference(FAILED_SOURCE)])
    async with execution:
        with raises(CheckpointError, match="describe failed: InjectedFault"):
            await execution.wait()
    assert shop.writer_runs == 0 and seen == [] and execution.streams() == {}


@node_check
async def a_failed_alias_of_a_stream_the_store_never_had_is_refused(store: Any) -> None:
    await _refused_alias(store, FAILED_SOURCE, r"\(recorded failed\), which the store never had")


def _peek_failed(seen: list[str], key: Key[Stream[int]]) -> Any:
    async def peek(ctx: NodeContext) -> None:
        reader = ctx.reader(key)
        try:
            await reader.receive()
        except StreamFailedError:
            seen.append("failed")
        try:
            await reader.stream.writer().send(1)
        except StreamStateError:
            seen.append("send refused")
        try:
            await reader.ack(1)
        except StreamStateError:
            seen.append("ack refused")
        ctx.set(COUNT, 0)

    return peek
