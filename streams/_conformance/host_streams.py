"""Node-hook conformance for host streams: a host writes a root stream input and reads a root outlet.

The host's writer has a writer node's rules (append before delivery,
``send_at`` positions kept, continuation only when promised); the host's
reader is a consumer group of its own whose acknowledgements the store
confirms. Both survive a crash: the host continues from ``writer.position``
and its group from its confirmed frontier, so every effect happens once.
Registered in :data:`NODE_CHECKS`.
"""

from __future__ import annotations

from typing import Any

import anyio

from .._checkpoint import ExecCheckpoint
from .._context import NodeContext
from .._errors import CheckpointError
from .._execution import Execution
from .._graph import Graph
from .._handle import MessageTx, handle_messages
from .._keys import Key, Stream
from ._support import raises
from .nodes import node_check

__all__: list[str] = []

ORDERS = Key("orders", Stream[int])
INVOICES = Key("invoices", Stream[int])
TOTAL = Key("total", int)


class Desk:
    """The host feeds ``orders``; node ``billing`` sums them and writes an invoice each, which the host's
    group ``mailer`` mails. The lists record what happened, across executions."""

    def __init__(self) -> None:
        self.billed: list[int] = []
        self.mailed: list[int] = []
        self.sent: list[int] = []

    def graph(self) -> Graph:
        desk = Graph("desk", version="1", inputs=[ORDERS], outlets=[INVOICES])

        @desk.node(requires=[ORDERS], provides=[INVOICES, TOTAL], resumable=True)
        async def billing(ctx: NodeContext) -> None:
            invoices = ctx.writer(INVOICES)

            async def bill(tx: MessageTx[int], order: int) -> None:
                self.billed.append(order)
                tx.set_state(tx.state + order)
                tx.set(TOTAL, tx.state)
                tx.send(invoices, order * 10)

            await ctx.handle_messages(ORDERS, bill, initial_state=0)

        return desk

    async def execution(self, store: Any, *, resumable: bool = True, restore: bool = False) -> Execution:
        execution = Execution(
            self.graph(),
            {},
            checkpoint=ExecCheckpoint("run", store),
            host_readers={INVOICES: ["mailer"]},
            resumable_inputs=[ORDERS] if resumable else [],
        )
        if restore:
            execution.restore_nodes(await store.node_records("run"))
        return execution

    async def feed(self, execution: Execution, upto: int, finish: bool) -> None:
        """Send orders after the last one the stream kept, up to ``upto``; end the stream if asked."""
        writer = await execution.host_writer(ORDERS)
        for order in range((writer.position or 0) + 1, upto + 1):
            await writer.send(order, send_at=order)
            self.sent.append(order)
        await writer.flush()
        if finish:
            await writer.finish()

    async def mail(self, execution: Execution, *, limit: int | None = None) -> None:
        reader = await execution.host_reader(INVOICES, "mailer")

        async def mail(tx: MessageTx[None], invoice: int) -> None:
            self.mailed.append(invoice)

        await handle_messages(reader, mail, limit=limit)


@node_check
async def a_host_writes_a_root_stream_and_reads_an_outlet_with_confirmed_acks(store: Any) -> None:
    desk = Desk()
    execution = await desk.execution(store)
    async with execution, anyio.create_task_group() as host:
        host.start_soon(desk.feed, execution, 5, True)
        host.start_soon(desk.mail, execution)
        result = await execution.wait()
    assert result[TOTAL] == 15
    assert desk.mailed == [10, 20, 30, 40, 50]
    # the host's group is the store's: its acknowledgements are confirmed there
    snapshot = {s.key: s for s in (stream.snapshot() for stream in execution.streams().values())}
    [mailer] = [g for g in snapshot["invoices"].groups if g.group == "mailer"]
    assert (mailer.acked_through, mailer.pending) == (5, 0)


@node_check
async def host_streams_resume_from_what_the_store_confirmed_and_nothing_happens_twice(store: Any) -> None:
    desk = Desk()
    first = await desk.execution(store)
    with anyio.CancelScope() as crash:
        async with first, anyio.create_task_group() as host:
            host.start_soon(desk.feed, first, 3, False)  # orders 1..3 kept; the host goes on later
            await desk.mail(first, limit=2)  # invoices 10 and 20 mailed and acknowledged
            crash.cancel()
    assert desk.mailed == [10, 20]

    again = await desk.execution(store, restore=True)
    async with again, anyio.create_task_group() as host:
        host.start_soon(desk.feed, again, 5, True)  # continues after order 3
        host.start_soon(desk.mail, again)
        result = await again.wait()
    assert result[TOTAL] == 15
    assert desk.sent == [1, 2, 3, 4, 5]  # the host sent nothing twice
    assert desk.billed == [1, 2, 3, 4, 5]
    assert desk.mailed == [10, 20, 30, 40, 50]  # every invoice mailed once


@node_check
async def a_host_stream_left_active_reopens_only_with_the_hosts_promise(store: Any) -> None:
    desk = Desk()
    first = await desk.execution(store, resumable=False)
    with anyio.CancelScope() as crash:
        async with first:
            await desk.feed(first, 2, False)
            crash.cancel()
    refused = await desk.execution(store, resumable=False, restore=True)
    async with refused:
        with raises(CheckpointError, match="resumable=True"):
            await refused.wait()
