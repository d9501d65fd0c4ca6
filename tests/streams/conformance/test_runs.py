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
from streams import MemoryStore, StreamHooks
from streams._conformance.runs import INVOICES, commit_run, read_records, setup_streams
from streams.store import MessageCommit, OutputBatch

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
        orders_gen, invoices_gen = await setup_streams(store, n)
        # some messages acknowledged out of order first, by single commits
        await store.commit([commit_run(s, 0, orders_gen) for s in sorted(acked_before)])
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
                commit_run(
                    seq, 0, orders_gen, state=state, results=results, outputs=outputs, stop=stop and last
                )
            )
        if not as_runs:
            await store.commit(singles)
            return await read_records(store)
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
                commit_run(
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
        return await read_records(store)

    assert anyio.run(apply, True) == anyio.run(apply, False)
