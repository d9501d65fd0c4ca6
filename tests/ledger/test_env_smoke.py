from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

import anyio

from ledger import LedgerEnv


async def test_concurrent_writes_share_batches(tmp_path: Path) -> None:
    env = LedgerEnv.open(tmp_path / "l")
    db = env.db("messages")
    batches: list[int] = []
    env.batch_observer = lambda writes, ok: batches.append(writes)
    submitted = threading.Event()

    def hold(writes: int) -> None:  # the first batch waits until all 200 writes are queued
        submitted.wait(10)

    async def put(i: int) -> None:
        def fn(txn: object) -> int:
            txn.put(i.to_bytes(8, "big"), b"x", db=db)  # type: ignore[attr-defined]
            return i

        assert await env.write(fn) == i

    try:
        async with anyio.create_task_group() as serving:
            await serving.start(partial(env.serve, before_commit=hold))
            async with anyio.create_task_group() as tg:
                for i in range(200):
                    tg.start_soon(put, i)
                await anyio.wait_all_tasks_blocked()
                submitted.set()
            env.stop_serving()
        with env.read() as txn:
            assert txn.stat(db)["entries"] == 200
        # one transaction for the writes queued before the committer woke, one for all the rest
        assert sum(batches) == 200
        assert len(batches) <= 2 and max(batches) >= 100
    finally:
        env.close()
