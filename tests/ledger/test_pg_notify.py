"""Wake-ups without polling on PostgreSQL: commits notify their followers and workers, polls are the fallback.

Each test that proves a notification sets the poll's bound far past its
``fail_after``: it passes only if the wake-up came from the server. The
tests of lost notifications set it small, and pass by the poll.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from ledger._runs import RunCancel, RunRecord
from ledger.postgres import consume, open_postgres, work
from ledger.postgres._leases import claim_run
from ledger.postgres._notify import (
    CHANNEL,
    LISTENING_POLL_SECONDS,
    RUNS,
    Listener,
    Wakeup,
    open_listener,
    stream_topic,
)
from ledger.postgres._store import PgConnection
from ledger.postgres._view import PgView
from streams import Graph, Key, MessageTx, NodeContext, Stream, StreamRef, follow_stream, open_scope
from streams.store import AppendBatch, StreamRead, append, partition_name, read_stream, type_name

from .pool_graphs import GRAPHS, N, summing

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])
#: Far past every ``fail_after`` of a test that proves a notification.
NEVER = 60.0


def one_partition(value: int) -> str:
    return "every number"  # one key: every message in one partition, followed since the first


def silent_report(partition: int, event: str) -> None:
    pass


async def open_numbers(scope: Any) -> Any:
    """``NUMBERS``, two partitions, every number in one of them (``partition_of(1)``)."""
    return await scope.open_partitioned(
        NUMBERS, node="source", partitions=2, partition_key=one_partition, groups=("g",), resumable=True
    )


class Seen:
    """The numbers a member handled, each with an event set once it did."""

    def __init__(self) -> None:
        self.events: dict[int, anyio.Event] = {}
        self.returned = anyio.Event()

    def event(self, value: int) -> anyio.Event:
        return self.events.setdefault(value, anyio.Event())

    async def handle(self, tx: MessageTx[None], value: int) -> None:
        self.event(value).set()


def member(url: str, seen: Seen, poll_seconds: float, lease_seconds: float = 3.0) -> Any:
    """A member of group ``g`` on ``NUMBERS``; ``seen.returned`` is set once it returned."""

    async def run() -> None:
        await consume(
            url,
            NUMBERS,
            seen.handle,
            scope="notify",
            node="source",
            partitions=2,
            group="g",
            owner="m",
            lease_seconds=lease_seconds,
            poll_seconds=poll_seconds,
            report=silent_report,
        )
        seen.returned.set()

    return run


@asynccontextmanager
async def a_member_that_handled_one(postgres_url: str, seen: Seen) -> AsyncIterator[Any]:
    """A member (its poll bound :data:`NEVER`) that handled the number 1; the writer of the numbers."""
    async with open_postgres(postgres_url) as ledger, open_scope(ledger.streams, scope="notify") as scope:
        writer = (await open_numbers(scope)).writer()
        await writer.send(1)
        await writer.flush()
        async with anyio.create_task_group() as tg:
            tg.start_soon(member(postgres_url, seen, NEVER))
            with anyio.fail_after(30):  # the member starts, claims, and reads what is there
                await seen.event(1).wait()
            yield writer


async def test_an_idle_member_handles_a_message_appended_elsewhere_long_before_its_poll(
    postgres_url: str,
) -> None:
    seen = Seen()
    async with a_member_that_handled_one(postgres_url, seen) as writer:
        await writer.send(2)  # the follower waits now: only a notification brings this
        await writer.flush()
        with anyio.fail_after(20):
            await seen.event(2).wait()
        await writer.finish()
        with anyio.fail_after(20):  # the end of both partitions is told too: the member returns
            await seen.returned.wait()


async def test_a_member_whose_listening_session_was_ended_hears_again_and_misses_nothing(
    postgres_url: str,
) -> None:
    seen = Seen()
    async with a_member_that_handled_one(postgres_url, seen) as writer:
        ended = await anyio.to_thread.run_sync(end_listening_sessions, postgres_url)
        assert ended == 1
        await writer.send(2)  # maybe while nobody listens: the listener, back, wakes every waiter
        await writer.flush()
        with anyio.fail_after(20):
            await seen.event(2).wait()
        await writer.send(3)  # and it listens again
        await writer.flush()
        with anyio.fail_after(20):
            await seen.event(3).wait()
        await writer.finish()
        with anyio.fail_after(20):
            await seen.returned.wait()


def end_listening_sessions(url: str) -> int:
    """End the session of every listener of the server (as a restart would); how many there were."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE query = 'LISTEN {CHANNEL}' AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


