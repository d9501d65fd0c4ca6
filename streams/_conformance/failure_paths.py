"""Node-hook conformance on the failure paths: cancellations, hook faults, retried writers, early readers.

A host cancellation confirms nothing and spends no budget, whatever the
node's code does after it arrives (raise, return, skip). Every failure of a
hook, a cancellation exception the store raised included, is one latched
:class:`~streams.CheckpointError` that no Retry takes for a business
failure. A retried writer sends nothing twice, and a reader confirmed
before its writer ended resumes. Registered in :data:`NODE_CHECKS`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio

from .._aspects import Retry
from .._checkpoint import ExecCheckpoint
from .._context import NodeContext
from .._errors import CheckpointError
from .._execution import Execution, ExecutionEvent, Finished
from .._graph import Graph
from .._handle import MessageTx
from .._keys import Key, Stream
from .._store._node_records import CheckpointAttemptRequest
from .._testing import FaultyHooks, FaultyNodeHooks, InjectedFault, stray_cancellation
from ._support import raises
from .nodes import NODE_CHECKS, NodeWorld, crash_while, node_check, resumed

__all__: list[str] = []

URL = Key("url", str)
OUT = Key("out", str)
N = Key("n", int)
ORDERS = Key("orders", Stream[int])
TOTAL = Key("total", int)
FIRST = Key("first", int)

How = Literal["raises", "returns", "skips"]


class Stubborn:
    """Node ``work`` under ``Retry(3)``: held until the host cancels it, then it does ``how`` instead of
    letting the cancellation through; unheld, it fails ``failures`` times, then sets ``out``."""

    def __init__(self, how: How) -> None:
        self.how = how
        self.runs = 0
        self.hold = True
        self.failures = 0
        self.holding = anyio.Event()

    def graph(self) -> Graph:
        graph = Graph("stubborn", version="1", inputs=[URL])

        @graph.node(requires=[URL], provides=[OUT], aspects=[Retry(3)])
        async def work(ctx: NodeContext) -> None:
            self.runs += 1
            if self.hold:
                self.holding.set()
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    if self.how == "raises":
                        raise ValueError("cleanup broke") from None
                    if self.how == "skips":
                        ctx.skip_node()
                    ctx.set(OUT, "half done")
                    return
            if self.failures:
                self.failures -= 1
                raise ValueError("flaky")
            ctx.set(OUT, "done")

        return graph


def _swallowed_cancellation_check(how: How) -> Callable[[NodeWorld], Awaitable[None]]:
    """The host cancels a node that then raises, returns or skips: nothing confirmed, no budget spent."""

    async def run(world: NodeWorld) -> None:
        async with world.session() as store:
            node = Stubborn(how)
            graph = node.graph()
            execution = Execution(graph, {URL: "x"}, checkpoint=ExecCheckpoint("run", store))
            await crash_while(execution, node.holding)
            assert node.runs == 1  # a cancelled chain is not retried
            assert execution.snapshot().status == "cancelled"
            assert execution.result().statuses[("work",)] == "cancelled"
            assert await store.node_records("run") == ()  # no success, no skip confirmed
            assert not await store.scope_failed("run")  # and no failure

            node.hold, node.failures, node.runs = False, 2, 0
            again = await resumed(graph, store, "run", {URL: "x"})
            async with again:
                assert (await again.wait())[OUT] == "done"
            assert node.runs == 3  # the whole budget of three attempts was still there

    return run


for _how in ("raises", "returns", "skips"):
    NODE_CHECKS.append(
        (
            f"a_node_that_{_how}_after_a_host_cancellation_confirms_nothing_and_spends_no_budget",
            _swallowed_cancellation_check(_how),
        )
    )


class Shop:
    """``orders`` writes 1..n (resumable); ``billing`` sums them under ``Retry(2)``, its handler failing
    order 2 once; ``peek`` adds up the first two orders and concludes."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.billed: list[int] = []
        self.peeked: list[int] = []
        self.failed_once: set[int] = set()
        self.fail_order: int | None = 2
        self.writer_holds_after: int | None = None
        self.writer_fails_after: int | None = None
        self.holding = anyio.Event()

    def graph(self, *, peek: bool = False, attempts: int = 2) -> Graph:
        shop = Graph("shop", version="1", inputs=[N])

        @shop.node(requires=[N], provides=[ORDERS], resumable=True, aspects=[Retry(attempts)])
        async def orders(ctx: NodeContext) -> None:
            writer = ctx.writer(ORDERS)
            for order in range((writer.position or 0) + 1, ctx[N] + 1):
                await writer.send(order, send_at=order)
                self.sent.append(order)
                if order == self.writer_fails_after:
                    self.writer_fails_after = None
                    raise ValueError("the order source broke")  # sent, never flushed
                if order == self.writer_holds_after:
                    await writer.flush()
                    self.holding.set()
                    await anyio.sleep_forever()

        @shop.node(requires=[ORDERS], provides=[TOTAL], aspects=[Retry(attempts)])
        async def billing(ctx: NodeContext) -> None:
            async def bill(tx: MessageTx[int], order: int) -> None:
                if order == self.fail_order and order not in self.failed_once:
                    self.failed_once.add(order)
                    raise ValueError("billing hiccup")
                self.billed.append(order)
                tx.set_state(tx.state + order)
                tx.set(TOTAL, tx.state)

            await ctx.handle_messages(ORDERS, bill, initial_state=0, attempts=2)

        if peek:

            @shop.node(requires=[ORDERS], provides=[FIRST])
            async def peek_node(ctx: NodeContext) -> None:
                async def add(tx: MessageTx[int], order: int) -> None:
                    self.peeked.append(order)
                    tx.set_state(tx.state + order)
                    tx.set(FIRST, tx.state)

                await ctx.handle_messages(ORDERS, add, initial_state=0, limit=2)

        return shop


