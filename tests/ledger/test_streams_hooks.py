"""The LMDB store's own behaviour at the hook level: durability across reopen, layout, cost.

The behaviour shared with MemoryStore is covered by the conformance suite in
``tests/streams/conformance``; these tests are about what only a durable
ledger has.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import lmdb
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import (
    CorruptRecordError,
    Ledger,
    LedgerEnv,
    LmdbBackend,
    LmdbStreamHooks,
    UnattributedBudgetsError,
    inspect_ledger,
    open_ledger,
)
from ledger.lmdb._check import check_ledger
from ledger.lmdb._layout import (
    CHUNK,
    MAX_KEY,
    attempt_key,
    descriptor_key,
    group_key,
    index_key,
    keyed_prefix,
    keyed_prefix_of,
    legacy_attempt_key,
    message_key,
)
from ledger.lmdb._manifest import read_manifest
from ledger.lmdb._seal import seal, unseal
from ledger.lmdb._view import LmdbView, decode_run
from streams import (
    Key,
    MessageTx,
    SequenceError,
    StaleGenerationError,
    Stream,
    StreamHooks,
    StreamRef,
    handle_messages,
    open_scope,
    remove_group,
    store,
)
from streams._store._operations import COMPACT_CHUNK
from streams.store import (
    MAX_KEY_BYTES,
    AppendBatch,
    AttemptKey,
    GroupChange,
    KeyedRange,
    KeyedWrite,
    MessageCommit,
    MessageFail,
    MessageOpen,
    MessageRef,
    OutputBatch,
    StreamFinish,
    StreamOpen,
    StreamOpened,
)

ORDERS = StreamRef("run", "source", "orders")
INVOICES = StreamRef("run", "billing", "invoices")
_u64 = struct.Struct(">Q")


@asynccontextmanager
async def ledger_at(path: Path) -> AsyncIterator[Ledger[LmdbBackend]]:
    async with open_ledger(path, sync=False) as ledger:
        yield ledger


def opening(ref: StreamRef = ORDERS, *groups: str, resumable: bool = True) -> StreamOpen:
    return StreamOpen(ref, "int", 100, groups or ("billing",), resumable=resumable)


def payloads(first: int, count: int) -> tuple[bytes, ...]:
    return tuple(b"order-%d" % i for i in range(first, first + count))


async def append(
    hooks: LmdbStreamHooks, opened: StreamOpened, count: int, *, position: int | None = None
) -> None:
    await hooks.append(
        AppendBatch(
            opened.ref, opened.generation, opened.appended + 1, payloads(opened.appended + 1, count), position
        )
    )


def acks(opened: StreamOpened, group: str, seqs: range | list[int]) -> list[MessageCommit]:
    return [MessageCommit(MessageRef(opened.ref, group, opened.generation, s)) for s in seqs]


def dump(ledger: Ledger[LmdbBackend]) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every record of the stream databases."""
    with ledger.backend.env.read() as txn:
        return {
            name: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=ledger.backend.env.db(name))]
            for name in ("streams", "messages", "groups", "attempts", "keyed")
        }


def entries(ledger: Ledger[LmdbBackend], name: str) -> int:
    """Records in a database; for ``messages``, the messages its runs hold."""
    with ledger.backend.env.read() as txn:
        if name != "messages":
            return int(txn.stat(ledger.backend.env.db(name))["entries"])
        return sum(len(decode_run(bytes(k), bytes(v))) for k, v in txn.cursor(db=ledger.backend.env.db(name)))


def recover_spans(spans: InMemorySpanExporter) -> list[dict[str, Any]]:
    return [dict(s.attributes or {}) for s in spans.get_finished_spans() if s.name == "streamledger.recover"]


# -- the fixture the conformance suite uses ---------------------------------------------------