async def test_an_idle_member_whose_listener_listens_reads_nothing_whatever_its_poll(
    postgres_url: str,
) -> None:
    """Its poll (0.05 s) bounds its waits only while its listener is away: idle, it costs nothing
    but renewals (a third of its lease apart, here past the test), where it polled 20 times a second
    on each partition."""
    seen = Seen()
    async with open_postgres(postgres_url) as ledger, open_scope(ledger.streams, scope="notify") as scope:
        writer = (await open_numbers(scope)).writer()
        await writer.send(1)
        await writer.flush()
        async with anyio.create_task_group() as tg:
            tg.start_soon(member(postgres_url, seen, 0.05, lease_seconds=NEVER))
            with anyio.fail_after(30):
                await seen.event(1).wait()
            before = PgConnection.committed_in_process
            await anyio.sleep(1.0)  # time passing, not a condition: 40 polls of old
            assert PgConnection.committed_in_process - before < 5  # the ack and the first reads, at most
            await writer.send(2)  # and it still hears of a commit at once
            await writer.flush()
            with anyio.fail_after(20):
                await seen.event(2).wait()
            await writer.finish()
            with anyio.fail_after(20):
                await seen.returned.wait()


async def test_a_member_started_before_its_writer_reads_the_stream_once_it_is_opened(
    postgres_url: str,
) -> None:
    seen = Seen()
    async with anyio.create_task_group() as tg:
        tg.start_soon(member(postgres_url, seen, NEVER))
        async with open_postgres(postgres_url) as ledger, open_scope(ledger.streams, scope="notify") as scope:
            writer = (await open_numbers(scope)).writer()
            await writer.send(1)  # the member waits for the opening: only its notification brings this
            await writer.flush()
            with anyio.fail_after(20):
                await seen.event(1).wait()
            await writer.finish()
            with anyio.fail_after(20):
                await seen.returned.wait()


async def test_a_waiter_waits_past_its_poll_while_its_listener_listens_and_a_break_ends_the_wait(
    postgres_url: str,
) -> None:
    away = Listener(postgres_url)  # never served: away
    with away.watching("t") as polling:
        assert polling.bound(0.05) == 0.05 and polling.bound(0.05, due=0.01) == 0.01
    async with open_listener(postgres_url) as listener:
        with listener.watching("nothing ever") as waiter:
            assert waiter.bound(0.05) == LISTENING_POLL_SECONDS
            assert waiter.bound(0.05, due=2.0) == 2.0 and waiter.bound(0.05, due=-1.0) == 0.0
            with anyio.move_on_after(0.5) as waited:
                await waiter.wait(0.01)
            assert waited.cancelled_caught  # its poll did not end the wait
            assert await anyio.to_thread.run_sync(end_listening_sessions, postgres_url) == 1
            with anyio.fail_after(20):  # the break ends it (far before the listening bound)
                await waiter.wait(NEVER)


class Silent:
    """Wake-ups that never come (every notification lost): the follower has only its poll."""

    def __init__(self) -> None:
        self.waits = 0

    async def wait(self, seconds: float) -> None:
        self.waits += 1
        await anyio.sleep(seconds)


async def test_a_follower_whose_notifications_are_all_lost_reads_within_its_poll(postgres_url: str) -> None:
    silent = Silent()
    async with open_postgres(postgres_url) as ledger, open_scope(ledger.streams, scope="notify") as scope:
        numbers = await open_numbers(scope)
        writer = numbers.writer()
        async with follow_stream(
            ledger.streams,
            NUMBERS,
            scope="notify",
            node="source",
            group="g",
            partition=(numbers.partition_of(1), 2),
            poll_seconds=0.05,
            wakeups=silent,
        ) as reader:
            await writer.send(1)
            await writer.flush()
            with anyio.fail_after(20):
                assert (await reader.receive()).value == 1
    assert silent.waits >= 1


