"""Stream ports in graphs: ordinary mode and declarations (checkpoint mode: the node conformance suite)."""

from __future__ import annotations

import asyncio
import multiprocessing.queues
import queue
import re
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from streams import (
    DeadLetter,
    ExecCheckpoint,
    Execution,
    Finished,
    Graph,
    GraphError,
    Key,
    KeyedState,
    ManagedStream,
    MemoryStore,
    MessageTx,
    NodeContext,
    OutputError,
    PayloadTypeError,
    Retry,
    Stream,
    StreamReader,
    StreamStateError,
    StreamWriter,
    open_scope,
    run_graph,
)
from streams._stream import StreamCore

N = Key("n", int)
ORDERS = Key("orders", Stream[int])
TOTAL = Key("total", int)
SEEN = Key("seen", list[int])


def problems_of(graph: Graph) -> list[str]:
    with pytest.raises(GraphError) as caught:
        graph.validate()
    return list(caught.value.problems)


async def _write(ctx: NodeContext) -> None:
    for i in range(1, ctx[N] + 1):
        await ctx.writer(ORDERS).send(i)


async def _noop(ctx: NodeContext) -> None:
    pass


def test_a_stream_nobody_reads_is_a_problem_of_the_graph() -> None:
    g = Graph("g", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])
    [problem] = problems_of(g)
    assert problem == (
        "node 'orders' writes stream Key('orders', streams.Stream[int]), which no node reads: "
        "add a node that requires it (its messages wait for every reader), or declare it among the root "
        "graph's outlets for a host to read"
    )


def test_a_sub_never_fixes_a_stream() -> None:
    child = Graph("child", inputs=[ORDERS])
    child.add_node("read", _noop, requires=[ORDERS])
    parent = Graph("parent", inputs=[N])
    with pytest.raises(GraphError, match="a stream is wired, never a fixed value"):
        parent.sub("c", child, fixed={ORDERS: 1})


async def _sum_all(ctx: NodeContext, key: Key[Stream[int]]) -> int:
    reader = ctx.reader(key)
    total = 0
    async for message in reader:
        total += message.value
        await reader.ack(message)
    return total


async def test_a_sub_exposes_a_stream_its_child_writes_and_readers_outside_read_it_live() -> None:
    child = Graph("child", inputs=[N])
    child.add_node("orders", _write, requires=[N], provides=[ORDERS])

    @child.node(requires=[ORDERS], provides=[TOTAL])
    async def inside(ctx: NodeContext) -> None:
        ctx.set(TOTAL, await _sum_all(ctx, ORDERS))

    outer = Graph("outer", inputs=[N])
    outer.sub("c", child, inlets={N: N}, outlets={ORDERS: ORDERS, TOTAL: TOTAL})
    OUTSIDE = Key("outside", int)

    @outer.node(requires=[ORDERS], provides=[OUTSIDE])
    async def outside(ctx: NodeContext) -> None:
        ctx.set(OUTSIDE, await _sum_all(ctx, ORDERS))

    async with Execution(outer, {N: 4}) as execution:
        result = await execution.wait()
    assert (result[TOTAL], result[OUTSIDE]) == (10, 10)
    [stream] = execution.streams().values()
    assert sorted(g.group for g in stream.snapshot().groups) == ["c/inside", "outside"]


async def test_a_pass_through_sub_completes_before_its_source_and_readers_get_everything() -> None:
    FORWARDED = Key("forwarded", Stream[int])
    passing = Graph("passing", inputs=[ORDERS])  # no node: it only forwards the stream back out
    outer = Graph("outer", inputs=[N])
    passed = anyio.Event()

    @outer.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        await ctx.writer(ORDERS).send(1)
        await passed.wait()  # the pass-through mount is done while its source still writes
        await ctx.writer(ORDERS).send(2)

    outer.sub("pass", passing, inlets={ORDERS: ORDERS}, outlets={ORDERS: FORWARDED})

    @outer.node(requires=[FORWARDED], provides=[TOTAL])
    async def after(ctx: NodeContext) -> None:
        ctx.set(TOTAL, await _sum_all(ctx, FORWARDED))

    def on_event(event: Any) -> None:
        if event == Finished((), "pass", "completed"):
            passed.set()

    result = await run_graph(outer, {N: 0}, on_event=on_event)
    assert result[TOTAL] == 3


def test_a_root_stream_input_takes_no_value_the_host_writes_it() -> None:
    g = Graph("g", inputs=[ORDERS])
    g.add_node("read", _noop, requires=[ORDERS])
    with pytest.raises(
        GraphError, match=re.escape("input Key('orders', streams.Stream[int]) of the root graph is a stream")
    ):
        Execution(g, {ORDERS: None})
    Execution(g, {})  # not given: the host writes it


