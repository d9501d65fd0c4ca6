"""Invariants 2, 4 and 7: one transaction per message, budgets, staged outputs."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel

from .. import (
    CheckpointError,
    HandleResult,
    Key,
    ManagedStream,
    MessageExhaustedError,
    MessageTx,
    NoValue,
    OutputLimitError,
    PayloadTypeError,
    Stream,
    StreamFailedError,
    StreamHooks,
    StreamScope,
    StreamStateError,
    StreamWriter,
    handle_messages,
    open_scope,
)
from .._testing import FaultyHooks, InjectedFault, PassThroughHooks
from ..store import MessageCommit
from ._support import World, check, raises
from .records import INVOICES, NUMBERS, ORDERS, TOTAL, Invoice, Order, Totals


async def _orders(scope: StreamScope, n: int, *, finish: bool = True) -> None:
    stream = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
    writer = stream.writer()
    for i in range((writer.position or 0) + 1, n + 1):
        await writer.send(Order(i, i), send_at=i)
    if finish:
        await writer.finish()
    else:
        await writer.flush()


async def _bill(scope: StreamScope, *, fail_on: int = 0, attempts: int = 1) -> HandleResult[Totals]:
    orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
    invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), resumable=True)
    out: StreamWriter[Invoice] = invoices.writer()

    async def bill(tx: MessageTx[Totals], order: Order) -> None:
        tx.set_state(Totals(tx.state.total + order.amount, tx.state.count + 1))
        tx.send(out, Invoice(order.id, order.amount))
        tx.set(TOTAL, tx.state.total)
        if order.id == fail_on:
            raise RuntimeError("business failure")

    return await handle_messages(orders.reader("billing"), bill, initial_state=Totals(), attempts=attempts)


async def _invoices(scope: StreamScope) -> list[Invoice]:
    invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), resumable=True)
    await invoices.writer().finish()
    return [m.value async for m in invoices.reader("audit")]


@check
async def test_state_outputs_and_results_are_confirmed_with_each_ack(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 50)
        result = await _bill(scope)
        assert result.handled == 50
        assert result.state == Totals(50 * 51 // 2, 50)
        assert result.result(TOTAL) == 50 * 51 // 2
        assert [i.order for i in await _invoices(scope)] == list(range(1, 51))


@check
async def test_a_message_tx_kept_past_its_handler_call_refuses_everything(world: World) -> None:
    kept: list[MessageTx[int]] = []
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 2)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), resumable=True)

        async def keep(tx: MessageTx[int], order: Order) -> None:
            kept.append(tx)

        result = await handle_messages(orders.reader("billing"), keep, initial_state=0)
        assert result.handled == 2
        tx = kept[0]
        uses: tuple[tuple[str, Callable[[], None]], ...] = (
            ("set_state", lambda: tx.set_state(5)),
            ("send", lambda: tx.send(invoices.writer(), Invoice(1, 1))),
            ("set", lambda: tx.set(TOTAL, 1)),
            ("stop", tx.stop),
        )
        for what, use in uses:
            with raises(StreamStateError, match=f"message 1: {what} after its handler call returned"):
                use()


@check
async def test_a_failed_commit_confirms_nothing_and_recovery_resumes_from_the_last_commit(
    world: World,
) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 300)
    async with world.session() as hooks:
        faulty = FaultyHooks(hooks, fail={"commit": 2})
        with raises(CheckpointError) as info:
            async with open_scope(faulty, scope="s") as scope:
                await _bill(scope)
        assert isinstance(info.value.__cause__, InjectedFault)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), resumable=True)
        acked = orders.snapshot().groups[0].acked_through
        assert 0 < acked < 300
        assert invoices.snapshot().appended == acked
        result = await _bill(scope)
        assert result.state == Totals(300 * 301 // 2, 300)
        assert [i.order for i in await _invoices(scope)] == list(range(1, 301))


@check
async def test_a_commit_whose_answer_was_lost_is_found_in_the_ledger(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 20)
    async with world.session() as hooks:
        faulty = FaultyHooks(hooks, fail={"commit": 1}, after=True)
        with raises(CheckpointError):
            async with open_scope(faulty, scope="s") as scope:
                await _bill(scope)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        committed = orders.snapshot().groups[0].acked_through
        assert committed >= 1
        result = await _bill(scope)
        assert result.handled == 20 - committed
        assert result.state == Totals(210, 20)
        assert len(await _invoices(scope)) == 20


@check
async def test_failed_attempt_publishes_no_outputs_and_retries_from_the_same_state(world: World) -> None:
    attempts_seen: list[tuple[int, int]] = []
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 3)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), resumable=True)
        out = invoices.writer()

        async def flaky(tx: MessageTx[Totals], order: Order) -> None:
            attempts_seen.append((order.id, tx.attempt))
            tx.send(out, Invoice(order.id, order.amount))
            tx.set_state(Totals(tx.state.total + order.amount, tx.state.count + 1))
            if order.id == 2 and tx.attempt < 2:
                raise RuntimeError("flaky")

        result = await handle_messages(orders.reader("billing"), flaky, initial_state=Totals(), attempts=3)
        assert result.state == Totals(6, 3)
        assert attempts_seen == [(1, 0), (2, 0), (2, 1), (2, 2), (3, 0)]
        assert [i.order for i in await _invoices(scope)] == [1, 2, 3]


@check
async def test_exhausted_message_fails_the_handler_here_and_after_every_restart(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 5)
        with raises(MessageExhaustedError, match="#3"):
            await _bill(scope, fail_on=3, attempts=2)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        group = orders.snapshot().groups[0]
        assert (group.acked_through, group.exhausted) == (2, 1)
    calls: list[int] = []
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

        async def never(tx: MessageTx[None], order: Order) -> None:
            calls.append(order.id)

        with raises(MessageExhaustedError):
            await handle_messages(orders.reader("billing"), never, attempts=2)
    assert calls == []


@check
async def test_crash_inside_an_attempt_reclaims_the_same_attempt(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 1)
    seen: list[int] = []
    for _ in range(2):
        async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
            orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

            cancel = anyio.CancelScope()

            async def crash(tx: MessageTx[None], order: Order, cancel: anyio.CancelScope = cancel) -> None:
                seen.append(tx.attempt)
                cancel.cancel()  # the process dies in the middle of the attempt
                await anyio.lowlevel.checkpoint()

            with cancel:
                await handle_messages(orders.reader("billing"), crash, attempts=3)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        tries: list[int] = []

        async def ok(tx: MessageTx[None], order: Order) -> None:
            tries.append(tx.attempt)

        result = await handle_messages(orders.reader("billing"), ok, attempts=3)
        assert result.handled == 1
    assert seen == [0, 0]
    assert tries == [0]


@check
async def test_a_new_parent_attempt_has_a_budget_of_its_own(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 1)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

        async def boom(tx: MessageTx[None], order: Order) -> None:
            raise RuntimeError("boom")

        with raises(MessageExhaustedError):
            await handle_messages(orders.reader("billing"), boom, parent_attempt="parent/0")

        async def ok(tx: MessageTx[None], order: Order) -> None:
            assert tx.attempt == 0

        result = await handle_messages(orders.reader("billing"), ok, parent_attempt="parent/1")
        assert result.handled == 1
        assert orders.snapshot().groups[0].exhausted == 0


@check
async def test_a_failed_parent_attempts_state_and_results_never_reach_the_next_one(world: World) -> None:
    async def total(tx: MessageTx[int], order: Order) -> None:
        tx.set_state(tx.state + order.amount)
        tx.set(TOTAL, tx.state)

    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 5)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        first = await handle_messages(
            orders.reader("billing"), total, initial_state=0, parent_attempt="node@0.1.0", limit=2
        )
        assert (first.state, first.result(TOTAL)) == (3, 3)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:  # a crash: the same attempt
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        again = await handle_messages(
            orders.reader("billing"), total, initial_state=0, parent_attempt="node@0.1.0", limit=1
        )
        assert (again.state, again.result(TOTAL)) == (6, 6)  # it continues from its own state
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:  # that attempt failed
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        fresh = await handle_messages(
            orders.reader("billing"), total, initial_state=0, parent_attempt="node@0.1.1"
        )
        assert fresh.handled == 2  # the failed attempt's confirmed messages stay acknowledged
        assert (fresh.state, fresh.result(TOTAL)) == (4 + 5, 4 + 5)  # but its state and results are gone
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        [group] = orders.snapshot().groups
        assert group.acked_through == 5
        done = await handle_messages(
            orders.reader("billing"), total, initial_state=0, parent_attempt="node@0.1.1"
        )
        assert (done.handled, done.state, done.result(TOTAL)) == (0, 9, 9)


@check
async def test_raising_the_generation_never_replenishes_a_budget(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 1)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

        async def fail_once(tx: MessageTx[None], order: Order) -> None:
            raise RuntimeError("boom")

        with raises(MessageExhaustedError):
            await handle_messages(orders.reader("billing"), fail_once, attempts=2)
    attempts: list[int] = []
    for _ in range(3):
        async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
            orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

            async def record(tx: MessageTx[None], order: Order) -> None:
                attempts.append(tx.attempt)
                raise RuntimeError("boom")

            with raises(MessageExhaustedError):
                await handle_messages(orders.reader("billing"), record, attempts=2)
    assert attempts == []


@check
async def test_budget_survives_restart_between_failures(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 1)
    seen: list[int] = []
    for _ in range(3):
        async with world.session() as hooks:
            faulty = FaultyHooks(hooks, fail={"open_message": 2})
            async with open_scope(faulty, scope="s") as scope:
                orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

                async def fail(tx: MessageTx[None], order: Order) -> None:
                    seen.append(tx.attempt)
                    raise RuntimeError("boom")

                with raises((MessageExhaustedError, CheckpointError)):
                    await handle_messages(orders.reader("billing"), fail, attempts=3)
    assert seen == [0, 1, 2]


async def _billing_streams(
    scope: StreamScope, *, capacity: int = 1024
) -> tuple[ManagedStream[Order], ManagedStream[Invoice]]:
    """The orders stream (read by ``billing``) and the invoices stream billing writes."""
    orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
    invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), capacity=capacity)
    return orders, invoices


def _invoicing(
    out: StreamWriter[Invoice], count: Callable[[Order], int]
) -> Callable[[MessageTx[None], Order], Awaitable[None]]:
    """A handler that sends ``count(order)`` invoices for each order."""

    async def invoice(tx: MessageTx[None], order: Order) -> None:
        for i in range(count(order)):
            tx.send(out, Invoice(order.id, i))

    return invoice


@check
async def test_more_than_max_outputs_is_refused_and_nothing_is_committed(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 2)
        orders, invoices = await _billing_streams(scope, capacity=1000)
        spray = _invoicing(invoices.writer(), lambda order: 65)
        with raises(OutputLimitError, match="64"):
            await handle_messages(orders.reader("billing"), spray)
        assert orders.snapshot().groups[0].acked_through == 0
        assert invoices.snapshot().appended == 0
        result = await handle_messages(orders.reader("billing"), spray, max_outputs=65)
        assert result.handled == 2
        assert invoices.snapshot().appended == 130


@check
async def test_output_batch_larger_than_its_stream_capacity_is_refused(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 1)
        orders, invoices = await _billing_streams(scope, capacity=4)
        five = _invoicing(invoices.writer(), lambda order: 5)
        with raises(OutputLimitError, match="capacity of 4"):
            await handle_messages(orders.reader("billing"), five)
        assert orders.snapshot().groups[0].acked_through == 0
        assert invoices.snapshot().appended == 0


@check
async def test_messages_staged_before_an_output_batch_over_capacity_still_commit(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 2)
        orders, invoices = await _billing_streams(scope, capacity=4)
        grow = _invoicing(invoices.writer(), lambda order: 1 if order.id == 1 else 5)
        with raises(OutputLimitError, match="capacity of 4"):
            await handle_messages(orders.reader("billing"), grow)
        assert orders.snapshot().groups[0].acked_through == 1
        assert invoices.snapshot().appended == 1


@check
async def test_an_output_error_while_an_earlier_commit_fails_raises_one_checkpoint_error(
    world: World,
) -> None:
    """The output error waits for the messages staged before it; their commit fails, and
    that failure is what the run raises (one error, not a group of two)."""
    async with world.session() as hooks:
        async with open_scope(hooks, scope="s") as scope:
            await _orders(scope, 2)
        faulty = FaultyHooks(hooks, fail={"commit": 1})
        async with open_scope(faulty, scope="s") as scope:
            orders, invoices = await _billing_streams(scope, capacity=4)
            grow = _invoicing(invoices.writer(), lambda order: 1 if order.id == 1 else 5)
            with raises(CheckpointError) as info:
                await handle_messages(orders.reader("billing"), grow)
            assert isinstance(info.value.__cause__, InjectedFault)


@check
async def test_wrong_output_type_is_refused_without_spending_the_budget(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 1)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",))
        out = invoices.writer()

        async def wrong(tx: MessageTx[None], order: Order) -> None:
            tx.send(out, order)  # type: ignore[misc]

        with raises(PayloadTypeError):
            await handle_messages(orders.reader("billing"), wrong)
        assert orders.snapshot().groups[0].exhausted == 0

        async def right(tx: MessageTx[None], order: Order) -> None:
            tx.send(out, Invoice(order.id, order.amount))

        assert (await handle_messages(orders.reader("billing"), right)).handled == 1


@check
async def test_stop_is_confirmed_with_its_message(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 10)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

        async def until_four(tx: MessageTx[int], order: Order) -> None:
            tx.set_state(tx.state + order.amount)
            if order.id == 4:
                tx.stop()

        result = await handle_messages(orders.reader("billing"), until_four, initial_state=0)
        assert (result.handled, result.stopped, result.state) == (4, True, 10)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        result = await handle_messages(orders.reader("billing"), until_four, initial_state=0)
        assert (result.handled, result.stopped, result.state) == (0, True, 10)
        assert orders.snapshot().groups[0].acked_through == 4


@check
async def test_handler_on_a_failed_stream_raises_after_the_tail(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",))
        await orders.writer().send(Order(1, 1))
        await orders.writer().fail()
        handled: list[int] = []

        async def h(tx: MessageTx[None], order: Order) -> None:
            handled.append(order.id)

        with raises(StreamFailedError):
            await handle_messages(orders.reader("billing"), h)
        assert handled == [1]
        assert orders.snapshot().groups[0].acked_through == 1


@check
async def test_results_are_restored_after_restart(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 3, finish=False)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)

        async def total(tx: MessageTx[int], order: Order) -> None:
            tx.set_state(tx.state + order.amount)
            tx.set(TOTAL, tx.state)
            if order.id == 3:
                tx.stop()

        await handle_messages(orders.reader("billing"), total, initial_state=0)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        result = await handle_messages(orders.reader("billing"), total, initial_state=0)
        assert result.result(TOTAL) == 6
        assert result.result(Key("never_set", int)) is NoValue


class _CountingHooks(PassThroughHooks):
    def __init__(self, inner: StreamHooks) -> None:
        super().__init__(inner)
        self.batches: list[int] = []

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        self.batches.append(sum(c.count for c in commits))
        await self.inner.commit(commits)


@check
async def test_commits_are_pipelined_and_land_in_order(world: World) -> None:
    async with world.session() as hooks:
        counting = _CountingHooks(hooks)
        async with open_scope(counting, scope="s") as scope:
            await _orders(scope, 400)
            result = await _bill(scope)
        assert result.state == Totals(400 * 401 // 2, 400)
        assert sum(counting.batches) == 400
        assert max(counting.batches) > 1


RECEIPTS = Key("receipts", Stream[Invoice])


@check
async def test_outputs_of_a_message_waiting_for_room_are_not_published_with_an_earlier_batch(
    world: World,
) -> None:
    """Message 2 reserves its invoice, then waits for room in ``receipts`` while message 1
    commits: the invoice must stay unpublished until message 2 itself is committed."""
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 2)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), capacity=10)
        receipts = await scope.open_stream(RECEIPTS, node="billing", groups=("archive",), capacity=1)
        to_invoices, to_receipts = invoices.writer(), receipts.writer()
        seen: list[tuple[int, int]] = []

        async def bill(tx: MessageTx[None], order: Order) -> None:
            tx.send(to_invoices, Invoice(order.id, order.amount))
            tx.send(to_receipts, Invoice(order.id, order.amount))

        async def audit() -> None:
            reader = invoices.reader("audit")
            for _ in range(2):
                message = await reader.receive()
                # published only once the message that staged it is acknowledged
                seen.append((message.value.order, orders.snapshot().groups[0].acked_through))
                await reader.ack(message)

        async def archive() -> None:
            reader = receipts.reader("archive")
            for _ in range(2):
                await reader.ack(await reader.receive())

        async with anyio.create_task_group() as tg:
            tg.start_soon(audit)
            tg.start_soon(archive)
            result = await handle_messages(orders.reader("billing"), bill)
        assert result.handled == 2
        assert [order for order, _ in seen] == [1, 2]
        assert all(acked >= order for order, acked in seen), seen


@check
async def test_a_mutated_state_that_was_not_set_reaches_no_other_attempt(world: World) -> None:
    """Each attempt gets its own copy of a mutable state: in-place changes are not staged."""
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 3)
        orders = await scope.open_stream(ORDERS, node="src", groups=("billing",), resumable=True)
        seen: list[tuple[int, int, list[int]]] = []

        async def mutate(tx: MessageTx[list[int]], order: Order) -> None:
            seen.append((order.id, tx.attempt, list(tx.state)))
            tx.state.append(order.id)  # never set: must not survive this attempt
            if order.id == 1 and tx.attempt == 0:
                raise RuntimeError("first attempt fails")
            if order.id == 2:
                tx.set_state([*tx.state])  # set: [2] is confirmed with message 2

        empty: list[int] = []
        result = await handle_messages(orders.reader("billing"), mutate, initial_state=empty, attempts=2)
        assert seen == [(1, 0, []), (1, 1, []), (2, 0, []), (3, 0, [2])]
        assert result.state == [2]


A = Key("a", Stream[int])
B = Key("b", Stream[int])


async def _two_outputs(scope: StreamScope, *, capacity_b: int) -> tuple[ManagedStream[int], ...]:
    numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
    for i in (1, 2):
        await numbers.writer().send(i)
    await numbers.writer().finish()
    a = await scope.open_stream(A, node="h", groups=("r",), capacity=1)
    b = await scope.open_stream(B, node="h", groups=("r",), capacity=capacity_b)
    return numbers, a, b


async def _refused_while_a_is_read(
    numbers: ManagedStream[int],
    a: ManagedStream[int],
    handler: Callable[[MessageTx[None], int], Awaitable[None]],
    error: type[Exception],
    match: str,
) -> None:
    """Handle ``numbers`` while ``a`` is read and acked; the run must raise ``error`` at once."""

    async def read_a() -> None:
        reader = a.reader("r")
        while True:
            await reader.ack(await reader.receive())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_a)
            with raises(error, match=match):
                await handle_messages(numbers.reader("g"), handler)
            tg.cancel_scope.cancel()


@check
async def test_an_output_batch_over_capacity_is_refused_without_waiting_for_room_elsewhere(
    world: World,
) -> None:
    """Message 2 finds ``a`` full until message 1's output is read, and stages 3 > 2 for
    ``b``, which nobody reads: the error comes at once, not after ``b`` empties (never)."""
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers, a, b = await _two_outputs(scope, capacity_b=2)
        to_a, to_b = a.writer(), b.writer()

        async def handler(tx: MessageTx[None], value: int) -> None:
            tx.send(to_a, value)
            for _ in range(1 if value == 1 else 3):
                tx.send(to_b, value)

        await _refused_while_a_is_read(numbers, a, handler, OutputLimitError, "capacity of 2")
        assert numbers.snapshot().groups[0].acked_through == 1
        assert b.snapshot().appended == 1


@check
async def test_a_stream_the_handler_may_not_write_is_refused_without_waiting_for_room_elsewhere(
    world: World,
) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers, a, b = await _two_outputs(scope, capacity_b=1)
        await b.writer().send(0)  # written directly, so no handler may write it; and full
        await b.writer().flush()
        to_a, to_b = a.writer(), b.writer()

        async def handler(tx: MessageTx[None], value: int) -> None:
            tx.send(to_a, value)
            if value == 2:
                tx.send(to_b, value)

        await _refused_while_a_is_read(numbers, a, handler, StreamStateError, "direct sends")


@check
async def test_a_retry_does_not_run_inside_the_failure_before_it(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await numbers.writer().send(1)
        await numbers.writer().finish()
        handling: list[BaseException | None] = []

        async def handler(tx: MessageTx[None], value: int) -> None:
            handling.append(sys.exc_info()[1])
            raise RuntimeError(f"attempt {tx.attempt}")

        with raises(MessageExhaustedError) as info:
            await handle_messages(numbers.reader("g"), handler, attempts=2)
        assert handling == [None, None]
        last = info.value.__cause__
        assert isinstance(last, RuntimeError) and str(last) == "attempt 1"
        assert last.__context__ is None


@check
async def test_a_paused_handler_resumes_from_the_state_and_results_it_committed(world: World) -> None:
    """Without a restart: the next run in the same scope starts where the last one confirmed."""
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        await _orders(scope, 5)
        orders, _ = await _billing_streams(scope)

        async def add(tx: MessageTx[Totals], order: Order) -> None:
            tx.set_state(Totals(tx.state.total + order.amount, tx.state.count + 1))
            tx.set(TOTAL, tx.state.total)

        first = await handle_messages(orders.reader("billing"), add, initial_state=Totals(), limit=3)
        assert (first.state, first.result(TOTAL)) == (Totals(6, 3), 6)
        rest = await handle_messages(orders.reader("billing"), add, initial_state=Totals())
        assert (rest.handled, rest.state, rest.result(TOTAL)) == (2, Totals(15, 5), 15)
        # nothing left to handle: the run reports what is committed, not the initial state
        done = await handle_messages(orders.reader("billing"), add, initial_state=Totals())
        assert (done.handled, done.state, done.result(TOTAL)) == (0, Totals(15, 5), 15)
