"""Cancellation from outside: the ledger serves writes until its block is done; appends are not 'broken'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from ledger import open_ledger
from streams import Key, Stream, open_scope

NUMBERS = Key("numbers", Stream[int])


async def test_an_outer_cancellation_leaves_the_ledger_serving_until_its_block_ends(tmp_path: Path) -> None:
    with anyio.CancelScope() as outer:
        async with open_ledger(tmp_path / "l") as ledger:
            outer.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.wait_all_tasks_blocked()  # every task has seen the cancellation
                db = ledger.backend.env.db("messages")

                def put(txn: Any) -> str:
                    txn.put(b"k", b"v", db=db)
                    return "written"

                assert await ledger.backend.env.write(put) == "written"
    async with open_ledger(tmp_path / "l") as ledger:
        with ledger.backend.env.read() as txn:
            assert txn.get(b"k", db=ledger.backend.env.db("messages")) == b"v"


async def test_a_cancelled_append_does_not_break_the_stream(tmp_path: Path) -> None:
    with anyio.CancelScope() as outer:
        async with open_ledger(tmp_path / "l") as ledger, open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
            await stream.writer().send(1, send_at=1)
            await anyio.lowlevel.checkpoint()
            outer.cancel()
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
                await stream.writer().send(2, send_at=2)
    assert outer.cancel_called
    async with open_ledger(tmp_path / "l") as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        # the shielded send after the cancellation was appended too: the stream is not broken
        assert stream.snapshot().appended == 2
        assert stream.writer().position == 2
