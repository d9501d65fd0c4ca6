"""The group committer's batching (ledger.lmdb._commit): which writes share a transaction."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lmdb
import pytest

from ledger import open_ledger
from ledger._committer import GATHER_STEPS

pytestmark = pytest.mark.anyio


def put(db: Any, key: bytes) -> Callable[[lmdb.Transaction], bytes]:
    def fn(txn: lmdb.Transaction) -> bytes:
        txn.put(key, b"v", db=db)
        return key

    return fn


async def test_writes_a_landing_sets_off_share_the_next_transaction(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        db = ledger.backend.env.db("messages")
        batches: list[int] = []
        ledger.backend.env.batch_observer = lambda writes, _ok: batches.append(writes)
        await ledger.backend.env.write(put(db, b"a"))
        # the steps after a landing, as the tasks it woke resume one after another
        tickets = [ledger.backend.env.submit(put(db, b"b"))]
        for step in range(1, GATHER_STEPS - 1):
            await anyio.lowlevel.checkpoint()
            tickets.append(ledger.backend.env.submit(put(db, b"c%d" % step)))
        assert [await t.wait() for t in tickets] == [b"b"] + [b"c%d" % k for k in range(1, GATHER_STEPS - 1)]
        ledger.backend.env.batch_observer = None
    assert batches == [1, GATHER_STEPS - 1]


async def test_a_lone_write_is_handed_over_at_the_end_of_its_step(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        db = ledger.backend.env.db("messages")
        batches: list[int] = []
        ledger.backend.env.batch_observer = lambda writes, _ok: batches.append(writes)
        ticket = ledger.backend.env.submit(put(db, b"a"))
        with anyio.fail_after(10):
            assert await ticket.wait() == b"a"
        await anyio.sleep(0.01)  # an idle committer: the steps after the landing pass with nothing
        ticket = ledger.backend.env.submit(put(db, b"b"))
        assert await ticket.wait() == b"b"
        ledger.backend.env.batch_observer = None
    assert batches == [1, 1]


async def test_a_lone_write_that_raises_leaves_nothing_of_it(tmp_path: Path) -> None:
    class Refused(Exception):
        pass

    def half_then_raise(db: Any) -> Callable[[lmdb.Transaction], None]:
        def fn(txn: lmdb.Transaction) -> None:
            txn.put(b"half", b"v", db=db)
            raise Refused

        return fn

    async with open_ledger(tmp_path / "l") as ledger:
        env = ledger.backend.env
        db = env.db("messages")
        batches: list[tuple[int, int]] = []
        env.batch_observer = lambda writes, ok: batches.append((writes, ok))
        with pytest.raises(Refused):
            await env.write(half_then_raise(db))  # alone in its batch: no nested transaction
        assert await env.write(put(db, b"after")) == b"after"
        env.batch_observer = None
        with env.read() as txn:
            assert txn.get(b"half", db=db) is None
            assert txn.get(b"after", db=db) == b"v"
    assert batches == [(1, 0), (1, 1)]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
async def test_the_writer_thread_runs_under_sched_batch(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        # two writes of one step: a batch for the writer thread (a lone one may commit on the loop)
        tickets = [ledger.backend.env.submit(lambda txn: os.sched_getscheduler(0)) for _ in range(2)]
        policies = [await ticket.wait() for ticket in tickets]
    assert policies == [os.SCHED_BATCH] * 2


async def test_postgres_calls_made_in_one_step_share_one_transaction(postgres_url: str) -> None:
    from ledger.postgres import open_postgres

    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        before = connection.transactions
        results: list[int] = []

        async def call(k: int) -> None:
            results.append(await connection.call(lambda _view: k))

        async with anyio.create_task_group() as tg:
            for k in range(3):  # each task's call is made in the same step of the loop
                tg.start_soon(call, k)
        assert sorted(results) == [0, 1, 2]
        assert connection.transactions - before == 1