async def test_a_rolled_back_append_notifies_nobody_and_a_committed_one_does(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as ledger, open_scope(ledger.streams, scope="notify") as scope:
        numbers = await open_numbers(scope)
        ref = StreamRef(scope="notify", node="source", key=partition_name("numbers", numbers.partition_of(1)))
        stream_id, generation = await anyio.to_thread.run_sync(stream_row, postgres_url, ref)
        async with open_listener(postgres_url) as listener:
            with listener.watching(stream_topic(stream_id)) as wakeup, listener.watching("marker") as marker:
                batch = AppendBatch(ref, generation, 1, (b"\x01",))
                await anyio.to_thread.run_sync(append_then, postgres_url, batch, False)
                await anyio.to_thread.run_sync(notify, postgres_url, "marker")
                await told(marker)  # every notification committed before the marker has arrived
                assert not wakeup.is_set()  # the rolled-back append told nobody
                await anyio.to_thread.run_sync(append_then, postgres_url, batch, True)
                await told(wakeup)
        await numbers.writer().finish()


def stream_row(url: str, ref: StreamRef) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT id FROM streamledger_streams WHERE scope = %s AND node = %s AND key = %s",
            (ref.scope, ref.node, ref.key),
        ).fetchone()
        assert row is not None
        view = PgView(conn, {})
        opened = read_stream(view, StreamRead(ref, type_name(int), ("g",), 2))
        assert opened is not None
        return int(row[0]), opened.generation


class RolledBack(Exception):
    pass


def append_then(url: str, batch: AppendBatch, commit: bool) -> None:
    """Append ``batch`` through the ledger's view, in one transaction, and commit it or roll it back."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            with conn.transaction():
                view = PgView(conn, {})
                append(view, batch)
                view.flush()
                if not commit:
                    raise RolledBack
        except RolledBack:
            pass


def notify(url: str, payload: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


async def told(wakeup: Wakeup) -> None:
    with anyio.fail_after(20):
        await wakeup.wait(NEVER)
    assert not wakeup.is_set()  # a wait that returned consumed the notification


async def test_a_listener_whose_session_was_ended_connects_again_and_wakes_every_waiter(
    postgres_url: str,
) -> None:
    async with open_listener(postgres_url) as listener:
        assert listener.listening
        with listener.watching("nothing ever") as a, listener.watching(stream_topic(7)) as b:
            assert await anyio.to_thread.run_sync(end_listening_sessions, postgres_url) == 1
            with anyio.fail_after(20):  # woken as it broke (they poll), and once it listens again
                while not (listener.listening and listener.connections == 2):
                    await a.wait(NEVER)
                await b.wait(NEVER)
            await anyio.to_thread.run_sync(notify, postgres_url, stream_topic(7))
            await told(b)
            assert not a.is_set()


def holding_forever() -> Graph:
    g = Graph("holding", version="1", inputs=[N])

    @g.node(requires=[N])
    async def hold(ctx: NodeContext) -> None:
        await anyio.sleep_forever()

    return g


async def test_an_idle_worker_claims_a_submitted_run_long_before_its_poll(postgres_url: str) -> None:
    reports: dict[tuple[str, str], anyio.Event] = {}

    def event(run_id: str, outcome: str) -> anyio.Event:
        return reports.setdefault((run_id, outcome), anyio.Event())

    def report(run_id: str, outcome: str) -> None:
        event(run_id, outcome).set()

    graphs = {**GRAPHS, "holding": holding_forever()}
    async with open_postgres(postgres_url) as ledger, anyio.create_task_group() as tg:
        tg.start_soon(
            partial(work, postgres_url, graphs, poll_seconds=NEVER, lease_seconds=NEVER, report=report)
        )
        await ledger.submit(summing(), {N: 3}, run_id="first")
        with anyio.fail_after(30):  # claimed at once, or when told
            await event("first", "completed").wait()
        await ledger.submit(summing(), {N: 4}, run_id="second")  # the worker waits now: only told
        with anyio.fail_after(20):
            await event("second", "completed").wait()
        await ledger.submit(holding_forever(), {N: 1}, run_id="held")
        with anyio.fail_after(20):
            await event("held", "claimed").wait()
        await ledger.cancel("held", reason="the test is over")  # its renewal is 20 s away: told at once
        with anyio.fail_after(15):
            await event("held", "cancelled").wait()
        tg.cancel_scope.cancel()


async def test_an_idle_worker_claims_a_run_whose_lease_ran_out_when_it_runs_out_not_at_its_poll(
    postgres_url: str,
) -> None:
    """A worker that died held the run (its lease runs out in a second, which tells nobody): the idle
    worker's claim that found nothing due also read when that lease ends, and it claims it then."""
    completed = anyio.Event()

    def report(run_id: str, outcome: str) -> None:
        if (run_id, outcome) == ("orphan", "completed"):
            completed.set()

    async with open_postgres(postgres_url) as ledger:
        await ledger.submit(summing(), {N: 3}, run_id="orphan")
        await anyio.to_thread.run_sync(hold_for, postgres_url, "orphan", 1.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(work, postgres_url, GRAPHS, poll_seconds=NEVER, lease_seconds=NEVER, report=report)
            )
            with anyio.fail_after(NEVER / 4):  # well before its poll
                await completed.wait()
            tg.cancel_scope.cancel()


