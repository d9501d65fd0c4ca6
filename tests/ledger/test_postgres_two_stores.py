"""Two stores on one PostgreSQL database, writing the same streams and groups in turn.

Group members and shard workers on many machines do this. Each call of
one store must see what the other confirmed before it: a descriptor, a
frontier or a terminal the store kept from its own earlier calls, and
used instead of reading it again, would go stale here unnoticed. These
tests fail if it does (a lost ack, a sequence appended twice, a terminal
or a generation ignored).
"""

from __future__ import annotations

import psycopg
import pytest

from ledger import CorruptRecordError
from ledger.postgres import open_postgres
from streams import (
    SequenceError,
    StaleGenerationError,
    StreamFinishedError,
    StreamRef,
)
from streams.store import (
    AppendBatch,
    KeyedHooks,
    KeyedRead,
    KeyedWrite,
    MessageCommit,
    MessageRef,
    OutputBatch,
    StreamFinish,
    StreamOpen,
)

pytestmark = pytest.mark.anyio

ORDERS = StreamRef("shop", "intake", "orders")
INVOICES = StreamRef("shop", "billing", "invoices")


async def test_appends_of_two_stores_continue_from_each_others_sequence(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as one, open_postgres(postgres_url) as other:
        opened = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",)))
        g = opened.generation
        await one.streams.append(AppendBatch(ORDERS, g, 1, (b"1", b"2")))
        await other.streams.append(AppendBatch(ORDERS, g, 3, (b"3", b"4")))
        with pytest.raises(SequenceError):  # 3 and 4 are the other store's now
            await one.streams.append(AppendBatch(ORDERS, g, 3, (b"again",)))
        await one.streams.append(AppendBatch(ORDERS, g, 5, (b"5",)))
        with pytest.raises(SequenceError):
            await other.streams.append(AppendBatch(ORDERS, g, 5, (b"again",)))
        described = await other.streams.describe(ORDERS)
        assert described is not None and described.appended == 5
    async with open_postgres(postgres_url) as fresh:
        reopened = await fresh.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",), resumable=True))
        assert [m.payload for m in reopened.tail] == [b"1", b"2", b"3", b"4", b"5"]


async def test_acks_of_two_stores_in_one_group_make_one_contiguous_frontier(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as one, open_postgres(postgres_url) as other:
        opened = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",)))
        invoices = await one.streams.open(StreamOpen(INVOICES, "bytes", 16, ("audit",)))
        g, gi = opened.generation, invoices.generation
        await one.streams.append(AppendBatch(ORDERS, g, 1, (b"1", b"2", b"3", b"4")))

        def bill(seq: int, state: bytes) -> list[MessageCommit]:
            invoice = OutputBatch(INVOICES, gi, seq, (b"invoice-%d" % seq,))
            return [MessageCommit(MessageRef(ORDERS, "billing", g, seq), state=state, outputs=(invoice,))]

        await one.streams.commit(bill(1, b"one"))
        await other.streams.commit(bill(2, b"other"))
        await one.streams.commit(bill(3, b"one again"))  # after the other's ack of 2: through 3
        taken = OutputBatch(INVOICES, gi, 3, (b"x",))
        with pytest.raises(SequenceError):  # the other store's invoice 3 is there: 3 is taken
            await other.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", g, 4), outputs=(taken,))])
        await other.streams.commit(bill(4, b"other again"))
        for store in (one, other):
            found = await store.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",), resumable=True))
            [billing] = found.groups
            assert (billing.acked_through, billing.acked_above, billing.state) == (4, (), b"other again")
            described = await store.streams.describe(INVOICES)
            assert described is not None and described.appended == 4


async def test_keyed_acks_of_two_stores_in_turn_each_find_the_others_frontier(postgres_url: str) -> None:
    """A keyed commit writes its keys before its records, in one pipeline: a kept frontier gone stale
    with the other store's commit fails the records' statement, and the call runs again from what the
    other store confirmed, keys and all, as an unkeyed one does."""
    async with open_postgres(postgres_url) as one, open_postgres(postgres_url) as other:
        opened = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",)))
        g = opened.generation
        await one.streams.append(AppendBatch(ORDERS, g, 1, (b"1", b"2", b"3")))

        def keyed(seq: int, value: bytes) -> list[MessageCommit]:
            writes = (KeyedWrite(b"total", value), KeyedWrite(b"last", b"%d" % seq))
            return [MessageCommit(MessageRef(ORDERS, "billing", g, seq), keyed=writes)]

        await one.streams.commit(keyed(1, b"one"))  # the stream and its frontier are kept by both now
        await other.streams.commit(keyed(2, b"other"))
        await one.streams.commit(keyed(3, b"one again"))  # its kept frontier says 1: stale, read again
        for store in (one, other):
            found = await store.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",), resumable=True))
            assert found.groups[0].acked_through == 3
            assert isinstance(store.streams, KeyedHooks)
            values = await store.streams.read_keyed(KeyedRead(ORDERS, "billing", (b"total", b"last")))
            assert values == (b"one again", b"3")


async def test_a_terminal_another_store_confirmed_refuses_the_next_append(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as one, open_postgres(postgres_url) as other:
        opened = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",)))
        await one.streams.append(AppendBatch(ORDERS, opened.generation, 1, (b"1",)))
        await other.streams.finish(StreamFinish(ORDERS, opened.generation))
        with pytest.raises(StreamFinishedError):
            await one.streams.append(AppendBatch(ORDERS, opened.generation, 2, (b"late",)))
        described = await one.streams.describe(ORDERS)
        assert described is not None and described.finished and described.appended == 1


async def test_a_generation_another_store_raised_fences_the_next_calls(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as one, open_postgres(postgres_url) as other:
        opened = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",), resumable=True))
        g = opened.generation
        await one.streams.append(AppendBatch(ORDERS, g, 1, (b"1", b"2")))
        await one.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", g, 1))])
        taken = await other.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",), resumable=True))
        assert taken.generation > g
        with pytest.raises(StaleGenerationError):
            await one.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", g, 2))])
        with pytest.raises(StaleGenerationError):
            await one.streams.append(AppendBatch(ORDERS, g, 3, (b"3",)))
        await other.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", taken.generation, 2))])
        found = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",), resumable=True))
        assert found.appended == 2 and [f.acked_through for f in found.groups] == [2]


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE streamledger_streams SET descriptor = '\\x00'::bytea WHERE key = 'orders'",
        "UPDATE streamledger_groups SET frontier = '\\x00'::bytea WHERE name = 'billing'",
        "UPDATE streamledger_groups SET name = 'billinh' WHERE name = 'billing'",
    ],
)
async def test_a_row_damaged_while_a_store_is_open_is_found_by_its_next_call(
    postgres_url: str, damage: str
) -> None:
    async with open_postgres(postgres_url) as one:
        opened = await one.streams.open(StreamOpen(ORDERS, "bytes", 16, ("billing",)))
        g = opened.generation
        await one.streams.append(AppendBatch(ORDERS, g, 1, (b"1", b"2")))
        await one.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", g, 1))])
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(damage)
            before = conn.execute("SELECT * FROM streamledger_groups").fetchall()
        with pytest.raises(CorruptRecordError):
            await one.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", g, 2))])
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            assert conn.execute("SELECT * FROM streamledger_groups").fetchall() == before
