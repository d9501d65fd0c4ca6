"""Keyed state read from outside its handler (``Ledger.keyed_state``): confirmed values, typed refusals."""

from __future__ import annotations

import pytest

from ledger import StreamNotFoundError
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
