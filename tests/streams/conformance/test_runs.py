"""A commit with ``through`` confirms a run of messages exactly as their single commits would."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import open_ledger
from streams import (
    AppendBatch,
    MemoryStore,
    MessageCommit,
    MessageFail,
    MessageRef,
    OutputBatch,
    SequenceError,
    StreamHooks,
    StreamOpen,
    StreamRef,
)

from .conftest import World

ORDERS = StreamRef("s", "src", "orders")
INVOICES = StreamRef("s", "billing", "invoices")


async def _setup(hooks: StreamHooks, n: int) -> tuple[int, int]:
    orders = await hooks.open(StreamOpen(ORDERS, "int", 1000, ("billing",), resumable=True))
    invoices = await hooks.open(StreamOpen(INVOICES, "int", 1000, ("audit",), resumable=True))
    if n:
        payloads = tuple(b"o%d" % i for i in range(1, n + 1))
        await hooks.append(AppendBatch(ORDERS, orders.generation, 1, payloads))
    return orders.generation, invoices.generation


async def _records(hooks: StreamHooks) -> Any:
    """What the store holds for both streams, read back by reopening them."""
    found = []
    for ref, group in ((ORDERS, "billing"), (INVOICES, "audit")):
        opened = await hooks.open(StreamOpen(ref, "int", 1000, (group,), resumable=True))
        found.append((opened.appended, opened.groups, [(m.seq, m.payload) for m in opened.tail]))
    return found


def _run(first: int, through: int, generation: int, **fields: Any) -> MessageCommit:
    return MessageCommit(MessageRef(ORDERS, "billing", generation, first), through=through, **fields)


# -- a run is its single commits ------------------------------------------------------------

message_plans = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(min_size=1, max_size=3)),  # the state it sets
        st.dictionaries(st.sampled_from(["a", "b"]), st.binary(max_size=2), max_size=2),  # results
        st.integers(0, 2),  # outputs it sends
        st.booleans(),  # whether a run ends after it
    ),
    min_size=1,
    max_size=25,
)


@asynccontextmanager
async def _fresh_store(kind: str) -> AsyncIterator[StreamHooks]:
    if kind == "memory":
        yield MemoryStore()
        return
    with tempfile.TemporaryDirectory(prefix="runs-") as tmp:
        async with open_ledger(Path(tmp) / "ledger") as ledger:
            yield ledger.streams


@pytest.mark.parametrize("kind", ["memory", "lmdb"])
@settings(max_examples=60, deadline=None)
@given(plans=message_plans, acked_before=st.sets(st.integers(1, 25), max_size=6), stop=st.booleans())
def test_runs_leave_the_records_their_single_commits_leave(
    kind: str,
    plans: list[tuple[bytes | None, dict[str, bytes], int, bool]],
    acked_before: set[int],
    stop: bool,
) -> None:
    n = len(plans)
    acked_before = {s for s in acked_before if s <= n}

    async def apply(as_runs: bool) -> Any:
        async with _fresh_store(kind) as store:
            return await _apply(store, as_runs)

    async def _apply(store: StreamHooks, as_runs: bool) -> Any:
        orders_gen, invoices_gen = await _setup(store, n)
        # some messages acknowledged out of order first, by single commits
        await store.commit([_run(s, 0, orders_gen) for s in sorted(acked_before)])
        handled = [s for s in range(1, n + 1) if s not in acked_before]
        singles: list[MessageCommit] = []
        next_invoice = 1
        for i, seq in enumerate(handled):
            state, results, sends, _ = plans[seq - 1]
            payloads = tuple(b"i%d-%d" % (seq, k) for k in range(sends))
            outputs = (OutputBatch(INVOICES, invoices_gen, next_invoice, payloads),) if sends else ()
            next_invoice += sends
            last = i == len(handled) - 1
            singles.append(
                _run(seq, 0, orders_gen, state=state, results=results, outputs=outputs, stop=stop and last)
            )
        if not as_runs:
            await store.commit(singles)
            return await _records(store)
        commits: list[MessageCommit] = []
        group: list[MessageCommit] = []

        def close() -> None:
            if not group:
                return
            first, last = group[0], group[-1]
            states = [c.state for c in group if c.state is not None]
            merged: dict[str, bytes] = {}
            for c in group:
                merged.update(c.results)
            batches = [o for c in group for o in c.outputs]
            payloads = tuple(p for o in batches for p in o.payloads)
            outputs = (
                (OutputBatch(INVOICES, invoices_gen, batches[0].first_seq, payloads),) if batches else ()
            )
            through = last.message.seq if len(group) > 1 else 0
            commits.append(
                _run(
                    first.message.seq,
                    through,
                    orders_gen,
                    state=states[-1] if states else None,
                    results=merged,
                    outputs=outputs,
                    stop=last.stop,
                )
            )
            group.clear()

        for c in singles:
            if group and (c.message.seq != group[-1].message.seq + 1 or plans[group[-1].message.seq - 1][3]):
                close()
            group.append(c)
        close()
        await store.commit(commits)
        return await _records(store)

    assert anyio.run(apply, True) == anyio.run(apply, False)


# -- what a run may not do, on every store -------------------------------------------------


async def test_a_run_over_a_message_acknowledged_out_of_order_is_refused_and_changes_nothing(
    world: World,
) -> None:
    async with world.session() as hooks:
        generation, _ = await _setup(hooks, 6)
        await hooks.commit([_run(4, 0, generation)])
        before = await _records(hooks)
        generation += 1  # _records reopened the stream
        with pytest.raises(SequenceError, match="already acknowledged"):
            await hooks.commit([_run(1, 5, generation, state=b"x")])
        after = await _records(hooks)
        assert [a[1:] for a in after] == [b[1:] for b in before]
        generation += 1
        await hooks.commit([_run(1, 3, generation, state=b"x"), _run(5, 6, generation)])
        (orders, _) = await _records(hooks)
        assert (orders[1][0].acked_through, orders[1][0].state) == (6, b"x")


@pytest.mark.parametrize(
    ("first", "through", "error"),
    [
        (1, 7, "#7 .*sequence 7 was never appended"),
        (9, 10, "#9 .*sequence 9 was never appended"),
        (10, 0, "#10 .*sequence 10 was never appended"),  # a single commit names its own
        (3, 2, "before it starts"),
        (0, 2, "sequence 0 was never appended"),
    ],
)
async def test_a_run_outside_the_appended_messages_is_refused(
    world: World, first: int, through: int, error: str
) -> None:
    async with world.session() as hooks:
        generation, _ = await _setup(hooks, 6)
        with pytest.raises(SequenceError, match=error):
            await hooks.commit([_run(first, through, generation)])
        (orders, _) = await _records(hooks)
        assert orders[1][0].acked_through == 0


async def test_a_run_holding_an_exhausted_message_needs_a_new_parent_attempt(world: World) -> None:
    async with world.session() as hooks:
        generation, _ = await _setup(hooks, 4)
        failed = await hooks.fail_message(
            MessageFail(MessageRef(ORDERS, "billing", generation, 2), node="billing", limit=1, index=0)
        )
        assert failed.exhausted
        with pytest.raises(SequenceError, match="exhausted"):
            await hooks.commit([_run(1, 3, generation, node="billing")])
        await hooks.commit([_run(1, 3, generation, node="billing", parent_attempt="retry-1")])
        (orders, _) = await _records(hooks)
        assert (orders[1][0].acked_through, orders[1][0].exhausted) == (3, ())