def hold_for(url: str, run_id: str, seconds: float) -> None:
    """Lease ``run_id`` to a worker that is gone, for ``seconds``."""
    with psycopg.connect(url, autocommit=True) as conn:
        assert not isinstance(claim_run(conn, run_id, "gone", seconds), str)


async def test_a_run_cancelled_between_its_claim_and_its_resume_ends_cancelled(postgres_url: str) -> None:
    """The run is cancelled as the worker reports its claim, before its holder listens for the
    cancellation (the notification reaches nobody): its resume finds it cancelled, and the worker
    reports it cancelled, as one told of it, and claims the next run."""
    reports: dict[tuple[str, str], anyio.Event] = {}
    outcomes: list[tuple[str, str]] = []

    def report(run_id: str, outcome: str) -> None:
        outcomes.append((run_id, outcome))
        if (run_id, outcome) == ("held", "claimed"):  # what ledger.cancel writes, as it writes it
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                [(raw,)] = conn.execute(
                    "SELECT record FROM streamledger_runs WHERE run_id = %s", (run_id,)
                ).fetchall()
                record = msgspec.msgpack.decode(raw, type=RunRecord)
                cancelled = msgspec.structs.replace(
                    record, status="cancelled", cancelled=RunCancel("test", "over", time.time())
                )
                conn.execute(
                    "UPDATE streamledger_runs SET status = 'cancelled', record = %s WHERE run_id = %s",
                    (msgspec.msgpack.encode(cancelled), run_id),
                )
        reports.setdefault((run_id, outcome), anyio.Event()).set()

    graphs = {**GRAPHS, "holding": holding_forever()}
    async with open_postgres(postgres_url) as ledger, anyio.create_task_group() as tg:
        tg.start_soon(
            partial(work, postgres_url, graphs, poll_seconds=NEVER, lease_seconds=NEVER, report=report)
        )
        await ledger.submit(holding_forever(), {N: 1}, run_id="held")
        await ledger.submit(summing(), {N: 3}, run_id="next")
        with anyio.fail_after(NEVER / 4):  # well before a renewal or a poll
            await reports.setdefault(("next", "completed"), anyio.Event()).wait()
        tg.cancel_scope.cancel()
    assert outcomes[:2] == [("held", "claimed"), ("held", "cancelled")]
    assert (await ledger_status(postgres_url, "held")) == "cancelled"


async def ledger_status(url: str, run_id: str) -> str:
    async with open_postgres(url) as ledger:
        record = await ledger.backend.run_book.read(run_id)
    assert record is not None
    return record.status


async def test_a_listener_hears_the_runs_channel_only_for_runs_made_due(postgres_url: str) -> None:
    async with open_postgres(postgres_url) as ledger, open_listener(postgres_url) as listener:
        with listener.watching(RUNS) as due, listener.watching("marker") as marker:
            await ledger.submit(summing(), {N: 2}, run_id="r")
            await told(due)
            await ledger.resume("r", summing())  # its lease given up once it completed: nobody told
            await anyio.to_thread.run_sync(notify, postgres_url, "marker")
            await told(marker)
            assert not due.is_set()


def test_only_what_a_follower_reads_anew_tells_it_of_a_descriptor_change() -> None:
    """A compaction (and the marks and position of an append, whose runs tell of it) tells nobody; a
    new generation, group set, append count, end or failure does, and so does a new stream."""
    from ledger.postgres._view import _tells
    from streams.store import StreamDescriptor

    before = StreamDescriptor(StreamRef("s", "n", "k"), "int", 16, 1, ("g",), appended=10, position=10)
    assert not _tells(before, msgspec.structs.replace(before, compacted_through=8))
    assert not _tells(before, msgspec.structs.replace(before, marks=(1, 2), position=11))
    for change in (
        {"generation": 2},
        {"groups": ("g", "h")},
        {"appended": 11},
        {"finished": True},
        {"failed": True},
    ):
        assert _tells(before, msgspec.structs.replace(before, **change)), change
    assert _tells(None, before)
