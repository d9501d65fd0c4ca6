"""streams.store for store authors: the page that teaches it runs, and views read in batches."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from streams import SequenceError, StoreDamagedError, StreamRef, UnknownStreamError, store
from streams.testing import PassThroughHooks, check_stream_store

from .conformance.conftest import example_store, example_view

ROOT = Path(__file__).resolve().parents[2]

ORDERS = StreamRef("s", "src", "orders")
INVOICES = StreamRef("s", "billing", "invoices")


def test_the_code_blocks_of_docs_stores_md_run_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    page = (ROOT / "docs" / "stores.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    assert len(blocks) == 4  # the store, a pipeline on it, its stream suite, the node suite on MemoryStore
    module = types.ModuleType("docs_stores_page")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/stores.md block {number}", "exec"), module.__dict__)


class _Counting:
    """Wraps a DictView's batched reads: how many batches of each kind, and how many keys."""

    def __init__(self, view: Any) -> None:
        self.batches: dict[str, list[int]] = {"descriptors": [], "groups": [], "attempts": []}
        for kind in self.batches:
            read = getattr(view, f"_read_{kind}")

            def counted(keys: Sequence[Any], __read: Any = read, __kind: str = kind) -> Any:
                self.batches[__kind].append(len(keys))
                return __read(keys)

            setattr(view, f"_read_{kind}", counted)


async def test_a_commit_reads_its_streams_in_one_batch_and_their_groups_in_another() -> None:
    hooks: Any = example_store()
    orders = await hooks.open(store.StreamOpen(ORDERS, "int", 1000, ("billing", "audit"), resumable=True))
    invoices = await hooks.open(store.StreamOpen(INVOICES, "int", 1000, ("out",), resumable=True))
    await hooks.append(
        store.AppendBatch(ORDERS, orders.generation, 1, tuple(b"%d" % i for i in range(1, 51)))
    )
    commits = [
        store.MessageCommit(
            store.MessageRef(ORDERS, "billing", orders.generation, seq),
            state=b"%d" % seq,
            outputs=(store.OutputBatch(INVOICES, invoices.generation, seq, (b"invoice",)),),
        )
        for seq in range(1, 51)
    ]
    view = example_view(hooks)
    counting = _Counting(view)
    store.commit(view, commits)
    view.flush()
    # both streams at once, then every group of the committed stream at once; nothing one by one
    assert counting.batches == {"descriptors": [2], "groups": [2], "attempts": []}
    assert hooks.groups[(ORDERS, "billing")].acked_through == 50
    assert hooks.descriptors[INVOICES].appended == 50


async def test_a_failed_attempt_reads_its_stream_group_and_budget_in_one_batch_each() -> None:
    hooks: Any = example_store()
    orders = await hooks.open(store.StreamOpen(ORDERS, "int", 1000, ("billing",), resumable=True))
    await hooks.append(store.AppendBatch(ORDERS, orders.generation, 1, (b"1",)))
    view = example_view(hooks)
    counting = _Counting(view)
    message = store.MessageRef(ORDERS, "billing", orders.generation, 1)
    attempt = store.fail_message(view, store.MessageFail(message, node="billing", limit=3, index=0))
    assert attempt.index == 1
    assert counting.batches == {"descriptors": [1], "groups": [1], "attempts": [1]}


def test_attempt_keys_name_their_parts() -> None:
    key = store.AttemptKey(ORDERS, "billing", 7, "billing", "retry-1")
    parts = (key.ref, key.group, key.seq, key.node, key.parent_attempt)
    assert parts == (ORDERS, "billing", 7, "billing", "retry-1")
    assert key == (ORDERS, "billing", 7, "billing", "retry-1")  # still a tuple: stores key it as before


class _Sessions:
    """A world over one in-process store: every session hands out the same object."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Any]:
        yield self.hooks


async def test_check_stream_store_runs_the_whole_suite_against_a_store() -> None:
    await check_stream_store(lambda: _Sessions(example_store()))


async def test_check_stream_store_names_the_check_a_broken_store_fails() -> None:
    class Forgetful(PassThroughHooks):
        """Budgets refill: a failed attempt is never confirmed."""

        async def open_message(self, request: store.MessageOpen) -> store.MessageAttempt:
            attempt = await self.inner.open_message(request)
            return store.MessageAttempt(index=0, exhausted=False, state=attempt.state)

    with pytest.raises(SequenceError, match="exhausted its attempt budget") as failed:
        await check_stream_store(lambda: _Sessions(Forgetful(example_store())))
    assert failed.value.__notes__ == [
        "conformance check test_a_message_exhausted_before_a_restart_goes_to_the_dead_letters_after_it failed"
    ]


async def test_a_listed_group_without_its_frontier_is_damage_never_a_new_group() -> None:
    hooks: Any = example_store()
    opening = store.StreamOpen(ORDERS, "int", 1000, ("billing", "audit"), resumable=True)
    opened = await hooks.open(opening)
    await hooks.append(store.AppendBatch(ORDERS, opened.generation, 1, (b"1", b"2")))
    del hooks.groups[(ORDERS, "billing")]  # the store lost a record its descriptor names
    descriptor = hooks.descriptors[ORDERS]
    with pytest.raises(StoreDamagedError, match="lists consumer group 'billing', whose frontier is missing"):
        await hooks.open(opening)
    commit = store.MessageCommit(store.MessageRef(ORDERS, "billing", opened.generation, 1))
    with pytest.raises(StoreDamagedError, match="'billing', whose frontier is missing"):
        await hooks.commit([commit])
    assert hooks.descriptors[ORDERS] == descriptor and (ORDERS, "billing") not in hooks.groups  # unchanged
    # a group the descriptor never listed is still a caller's mistake, not damage
    other = store.MessageCommit(store.MessageRef(ORDERS, "nobody", opened.generation, 1))
    with pytest.raises(UnknownStreamError, match="has no consumer group 'nobody'"):
        await hooks.commit([other])