async def test_ledger_streams_is_a_stream_hooks_store(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        hooks: StreamHooks = ledger.streams
        assert isinstance(hooks, StreamHooks)
        assert isinstance(ledger.streams, LmdbStreamHooks)
        opened = await hooks.open(opening(resumable=False))
        assert (opened.created, opened.generation, opened.appended, opened.tail) == (True, 1, 0, ())


# -- durability across reopen ------------------------------------------------------------------


async def test_tail_frontiers_and_cursor_survive_close_and_reopen(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening(ORDERS, "billing", "audit"))
        await append(ledger.backend.streams, opened, 6, position=42)
        await ledger.streams.commit(
            [
                *acks(opened, "billing", [1, 2, 4]),
                MessageCommit(MessageRef(ORDERS, "billing", 1, 6), state=b"\x93\x01\x02\x03"),
                *acks(opened, "audit", [1]),
            ]
        )
    async with ledger_at(tmp_path / "l") as ledger:
        again = await ledger.streams.open(opening(ORDERS, "billing", "audit"))
    assert (again.created, again.generation, again.appended, again.position) == (False, 2, 6, 42)
    billing, audit = again.groups
    assert (billing.group, billing.acked_through, billing.acked_above) == ("billing", 2, (4, 6))
    assert billing.state == b"\x93\x01\x02\x03"
    assert (audit.group, audit.acked_through, audit.acked_above) == ("audit", 1, ())
    assert [(m.seq, m.payload) for m in again.tail] == list(zip(range(2, 7), payloads(2, 5), strict=True))


async def test_every_open_raises_the_generation(tmp_path: Path) -> None:
    generations = []
    for _ in range(2):
        async with ledger_at(tmp_path / "l") as ledger:
            for _ in range(2):
                generations.append((await ledger.streams.open(opening())).generation)
    assert generations == [1, 2, 3, 4]


async def test_a_stale_generation_is_fenced_and_changes_nothing(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        old = await ledger.streams.open(opening())
        await append(ledger.backend.streams, old, 3)
        new = await ledger.streams.open(opening())
        before = dump(ledger)
        with pytest.raises(StaleGenerationError, match="generation 1"):
            await ledger.streams.append(AppendBatch(ORDERS, old.generation, 4, (b"x",)))
        with pytest.raises(StaleGenerationError):
            await ledger.streams.commit(acks(old, "billing", [1]))
        with pytest.raises(StaleGenerationError):
            await ledger.streams.open_message(MessageOpen(MessageRef(ORDERS, "billing", 1, 1), "n", 1))
        with pytest.raises(StaleGenerationError):
            await ledger.streams.fail_message(MessageFail(MessageRef(ORDERS, "billing", 1, 1), "n", 2, 0))
        with pytest.raises(StaleGenerationError):
            await ledger.streams.finish(StreamFinish(ORDERS, old.generation))
        assert dump(ledger) == before
        await ledger.streams.commit(acks(new, "billing", [1]))


async def test_budgets_persist_across_reopen_and_are_not_replenished_by_a_generation_raise(
    tmp_path: Path,
) -> None:
    def message(generation: int) -> MessageRef:
        return MessageRef(ORDERS, "billing", generation, 2)

    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening())
        await append(ledger.backend.streams, opened, 3)
        first = await ledger.streams.open_message(MessageOpen(message(1), "billing-node", 3))
        assert (first.index, first.exhausted) == (0, False)
        failed = await ledger.streams.fail_message(MessageFail(message(1), "billing-node", 3, 0))
        assert (failed.index, failed.exhausted) == (1, False)
    async with ledger_at(tmp_path / "l") as ledger:
        await ledger.streams.open(opening())
        reclaimed = await ledger.streams.open_message(MessageOpen(message(2), "billing-node", 3))
        assert (reclaimed.index, reclaimed.exhausted) == (1, False)
        # another node or parent attempt has a budget of its own
        other = await ledger.streams.open_message(MessageOpen(message(2), "other-node", 3))
        assert other.index == 0
        last = await ledger.streams.fail_message(MessageFail(message(2), "billing-node", 3, 1))
        assert (last.index, last.exhausted) == (2, False)
        final = await ledger.streams.fail_message(MessageFail(message(2), "billing-node", 3, 2))
        assert (final.index, final.exhausted) == (3, True)
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening())
        assert opened.groups[0].exhausted == (2,)
        after = await ledger.streams.open_message(MessageOpen(message(3), "billing-node", 3))
        assert (after.index, after.exhausted) == (3, True)
        with pytest.raises(SequenceError, match="exhausted"):
            await ledger.streams.commit([MessageCommit(message(3), node="billing-node", attempt=3)])


