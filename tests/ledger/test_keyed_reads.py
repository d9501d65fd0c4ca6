"""Keyed state read from outside its handler (``Ledger.keyed_state``): confirmed values, typed refusals."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from ledger import StreamNotFoundError
from ledger.lmdb import TOOLS as LMDB_TOOLS
from ledger.postgres import TOOLS as PG_TOOLS
from streams import Key, KeyedState, MessageTx, Stream, UnknownStreamError, handle_messages, open_scope

from .conftest import Opener

pytestmark = pytest.mark.anyio

ORDERS = Key("orders", Stream[int])
TOTALS = KeyedState(str, int)


async def test_an_outside_read_sees_what_the_ledger_confirmed_never_a_staged_write(open_any: Opener) -> None:
    async with open_any() as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_stream(ORDERS, node="intake", groups=("totals",), resumable=True)
        for n in range(1, 5):
            await orders.writer().send(n)
        await orders.writer().flush()
        staged, seen = [], []

        async def add(tx: MessageTx[None], value: int) -> None:
            totals, customer = TOTALS.of(tx), f"c{value % 2}"
            totals.put(customer, await totals.get(customer, 0) + value)
            staged.append(await totals.get(customer))
            seen.append(await ledger.keyed_state(orders.ref, "totals", customer, state=TOTALS))

        for _ in range(4):  # one message a run: each run's commit is confirmed before the next reads
            await handle_messages(orders.reader("totals"), add, keyed=TOTALS, limit=1)
        assert staged == [1, 2, 4, 6]
        assert seen == [None, None, 1, 2]  # what earlier messages confirmed; the handler's own put is staged
        assert await ledger.keyed_state("shop/intake/orders", "totals", "c1") == 4  # typed by the key alone
        assert await ledger.keyed_state(orders.ref, "totals", "c2", default=0) == 0
        with pytest.raises(UnknownStreamError, match="no consumer group 'nobody'"):
            await ledger.keyed_state(orders.ref, "nobody", "c1")
        with pytest.raises(UnknownStreamError, match="was never opened"):
            await ledger.keyed_state("shop/intake/returns", "totals", "c1")
        with pytest.raises(StreamNotFoundError, match="scope/node/key"):
            await ledger.keyed_state("orders", "totals", "c1")


async def test_a_key_past_its_ttl_is_gone_for_the_reads_from_outside_and_the_state_command(
    open_any: Opener, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Written by a clock a day behind, the key's stamp is past by the machine's clock: every reader
    that goes by the machine's clock leaves it out, one that goes by the writer's sees it."""
    behind = KeyedState(str, int, ttl=timedelta(hours=1), clock=lambda: time.time() - 86_400)
    async with open_any() as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_stream(ORDERS, node="intake", groups=("totals",), resumable=True)
        await orders.writer().send(5)

        async def put(tx: MessageTx[None], value: int) -> None:
            behind.of(tx).put("old", value)

        await handle_messages(orders.reader("totals"), put, keyed=behind, limit=1)
        assert await ledger.keyed_state(orders.ref, "totals", "old", state=behind) == 5
        assert await ledger.keyed_state(orders.ref, "totals", "old") is None
        assert (
            await KeyedState(str, int, ttl=timedelta(hours=1)).items(ledger.streams, orders.ref, "totals")
            == []
        )
    if request.node.callspec.params["open_any"] == "lmdb":
        tools, target = LMDB_TOOLS, str(tmp_path / "ledger")
    else:
        tools, target = PG_TOOLS, request.getfixturevalue("postgres_url")
    shown = await anyio.to_thread.run_sync(tools.keys, target, orders.ref, "totals", b"", None, 10)
    assert shown["keys"] == [] and shown["last"] is None  # python -m ledger state, the console