class Hidden(msgspec.Struct):
    inner: list[Stream[int]]


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (MemoryObjectSendStream[int], "is or holds anyio.streams.memory.MemoryObjectSendStream"),
        (asyncio.Queue, "is or holds asyncio.queues.Queue"),
        (dict[str, queue.Queue], "is or holds queue.Queue"),  # type: ignore[type-arg]
        (list[Stream[int]], "the type holds streams.Stream[int]"),
        (Hidden, "the type holds streams.Stream[int]"),
        (Stream[Stream[int]], "the message type holds streams.Stream[int]"),
    ],
)
def test_channels_and_streams_hidden_in_a_keys_type_are_refused_when_declared(tp: Any, message: str) -> None:
    with pytest.raises(TypeError, match="key 'k': ") as caught:
        Key("k", tp)
    assert message in str(caught.value)


class _OwnWriter(StreamWriter[int]):
    """A subclass of an endpoint, defined outside the library."""


class _HoldsAReader(msgspec.Struct):
    reader: StreamReader[int]


@pytest.mark.parametrize(
    "tp",
    [
        ManagedStream[int],
        StreamWriter[int],
        StreamReader[int],
        StreamCore[int],
        ManagedStream,  # unparametrized
        _OwnWriter,
        list[StreamReader[int]],
        _HoldsAReader,
        Stream[dict[str, StreamWriter[int]]],
    ],
)
def test_every_stream_endpoint_type_is_refused_as_a_keys_type_whatever_its_module(tp: Any) -> None:
    # publish() names the endpoints after the package (streams.ManagedStream), not their module
    assert ManagedStream.__module__ == "streams"
    with pytest.raises(TypeError, match="key 'k': ") as caught:
        Key("k", tp)
    assert "a stream endpoint of a running scope: declare the stream as Key(name, Stream[T])" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (trio.MemorySendChannel[int], "is or holds trio.MemorySendChannel"),  # its __module__ is trio's
        (trio.MemoryReceiveChannel[int], "is or holds trio.MemoryReceiveChannel"),
        (MemoryObjectReceiveStream[int], "is or holds anyio.streams.memory.MemoryObjectReceiveStream"),
        # anyio renames a class of anyio.abc once it is looked up there: the module it says changes
        (anyio.abc.UnreliableObjectSendStream[int], "is or holds anyio.abc.UnreliableObjectSendStream"),
        (anyio.abc.ObjectReceiveStream[int], "is or holds anyio.abc.ObjectReceiveStream"),
        (queue.SimpleQueue, "is or holds _queue.SimpleQueue"),  # defined in C, in _queue
        (multiprocessing.queues.Queue, "is or holds multiprocessing.queues.Queue"),
    ],
)
def test_native_channels_are_refused_by_class_whatever_module_they_say_they_are_from(
    tp: Any, message: str
) -> None:
    with pytest.raises(TypeError, match="key 'k': ") as caught:
        Key("k", tp)
    assert f"{message}, a local channel no ledger can confirm" in str(caught.value)


class ManagedStreamLookalike(msgspec.Struct):
    """An ordinary value type that says it is the library's endpoint: only the class itself is refused."""

    value: int


ManagedStreamLookalike.__module__ = "streams._stream"
ManagedStreamLookalike.__qualname__ = "ManagedStream"


class Queue(msgspec.Struct):  # a user's class named like a channel
    items: list[int]


@pytest.mark.parametrize(
    "tp",
    [int, str, list[int], dict[str, tuple[int, ...]], Queue, ManagedStreamLookalike],
)
def test_ordinary_types_are_keys_types(tp: Any) -> None:
    assert Key("k", tp).type is tp
    assert Key("k", Stream[tp]).item_type is tp


async def test_readers_get_messages_while_their_writer_still_runs() -> None:
    g = Graph("live", inputs=[N])
    first_read = anyio.Event()

    @g.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        await writer.send(1)
        await first_read.wait()  # the reader got 1 before the writer finished
        await writer.send(2)

    @g.node(requires=[ORDERS], provides=[SEEN])
    async def watch(ctx: NodeContext) -> None:
        seen = []
        reader = ctx.reader(ORDERS)
        async for message in reader:
            seen.append(message.value)
            first_read.set()
            await reader.ack(message)
        ctx.set(SEEN, seen)

    result = await run_graph(g, {N: 0})
    assert result[SEEN] == [1, 2]