async def test_a_long_budget_under_its_0_1_key_is_read_refuses_group_changes_until_moved(
    tmp_path: Path,
) -> None:
    node = "n" * 300  # the budget's key is digested
    message = MessageRef(ORDERS, "billing", 1, 1)
    budget = AttemptKey(ORDERS, "billing", 1, node, "")
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening())
        await append(ledger.backend.streams, opened, 2)
        await ledger.streams.fail_message(MessageFail(message, node, 5, 0))
        stream_id = 1  # the first stream of a ledger
        current, legacy = attempt_key(stream_id, budget), legacy_attempt_key(stream_id, budget)
        assert legacy is not None and current != legacy

        def as_written_by_0_1(txn: Any) -> None:  # the record under the key 0.1.0 gave it
            db = ledger.backend.env.db("attempts")
            value = txn.get(current, db=db)
            txn.delete(current, db=db)
            txn.put(legacy, seal("attempts", legacy, unseal(value, db="attempts", key=current)), db=db)

        await ledger.backend.env.write(as_written_by_0_1)
        reread = await ledger.streams.open_message(MessageOpen(message, node, 5))
        assert reread.index == 1  # never refilled by the new layout
        before = dump(ledger)
        with pytest.raises(UnattributedBudgetsError, match=r"written by streamledger 0\.1\.0"):
            await remove_group(ledger.streams, ORDERS, "billing")  # whose budgets? the key cannot say
        assert dump(ledger) == before
        await ledger.streams.fail_message(MessageFail(message, node, 5, 1))
        assert [k for k, _ in dump(ledger)["attempts"]] == [current]  # moved to its current key
        await remove_group(ledger.streams, ORDERS, "billing")
        assert dump(ledger)["attempts"] == []


async def test_a_commit_batch_with_a_stale_record_in_position_3_confirms_nothing(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        old = await ledger.streams.open(opening())
        await append(ledger.backend.streams, old, 5)
        orders = await ledger.streams.open(opening())
        invoices = await ledger.streams.open(opening(INVOICES, "audit"))
        before = dump(ledger)

        def handled(seq: int, generation: int) -> MessageCommit:
            return MessageCommit(
                MessageRef(ORDERS, "billing", generation, seq),
                state=b"%d" % seq,
                results={"total": b"%d" % seq},
                outputs=(OutputBatch(INVOICES, invoices.generation, seq, (b"invoice-%d" % seq,)),),
            )

        batch = [handled(1, orders.generation), handled(2, orders.generation), handled(3, old.generation)]
        with pytest.raises(StaleGenerationError, match="generation 1"):
            await ledger.streams.commit(batch)
        assert dump(ledger) == before
        await ledger.streams.commit(batch[:2])
    async with ledger_at(tmp_path / "l") as ledger:
        orders = await ledger.streams.open(opening())
        invoices = await ledger.streams.open(opening(INVOICES, "audit"))
    assert orders.groups[0].acked_through == 2
    assert orders.groups[0].state == b"2"
    assert [m.payload for m in invoices.tail] == [b"invoice-1", b"invoice-2"]


async def test_open_message_answers_while_the_writer_is_busy(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening())
        await append(ledger.backend.streams, opened, 1)
        started, release = threading.Event(), threading.Event()

        def busy(txn: lmdb.Transaction) -> bool:
            started.set()
            return release.wait(timeout=30)

        # with a second write, the batch goes to the writer thread (a lone write on an idle loop
        # would commit on the loop's own thread: tests/ledger/test_inline_commit.py)
        ticket = ledger.backend.env.submit(busy)
        other = ledger.backend.env.submit(lambda txn: True)
        await anyio.to_thread.run_sync(started.wait)
        try:
            attempt = await ledger.streams.open_message(
                MessageOpen(MessageRef(ORDERS, "billing", opened.generation, 1), "n", 1)
            )
            assert (attempt.index, attempt.exhausted, attempt.state) == (0, False, None)
        finally:
            release.set()
        assert await ticket.wait() is True
        assert await other.wait() is True


# -- compaction and the cost of opening ------------------------------------------------------


async def test_compaction_removes_messages_acked_by_every_group_and_open_returns_the_tail(
    tmp_path: Path,
) -> None:
    total = 3 * COMPACT_CHUNK
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening(ORDERS, "billing", "audit"))
        await append(ledger.backend.streams, opened, total)
        await ledger.streams.commit(acks(opened, "billing", range(1, total + 1)))
        assert entries(ledger, "messages") == total  # audit has acknowledged nothing
        await ledger.streams.commit(acks(opened, "audit", range(1, total - 99)))
        assert entries(ledger, "messages") <= COMPACT_CHUNK + 100
    async with ledger_at(tmp_path / "l") as ledger:
        again = await ledger.streams.open(opening(ORDERS, "billing", "audit"))
        assert [g.acked_through for g in again.groups] == [total, total - 100]
        assert [m.seq for m in again.tail] == list(range(total - 99, total + 1))
        assert [m.payload for m in again.tail] == list(payloads(total - 99, 100))
        await ledger.streams.commit(acks(again, "audit", range(total - 99, total + 1)))
        await ledger.streams.finish(StreamFinish(ORDERS, again.generation))
        assert entries(ledger, "messages") == 0  # a finished, fully acknowledged stream keeps none
        done = await ledger.streams.open(opening(ORDERS, "billing", "audit"))
        assert (done.finished, done.appended, done.tail) == (True, total, ())


