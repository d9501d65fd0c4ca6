"""Runs of commits (``through``): what a run may not do, on every store."""

from __future__ import annotations

from typing import Any

import msgspec

from .. import SequenceError, StreamHooks, StreamRef
from ..store import AppendBatch, MessageCommit, MessageFail, MessageRef, StreamOpen
from ._support import World, cases, check, raises

__all__ = ["INVOICES", "ORDERS", "commit_run", "read_records", "setup_streams"]

ORDERS = StreamRef("s", "src", "orders")
INVOICES = StreamRef("s", "billing", "invoices")


async def setup_streams(hooks: StreamHooks, n: int) -> tuple[int, int]:
    orders = await hooks.open(StreamOpen(ORDERS, "int", 1000, ("billing",), resumable=True))
    invoices = await hooks.open(StreamOpen(INVOICES, "int", 1000, ("audit",), resumable=True))
    if n:
        payloads = tuple(b"o%d" % i for i in range(1, n + 1))
        await hooks.append(AppendBatch(ORDERS, orders.generation, 1, payloads))
    return orders.generation, invoices.generation


async def read_records(hooks: StreamHooks) -> Any:
    """What the store holds for both streams, read back by reopening them."""
    found = []
    for ref, group in ((ORDERS, "billing"), (INVOICES, "audit")):
        opened = await hooks.open(StreamOpen(ref, "int", 1000, (group,), resumable=True))
        groups = tuple(msgspec.structs.replace(g, active_at=0.0) for g in opened.groups)  # a clock's time
        found.append((opened.appended, groups, [(m.seq, m.payload) for m in opened.tail]))
    return found


def commit_run(first: int, through: int, generation: int, **fields: Any) -> MessageCommit:
    return MessageCommit(MessageRef(ORDERS, "billing", generation, first), through=through, **fields)


# -- what a run may not do, on every store -------------------------------------------------


@check
async def test_a_run_over_a_message_acknowledged_out_of_order_is_refused_and_changes_nothing(
    world: World,
) -> None:
    async with world.session() as hooks:
        generation, _ = await setup_streams(hooks, 6)
        await hooks.commit([commit_run(4, 0, generation)])
        before = await read_records(hooks)
        generation += 1  # _records reopened the stream
        with raises(SequenceError, match="already acknowledged"):
            await hooks.commit([commit_run(1, 5, generation, state=b"x")])
        after = await read_records(hooks)
        assert [a[1:] for a in after] == [b[1:] for b in before]
        generation += 1
        await hooks.commit([commit_run(1, 3, generation, state=b"x"), commit_run(5, 6, generation)])
        (orders, _) = await read_records(hooks)
        assert (orders[1][0].acked_through, orders[1][0].state) == (6, b"x")


@cases(
    (1, 7, "#7 .*sequence 7 was never appended"),
    (9, 10, "#9 .*sequence 9 was never appended"),
    (10, 0, "#10 .*sequence 10 was never appended"),  # a single commit names its own
    (3, 2, "before it starts"),
    (0, 2, "sequence 0 was never appended"),
    ids=["past-the-end", "after-the-end", "single-past-the-end", "ends-before-it-starts", "sequence-0"],
)
async def test_a_run_outside_the_appended_messages_is_refused(
    world: World, first: int, through: int, error: str
) -> None:
    async with world.session() as hooks:
        generation, _ = await setup_streams(hooks, 6)
        with raises(SequenceError, match=error):
            await hooks.commit([commit_run(first, through, generation)])
        (orders, _) = await read_records(hooks)
        assert orders[1][0].acked_through == 0


@check
async def test_a_run_holding_an_exhausted_message_needs_a_new_parent_attempt(world: World) -> None:
    async with world.session() as hooks:
        generation, _ = await setup_streams(hooks, 4)
        failed = await hooks.fail_message(
            MessageFail(MessageRef(ORDERS, "billing", generation, 2), node="billing", limit=1, index=0)
        )
        assert failed.exhausted
        with raises(SequenceError, match="exhausted"):
            await hooks.commit([commit_run(1, 3, generation, node="billing")])
        await hooks.commit([commit_run(1, 3, generation, node="billing", parent_attempt="retry-1")])
        (orders, _) = await read_records(hooks)
        assert (orders[1][0].acked_through, orders[1][0].exhausted) == (3, ())