async def test_a_handlers_results_are_the_nodes_outputs() -> None:
    g = Graph("sum", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])

    @g.node(requires=[ORDERS], provides=[TOTAL])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[int], order: int) -> None:
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        result = await ctx.handle_messages(ORDERS, bill, initial_state=0)
        assert result.handled == 4

    assert (await run_graph(g, {N: 4}))[TOTAL] == 10


@pytest.mark.parametrize("concurrency", [None, 1])  # a node's stream is not partitioned: 1 is its one handler
async def test_a_nodes_handler_keeps_keyed_state_under_the_nodes_attempt(concurrency: int | None) -> None:
    totals = KeyedState(str, int)
    seen: list[tuple[int, int, int | None]] = []
    g = Graph("keyed", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])

    @g.node(requires=[ORDERS], provides=[TOTAL], aspects=[Retry(2)])
    async def billing(ctx: NodeContext) -> None:
        attempt = ctx.attempt

        async def bill(tx: MessageTx[None], order: int) -> None:
            store = totals.of(tx)
            before = await store.get("total")
            seen.append((attempt, order, before))
            store.put("total", (before or 0) + order)

        await ctx.handle_messages(
            ORDERS, bill, keyed=totals, limit=2 if attempt == 0 else None, concurrency=concurrency
        )
        if attempt == 0:
            raise ConnectionError("the node fails after two messages were confirmed")
        _, order, before = seen[-1]
        ctx.set(TOTAL, (before or 0) + order)

    result = await run_graph(g, {N: 4})
    # the failed attempt's messages stay acknowledged; its keyed state never reaches the retry
    assert seen == [(0, 1, None), (0, 2, 1), (1, 3, None), (1, 4, 3)]
    assert result[TOTAL] == 7


async def test_a_node_routes_exhausted_messages_to_a_dead_letter_stream_it_provides() -> None:
    dead = Key("orders.dead", Stream[DeadLetter[int]])
    g = Graph("dead", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])

    @g.node(requires=[ORDERS], provides=[TOTAL, dead])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[int], order: int) -> None:
            if order == 3:
                raise ZeroDivisionError("a bug")
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        result = await ctx.handle_messages(ORDERS, bill, initial_state=0, attempts=2, dead_letter=dead)
        assert result.handled == 4

    @g.node(requires=[dead], provides=[SEEN])
    async def operators(ctx: NodeContext) -> None:
        letters = [m.value async for m in ctx.reader(dead)]
        assert [(d.seq, d.group, d.node, d.attempts, d.error_type) for d in letters] == [
            (3, "billing", "billing", 2, "ZeroDivisionError")
        ]
        ctx.set(SEEN, [d.message for d in letters])

    result = await run_graph(g, {N: 4})
    assert (result[TOTAL], result[SEEN]) == (1 + 2 + 4, [3])


async def test_a_handler_setting_a_result_its_node_does_not_provide_fails_the_node() -> None:
    g = Graph("sum", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])

    @g.node(requires=[ORDERS])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[None], order: int) -> None:
            tx.set(TOTAL, order)

        await ctx.handle_messages(ORDERS, bill)

    with pytest.raises(OutputError, match="set result 'total', which the node does not provide"):
        await run_graph(g, {N: 1})


async def test_a_nodes_stream_ends_with_the_node_and_its_writer_cannot_end_it() -> None:
    g = Graph("own", inputs=[N])

    @g.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        await writer.send(1)
        with pytest.raises(StreamStateError, match="ends with the node"):
            await writer.finish()
        with pytest.raises(StreamStateError, match="ends with the node"):
            await writer.fail()
        with pytest.raises(OutputError, match="does not write stream"):
            ctx.writer(Key("other", Stream[int]))

    @g.node(requires=[ORDERS], provides=[SEEN])
    async def watch(ctx: NodeContext) -> None:
        with pytest.raises(KeyError, match="does not read stream"):
            ctx.reader(Key("other", Stream[int]))
        reader = ctx.reader(ORDERS)
        ctx.set(SEEN, [m.value async for m in reader])

    async with Execution(g, {N: 0}) as execution:
        result = await execution.wait()
    assert result[SEEN] == [1]
    [stream] = execution.streams().values()
    assert stream.finished and not stream.failed


async def test_a_failed_writer_fails_its_readers_stream_not_ends_it() -> None:
    g = Graph("broken", inputs=[N])

    @g.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        await ctx.writer(ORDERS).send(1)
        raise ValueError("source broke")

    g.add_node("watch", _noop, requires=[ORDERS])
    async with Execution(g, {N: 0}) as execution:
        with pytest.raises(ValueError, match="source broke"):
            await execution.wait()
    [stream] = execution.streams().values()
    assert stream.failed