class _FaultyStreams(FaultyNodeHooks):
    """Node hooks counting their calls, whose stream hooks fail as ``streams`` says."""

    def __init__(self, inner: Any, streams: FaultyHooks) -> None:
        super().__init__(inner, fail={})
        self._streams = streams

    @property
    def streams(self) -> Any:
        return self._streams


def _stream_fault_check(
    hook: str, error: Callable[[str], BaseException]
) -> Callable[[NodeWorld], Awaitable[None]]:
    """A stream hook fails inside a graph (refused, or by raising a cancellation nothing asked for):
    one latched CheckpointError, no Retry takes it for a business failure, no budget is spent, and a
    resume finishes the run with the right answer."""

    async def run(world: NodeWorld) -> None:
        async with world.session() as store:
            shop = Shop()
            graph = shop.graph()
            faulty = FaultyHooks(store.streams, fail={hook: 1}, error=error)
            hooks = _FaultyStreams(store, faulty)
            execution = Execution(graph, {N: 5}, checkpoint=ExecCheckpoint("run", hooks))
            async with execution:
                with raises(CheckpointError):
                    await execution.wait()
            assert hooks.calls.get("fail_attempt", 0) == 0  # no Retry confirmed a failure of it
            assert not await store.scope_failed("run")
            again = await resumed(graph, store, "run", {N: 5})
            async with again:
                assert (await again.wait())[TOTAL] == 15
            assert sorted(set(shop.billed)) == [1, 2, 3, 4, 5]

    return run


for _hook in ("open", "append", "open_message", "fail_message", "commit"):
    for _name, _error in (("refused", InjectedFault), ("raising_a_cancellation", stray_cancellation)):
        NODE_CHECKS.append(
            (
                f"a_stream_{_hook}_{_name}_in_a_graph_latches_a_checkpoint_error_and_spends_no_budget",
                _stream_fault_check(_hook, _error),
            )
        )