async def build(path: Path, acked: int, pending: int) -> None:
    async with ledger_at(path) as ledger:
        opened = await ledger.streams.open(opening())
        chunk = 4096
        for first in range(1, acked + pending + 1, chunk):
            count = min(chunk, acked + pending + 1 - first)
            await ledger.streams.append(AppendBatch(ORDERS, opened.generation, first, payloads(first, count)))
        for first in range(1, acked + 1, chunk):
            await ledger.streams.commit(acks(opened, "billing", range(first, min(first + chunk, acked + 1))))


async def test_open_reads_only_the_descriptor_frontiers_and_tail(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    await build(tmp_path / "small", 1_000, 100)
    await build(tmp_path / "large", 20 * COMPACT_CHUNK, 100)
    spans.clear()
    for name in ("small", "large"):
        async with ledger_at(tmp_path / name) as ledger:
            assert entries(ledger, "messages") <= COMPACT_CHUNK + 100
            opened = await ledger.streams.open(opening())
            assert len(opened.tail) == 100
    small, large = recover_spans(spans)
    # index, descriptor, one frontier and the 100 unacknowledged messages, nothing more
    assert small["streamledger.records_read"] == large["streamledger.records_read"] == 103
    assert large["streamledger.tail"] == 100


async def test_the_recover_span_names_the_stream_and_never_its_payloads(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening())
        await append(ledger.backend.streams, opened, 2)
        await ledger.streams.open(opening())
    first, second = recover_spans(spans)
    assert second == {
        "streamledger.stream.scope": "run",
        "streamledger.stream.node": "source",
        "streamledger.stream.key": "orders",
        "streamledger.generation": 2,
        "streamledger.appended": 2,
        "streamledger.tail": 2,
        "streamledger.created": False,
        "streamledger.records_read": 4,  # descriptor, frontier, 2 messages: the id is remembered
    }
    assert first["streamledger.created"] is True
    assert not any(b"order-" in str(v).encode() for v in second.values())


# -- layout and coalescing -------------------------------------------------------------------


async def test_records_use_small_stream_ids_and_big_endian_sequence_keys(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        orders = await ledger.streams.open(opening())
        invoices = await ledger.streams.open(opening(INVOICES, "audit"))
        await append(ledger.backend.streams, orders, 300)
        await append(ledger.backend.streams, invoices, 2)
        records = dump(ledger)
    runs = [(k, len(decode_run(k, v))) for k, v in records["messages"]]
    # runs of at most CHUNK messages, keyed by stream id and first sequence
    assert runs == [
        (message_key(1, 1), CHUNK),
        (message_key(1, CHUNK + 1), 300 - CHUNK),
        (message_key(2, 1), 2),
    ]
    streams = dict(records["streams"])
    assert {index_key(ORDERS), index_key(INVOICES), descriptor_key(1), descriptor_key(2)} <= set(streams)
    assert {k for k, _ in records["groups"]} == {group_key(1, "billing"), group_key(2, "audit")}


@pytest.mark.parametrize("acked", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7, 3 * CHUNK])
async def test_the_tail_starts_inside_a_run_and_never_strays_into_another_stream(
    tmp_path: Path, acked: int
) -> None:
    total = 3 * CHUNK
    async with ledger_at(tmp_path / "l") as ledger:
        before = await ledger.streams.open(opening(INVOICES, "audit"))  # stream 1, keys before
        orders = await ledger.streams.open(opening())  # stream 2
        after = await ledger.streams.open(opening(StreamRef("run", "z", "later"), "g"))  # stream 3, after
        await append(ledger.backend.streams, before, 5)
        await append(ledger.backend.streams, after, 5)
        for first in range(1, total + 1, 100):  # runs that do not line up with CHUNK
            count = min(100, total + 1 - first)
            await ledger.streams.append(AppendBatch(ORDERS, orders.generation, first, payloads(first, count)))
        if acked:
            await ledger.streams.commit(acks(orders, "billing", range(1, acked + 1)))
    async with ledger_at(tmp_path / "l") as ledger:
        again = await ledger.streams.open(opening())
        assert [m.seq for m in again.tail] == list(range(acked + 1, total + 1))
        assert [m.payload for m in again.tail] == list(payloads(acked + 1, total - acked))


async def test_names_longer_than_an_lmdb_key_work_and_read_back_in_full(tmp_path: Path) -> None:
    ref = StreamRef("scope/" * 200, "node-" * 120, "k" * 300)
    group, node, parent = "g" * 700, "n" * 600, "p" * 900
    message = MessageRef(ref, group, 1, 1)
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(StreamOpen(ref, "int", 8, (group, "short")))
        await append(ledger.backend.streams, opened, 2)
        failed = await ledger.streams.fail_message(MessageFail(message, node, 3, 0, parent))
        assert failed.index == 1
        await ledger.streams.commit(
            [MessageCommit(message, node=node, attempt=1, state=b"\x01", parent_attempt=parent)]
        )
        records = dump(ledger)
        report = inspect_ledger(ledger.backend.env)
    assert max(len(k) for keys in records.values() for k, _ in keys) <= MAX_KEY + 33
    assert records["attempts"] == []  # the commit removed the budget it used
    assert report["streams"][0]["key"] == ref.key
    assert {g["group"] for g in report["streams"][0]["groups"]} == {group, "short"}
    async with ledger_at(tmp_path / "l") as ledger:
        again = await ledger.streams.open(StreamOpen(ref, "int", 8, (group, "short"), resumable=True))
    assert again.ref == ref
    assert [(g.group, g.acked_through, g.state) for g in again.groups] == [
        (group, 1, b"\x01"),
        ("short", 0, None),
    ]
    assert [m.seq for m in again.tail] == [1, 2]


class CountingTxn:
    """A write transaction that counts puts per database."""

    def __init__(self, txn: lmdb.Transaction, names: dict[int, str]) -> None:
        self._txn = txn
        self._names = names
        self.puts: dict[str, int] = {}

    def _count(self, db: Any, n: int = 1) -> None:
        name = self._names[id(db)]
        self.puts[name] = self.puts.get(name, 0) + n

    def put(self, key: bytes, value: bytes, *, db: Any) -> bool:
        self._count(db)
        return bool(self._txn.put(key, value, db=db))

    def cursor(self, *, db: Any) -> Any:
        return CountingCursor(self, self._txn.cursor(db=db), db)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class CountingCursor:
    def __init__(self, owner: CountingTxn, cursor: lmdb.Cursor, db: Any) -> None:
        self._owner, self._cursor, self._db = owner, cursor, db

    def putmulti(self, items: list[tuple[bytes, bytes]]) -> Any:
        self._owner._count(self._db, len(items))
        return self._cursor.putmulti(items)

    def __enter__(self) -> CountingCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


async def run_counted(ledger: Ledger[LmdbBackend], op: Callable[[LmdbView], object]) -> dict[str, int]:
    names = {id(ledger.backend.env.db(n)): n for n in ("streams", "messages", "groups", "attempts")}
    dbs = {n: ledger.backend.env.db(n) for n in names.values()}

    def fn(txn: lmdb.Transaction) -> dict[str, int]:
        counting = CountingTxn(txn, names)
        view = LmdbView(counting, dbs, {})
        op(view)
        view.flush()
        return counting.puts

    return await ledger.backend.env.write(fn)


async def test_a_commit_of_256_messages_writes_each_frontier_and_descriptor_once(tmp_path: Path) -> None:
    async with ledger_at(tmp_path / "l") as ledger:
        orders = await ledger.streams.open(opening())
        invoices = await ledger.streams.open(opening(INVOICES, "audit"))
        await append(ledger.backend.streams, orders, 256)
        commits = [
            MessageCommit(
                MessageRef(ORDERS, "billing", orders.generation, s),
                state=b"%d" % s,
                outputs=(OutputBatch(INVOICES, invoices.generation, s, (b"invoice-%d" % s,)),),
            )
            for s in range(1, 257)
        ]
        puts = await run_counted(ledger, lambda view: store.commit(view, commits))
        assert puts == {"groups": 1, "streams": 1, "messages": 1}  # the 256 invoices are one run
        again = await ledger.streams.open(opening(INVOICES, "audit"))
        assert again.appended == 256


# -- keyed state ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("keyed_in_table")
async def test_a_groups_keyed_state_is_one_range_of_keys_under_its_prefix_and_a_long_group_is_digested(
    tmp_path: Path,
) -> None:
    long_group = "g" * 300
    async with ledger_at(tmp_path / "l") as ledger:
        opened = await ledger.streams.open(opening(ORDERS, "billing", long_group, "audit"))
        await append(ledger.backend.streams, opened, 2)
        longest = b"k" * MAX_KEY_BYTES
        writes = (KeyedWrite(b"b", b"2"), KeyedWrite(b"a", b"1"), KeyedWrite(longest, b""))
        await ledger.streams.commit(
            [
                MessageCommit(MessageRef(ORDERS, group, opened.generation, 1), keyed=writes)
                for group in ("billing", long_group, "audit")
            ]
        )
        stored = {k: unseal(v, db="keyed", key=k) for k, v in dump(ledger)["keyed"]}
        whole, digested = keyed_prefix(1, "billing"), keyed_prefix(1, long_group)
        assert whole == _u64.pack(1) + struct.pack(">I", 7) + b"billing"
        assert len(digested) == 8 + 1 + 32 and digested[8] == 0xFF
        assert {k: v for k, v in stored.items() if k.startswith(whole)} == {
            whole + b"a": b"1",  # the value bytes only: the prefix says whose it is
            whole + b"b": b"2",
            whole + longest: b"",
        }
        assert max(len(k) for k in stored) == len(digested) + MAX_KEY_BYTES
        assert all(keyed_prefix_of(k) in (whole, digested, keyed_prefix(1, "audit")) for k in stored)
        listed = await ledger.backend.streams.list_keyed(KeyedRange(ORDERS, long_group))
        assert [e.key for e in listed] == [b"a", b"b", longest]
        with ledger.backend.env.read() as txn:
            manifest = read_manifest(txn, ledger.backend.env.db("meta"), "keyed")
        assert manifest is not None and manifest.keys == 9
        # a removal deletes the group's range and nothing else; an overwrite adds no key
        await ledger.backend.streams.change_group(GroupChange(ORDERS, "billing", remove=True))
        again = await ledger.streams.open(opening(ORDERS, long_group, "audit"))
        await ledger.streams.commit(
            [MessageCommit(MessageRef(ORDERS, "audit", again.generation, 2), keyed=(KeyedWrite(b"a", b"3"),))]
        )
        remaining = [k for k, _ in dump(ledger)["keyed"]]
        assert not any(k.startswith(whole) for k in remaining) and len(remaining) == 6
        with ledger.backend.env.read() as txn:
            manifest = read_manifest(txn, ledger.backend.env.db("meta"), "keyed")
        assert manifest is not None and manifest.keys == 6
    env = LedgerEnv.open_readonly(tmp_path / "l")  # and the manifest agrees with what is held
    try:
        assert check_ledger(env).sound
    finally:
        env.close()


# -- damaged records ---------------------------------------------------------------------------


async def test_a_corrupted_descriptor_refuses_the_ledger_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l"
    async with ledger_at(path) as ledger:
        opened = await ledger.streams.open(opening())
        await append(ledger.backend.streams, opened, 3)
    env = lmdb.open(str(path), max_dbs=16)
    try:
        db = env.open_db(b"streams", create=False)
        with env.begin(write=True, db=db) as txn:
            stored = txn.get(descriptor_key(1))
            assert stored is not None
            value = bytearray(stored)
            value[-1] ^= 0x40
            txn.put(descriptor_key(1), bytes(value))
    finally:
        env.close()
    before = (path / "data.mdb").read_bytes()
    for _ in range(2):
        with pytest.raises(CorruptRecordError, match="'streams'"):
            async with ledger_at(path):  # refused when the ledger opens, before any stream is
                pass
    assert (path / "data.mdb").read_bytes() == before


async def test_a_retried_message_leaves_no_budget_record_once_committed(tmp_path: Path) -> None:
    """handle_messages commits a retry on its own, with its attempt index, so the store
    forgets its budget; first attempts around it are committed as runs."""
    numbers = Key("numbers", Stream[int])
    async with ledger_at(tmp_path / "l") as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(numbers, node="src", groups=("g",))
        for i in range(1, 6):
            await stream.writer().send(i)
        await stream.writer().finish()

        async def flaky(tx: MessageTx[None], value: int) -> None:
            if value == 3 and tx.attempt == 0:
                raise RuntimeError("first attempt of 3 fails")

        result = await handle_messages(stream.reader("g"), flaky, attempts=2)
        assert result.handled == 5
        assert entries(ledger, "attempts") == 0