async def test_a_writer_at_capacity_goes_on_once_a_slow_reader_concludes() -> None:
    g = Graph("slow", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])

    @g.node(requires=[ORDERS], provides=[TOTAL])
    async def first_only(ctx: NodeContext) -> None:
        reader = ctx.reader(ORDERS)
        message = await reader.receive()
        await reader.ack(message)
        ctx.set(TOTAL, message.value)  # and leaves: its group holds the writer back no more

    @g.node(requires=[ORDERS], provides=[SEEN])
    async def everything(ctx: NodeContext) -> None:
        reader = ctx.reader(ORDERS)
        seen = []
        async for message in reader:
            seen.append(message.value)
            await reader.ack(message)
        ctx.set(SEEN, seen)

    with anyio.fail_after(30):  # without the slow reader leaving, the writer would wait forever
        async with Execution(g, {N: 10}, stream_capacity=2) as execution:
            result = await execution.wait()
    assert (result[TOTAL], result[SEEN]) == (1, list(range(1, 11)))


class _NoFinish:
    """Stream hooks without ``finish``: incomplete, refused before any call."""

    def __init__(self) -> None:
        self._store = MemoryStore()
        self.open = self._store.open
        self.append = self._store.append
        self.open_message = self._store.open_message
        self.fail_message = self._store.fail_message
        self.commit = self._store.commit
        self.describe = self._store.describe


async def test_incomplete_stream_hooks_are_refused_before_any_call() -> None:
    with pytest.raises(TypeError, match="lack finish: a store implements all seven"):
        async with open_scope(_NoFinish(), scope="s"):  # type: ignore[arg-type]
            pass

    class Hooks:  # complete node hooks whose stream hooks are not
        streams = _NoFinish()
        open_attempt = fail_attempt = open_child = commit_nodes = MemoryStore().open_attempt

    g = Graph("g", inputs=[N])
    g.add_node("orders", _write, requires=[N], provides=[ORDERS])
    g.add_node("read", _noop, requires=[ORDERS])
    with pytest.raises(TypeError, match="lack finish"):
        Execution(g, {N: 1}, checkpoint=ExecCheckpoint("run", Hooks()))  # type: ignore[arg-type]
    plain = Graph("plain", inputs=[N])
    plain.add_node("noop", _noop, requires=[N])
    Execution(plain, {N: 1}, checkpoint=ExecCheckpoint("run", Hooks()))  # type: ignore[arg-type]  # no streams


async def test_a_channel_hidden_in_a_value_is_refused_at_input_and_at_set() -> None:
    anything = Key("anything", Any)
    send, receive = anyio.create_memory_object_stream[int](1)
    g = Graph("values", inputs=[anything])

    @g.node(requires=[anything], provides=[TOTAL, SEEN])
    async def hide(ctx: NodeContext) -> None:
        with pytest.raises(PayloadTypeError):
            ctx.set(SEEN, [send])  # type: ignore[misc]
        ctx.set(TOTAL, 1)

    with pytest.raises(GraphError, match="input Key\\('anything'"):
        Execution(g, {anything: {"channel": receive}})
    assert (await run_graph(g, {anything: {"fine": 1}}))[TOTAL] == 1
    send.close()
    receive.close()


async def test_a_sub_whose_child_writes_an_exposed_stream_is_not_run_again_after_a_failure() -> None:
    child = Graph("child", inputs=[N])
    runs: list[int] = []

    @child.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        runs.append(1)
        await ctx.writer(ORDERS).send(1)
        if len(runs) == 1:
            raise ValueError("the first attempt broke")

    outer = Graph("outer", inputs=[N])
    outer.sub("c", child, inlets={N: N}, outlets={ORDERS: ORDERS}, aspects=[Retry(2)])
    outer.add_node("read", _noop, requires=[ORDERS])
    with pytest.raises(OutputError, match="retry the writer inside the Sub, not the Sub"):
        await run_graph(outer, {N: 1})
    assert runs == [1]  # the second attempt stopped before running anything


def test_a_channel_module_imported_after_keys_were_declared_is_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answers are kept per type, but only for the channel modules imported when they were given."""
    import multiprocessing.queues
    import sys

    monkeypatch.delitem(sys.modules, "multiprocessing.queues")  # as if nobody had imported it yet
    Key("before", int)  # an answer given while the module was not imported
    monkeypatch.setitem(sys.modules, "multiprocessing.queues", multiprocessing.queues)
    with pytest.raises(TypeError, match="local channel"):
        Key("after", multiprocessing.queues.Queue)
