from __future__ import annotations

from pathlib import Path

import anyio

from ledger import open_ledger


async def test_concurrent_writes_share_batches(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        db = ledger.env.db("messages")

        async def put(i: int) -> None:
            def fn(txn: object) -> int:
                txn.put(i.to_bytes(8, "big"), b"x", db=db)  # type: ignore[attr-defined]
                return i

            assert await ledger.env.write(fn) == i

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(put, i)
        with ledger.env.read() as txn:
            assert txn.stat(db)["entries"] == 200