@node_check
async def a_retried_writer_continues_from_what_its_stream_kept_and_sends_nothing_twice(store: Any) -> None:
    shop = Shop()
    shop.fail_order = None
    shop.writer_fails_after = 30  # sent 1..30 without a flush, then raised
    execution = Execution(shop.graph(attempts=3), {N: 60}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        assert (await execution.wait())[TOTAL] == sum(range(1, 61))
    assert shop.sent == list(range(1, 61))  # the retry began after order 30, the last one kept
    assert shop.billed == list(range(1, 61))


@node_check
async def a_reader_confirmed_before_its_active_writer_resumes_with_it(store: Any) -> None:
    shop = Shop()
    shop.fail_order = None
    shop.writer_holds_after = 3
    graph = shop.graph(peek=True)
    peeked = anyio.Event()

    def on_event(event: ExecutionEvent) -> None:
        if event == Finished((), "peek_node", "completed"):
            peeked.set()

    execution = Execution(graph, {N: 5}, checkpoint=ExecCheckpoint("run", store), on_event=on_event)
    with anyio.CancelScope() as host:
        async with execution:
            await shop.holding.wait()
            await peeked.wait()
            host.cancel()
            await execution.wait()
    assert "peek_node" in {r.node for r in await store.node_records("run")}  # confirmed; its writer is not

    shop.writer_holds_after = None
    again = await resumed(graph, store, "run", {N: 5})
    async with again:
        result = await again.wait()
    assert (result[TOTAL], result[FIRST]) == (15, 3)
    assert shop.peeked == [1, 2]  # restored: not run again
    assert shop.sent == [1, 2, 3, 4, 5]  # the writer continued from its position


@node_check
async def a_handler_that_raises_after_a_host_cancellation_spends_no_message_budget(store: Any) -> None:
    shop = Shop()
    shop.fail_order = None
    holding = anyio.Event()
    graph = Graph("desk", version="1", inputs=[N])

    @graph.node(requires=[N], provides=[ORDERS], resumable=True)
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        for order in range((writer.position or 0) + 1, ctx[N] + 1):
            await writer.send(order, send_at=order)

    @graph.node(requires=[ORDERS], provides=[TOTAL])
    async def billing(ctx: NodeContext) -> None:
        async def bill(tx: MessageTx[int], order: int) -> None:
            if order == 2 and not holding.is_set():
                holding.set()
                try:
                    await anyio.sleep_forever()
                except anyio.get_cancelled_exc_class():
                    raise ValueError("cleanup broke") from None  # not the message's failure
            shop.billed.append(order)
            tx.set_state(tx.state + order)
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(ORDERS, bill, initial_state=0)  # one attempt a message

    await crash_while(Execution(graph, {N: 3}, checkpoint=ExecCheckpoint("run", store)), holding)
    again = await resumed(graph, store, "run", {N: 3})
    async with again:  # order 2's only attempt is still there: no MessageExhaustedError
        assert (await again.wait())[TOTAL] == 6
    assert shop.billed == [1, 2, 3]


class _GatedOpens(FaultyNodeHooks):
    """Node hooks whose ``open_attempt`` for node ``slow`` waits for ``release``, noting each answer."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, fail={})
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.answered: list[str] = []

    async def open_attempt(self, request: CheckpointAttemptRequest) -> Any:
        if request.node == "slow":
            self.entered.set()
            await self.release.wait()
        attempt = await super().open_attempt(request)
        self.answered.append(request.node)
        return attempt


@node_check
async def a_failing_node_stops_the_others_without_cancelling_a_ledger_call_in_flight(store: Any) -> None:
    hooks = _GatedOpens(store)
    graph = Graph("fast_fail", version="1", inputs=[N])

    @graph.node(requires=[N], provides=[TOTAL])
    async def slow(ctx: NodeContext) -> None:
        ctx.set(TOTAL, 1)  # started in a cancelled run: nothing of it is confirmed

    @graph.node(requires=[N], provides=[FIRST])
    async def broken(ctx: NodeContext) -> None:
        await hooks.entered.wait()
        raise ValueError("broken")  # fails fast: the other nodes are cancelled

    def on_event(event: ExecutionEvent) -> None:
        if event == Finished((), "broken", "failed"):
            hooks.release.set()  # only now does the store answer the call in flight

    execution = Execution(graph, {N: 1}, checkpoint=ExecCheckpoint("run", hooks), on_event=on_event)
    async with execution:
        with raises(ValueError, match="broken"):
            await execution.wait()
    assert hooks.answered.count("slow") == 1  # the accepted call ran to its answer, not cancelled
    assert execution.result().statuses[("slow",)] == "cancelled"
    assert "slow" not in {r.node for r in await store.node_records("run")}


@node_check
async def cancelling_one_receive_interrupts_only_that_wait(store: Any) -> None:
    go = anyio.Event()
    graph = Graph("patient", version="1", inputs=[N])

    @graph.node(requires=[N], provides=[ORDERS])
    async def orders(ctx: NodeContext) -> None:
        await go.wait()
        for order in range(1, ctx[N] + 1):
            await ctx.writer(ORDERS).send(order)

    @graph.node(requires=[ORDERS], provides=[TOTAL])
    async def reader(ctx: NodeContext) -> None:
        messages = ctx.reader(ORDERS)
        with anyio.CancelScope() as wait:
            wait.cancel()
            await messages.receive()  # nothing sent yet: the wait is interrupted, nothing else
        assert wait.cancelled_caught
        go.set()
        total = 0
        async for message in messages:
            total += message.value
            await messages.ack(message)
        ctx.set(TOTAL, total)

    execution = Execution(graph, {N: 4}, checkpoint=ExecCheckpoint("run", store))
    async with execution:
        assert (await execution.wait())[TOTAL] == 10
