"""Group members on PostgreSQL: processes sharing one consumer group of a partitioned stream.

The members of these tests run as tasks of the test, each with a ledger
connection of its own, as processes would; tests/ledger/test_members_crash.py
kills and pauses real processes.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import LeaseLostError
from ledger.postgres import PartitionLease, consume, open_postgres
from ledger.postgres._leases import FencedConnection
from ledger.postgres._members import _claim, share_of
from ledger.postgres._schema import TABLES
from ledger.postgres._streams import PgStreamHooks
from streams import StreamRef, open_scope
from streams.store import KeyedWrite, MessageCommit, MessageRef, StreamRead, type_name

from .test_postgres_store import execute

pytestmark = pytest.mark.anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import customer_members as shop  # noqa: E402

N = 400
CUSTOMERS = 37


def expected(n: int = N) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for i in range(1, n + 1):
        o = shop.order(i, CUSTOMERS)
        totals[o.customer] += o.amount
    return dict(totals)


class Events:
    """Each member's reports, and an event set when one arrives that a test waits for."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []
        self._waiting: list[tuple[Any, anyio.Event]] = []

    def report(self, member: str) -> Any:
        def report(partition: int, event: str) -> None:
            self.seen.append((member, partition, event))
            for condition, ready in self._waiting:
                if condition(self.seen):
                    ready.set()

        return report

    async def until(self, condition: Any) -> None:
        if condition(self.seen):
            return
        ready = anyio.Event()
        self._waiting.append((condition, ready))
        with anyio.fail_after(60):
            await ready.wait()


def member(url: str, name: str, events: Events, **options: Any) -> Any:
    async def run() -> int:
        return await consume(
            url,
            shop.ORDERS,
            shop.add,
            scope="shop",
            node="checkout",
            partitions=shop.PARTITIONS,
            group="totals",
            keyed=shop.TOTALS,
            owner=name,
            poll_seconds=0.05,
            report=events.report(name),
            **{"lease_seconds": 3.0, **options},
        )

    return run


def test_the_share_of_a_member_is_every_mth_partition_in_the_order_of_their_names() -> None:
    assert share_of("b", ("a", "b", "c"), 4) == {1}
    assert share_of("a", ("a", "b", "c"), 4) == {0, 3}
    assert share_of("a", ("a",), 4) == {0, 1, 2, 3}
    assert share_of("z", ("a", "b"), 4) == frozenset()  # not (yet) alive: no share


async def produce_in_two(url: str, between: Any) -> None:
    """The orders of ``shop.produce``, the second half sent once ``between()`` returned."""
    async with open_postgres(url) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_partitioned(
            shop.ORDERS,
            node="checkout",
            partitions=shop.PARTITIONS,
            partition_key=shop.customer_of,
            groups=("totals",),
            resumable=True,
        )
        writer = orders.writer()
        for i in range(1, N // 2 + 1):
            await writer.send(shop.order(i, CUSTOMERS), send_at=i)
        await writer.flush()
        await between()
        for i in range(N // 2 + 1, N + 1):
            await writer.send(shop.order(i, CUSTOMERS), send_at=i)
        await writer.finish()


def claimed_by(name: str) -> Any:
    return lambda seen: any(m == name and e == "claimed" for m, _, e in seen)


async def test_a_member_that_joins_gets_its_share_and_every_total_is_exact(postgres_url: str) -> None:
    events = Events()
    counts: dict[str, int] = {}

    async def run(name: str) -> None:
        counts[name] = await member(postgres_url, name, events)()

    async def second_member() -> None:  # a holds every partition, then b joins: a hands b its share
        await events.until(lambda seen: len([e for m, _, e in seen if m == "a" and e == "claimed"]) == 4)
        tg.start_soon(run, "b")
        await events.until(claimed_by("b"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a")
        await produce_in_two(postgres_url, second_member)
    assert await shop.totals(postgres_url) == expected()
    assert sum(counts.values()) == N and counts["b"] > 0  # every order once; b handled its share
    released = {p for m, p, e in events.seen if m == "a" and e == "released"}
    assert released == share_of("b", ("a", "b"), shop.PARTITIONS) == {1, 3}


def every_row(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the ledger at ``url``, in order: the database, to compare."""
    return {table: sorted(execute(url, f"SELECT * FROM {table}"), key=repr) for table in TABLES}


async def test_a_zombie_members_commit_is_refused_and_changes_nothing(postgres_url: str) -> None:
    await shop.produce(postgres_url, 40, CUSTOMERS)
    stream = "shop/checkout/orders"
    ref = StreamRef("shop", "checkout", "orders#0")
    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        claim = partial(_claim, stream=stream, group="totals", partitions=[0])
        execute(
            postgres_url,
            "INSERT INTO streamledger_members"
            " VALUES ('shop/checkout/orders', 'totals', 'old', now() + interval '1 min')",
        )
        [old] = await connection.call(partial(claim, owner="old"))
        assert old == PartitionLease(stream, "totals", 0, "old", 1)
        assert await connection.call(partial(claim, owner="new")) == []  # its owner is alive: no claim
        execute(postgres_url, "UPDATE streamledger_members SET expires_at = now() - interval '1 s'")
        [new] = await connection.call(partial(claim, owner="new"))  # its owner's row ran out
        assert new.token == 2
        zombie = PgStreamHooks(FencedConnection(connection, old))
        read = await ledger.backend.streams.read_stream(
            StreamRead(ref, type_name(shop.Order), ("totals",), 4)
        )
        assert read is not None and read.appended > 0
        message = MessageRef(ref, "totals", read.generation, 1)
        commit = MessageCommit(message=message, keyed=(KeyedWrite(b"s" + b"customer-0", b"\x07"),))
        before = every_row(postgres_url)
        with pytest.raises(LeaseLostError, match="'new' \\(claim 2\\) holds it now: nothing was confirmed"):
            await zombie.commit([commit])
        assert every_row(postgres_url) == before  # not a row of any table changed
        again = await ledger.backend.streams.read_stream(
            StreamRead(ref, type_name(shop.Order), ("totals",), 4)
        )
        assert again is not None and again.groups[0].acked_through == 0  # nothing changed
        await PgStreamHooks(FencedConnection(connection, new)).commit([commit])  # the holder's is taken


PARTITION_0 = StreamRef("shop", "checkout", "orders#0")


def add_member(url: str, name: str, expires: str) -> None:
    """A member row of group ``totals`` for ``name``, alive until ``now() + expires``."""
    execute(
        url,
        "INSERT INTO streamledger_members VALUES (%s, 'totals', %s, now() + %s::interval)",
        ("shop/checkout/orders", name, expires),
    )


async def read_partition_0(ledger: Any) -> Any:
    """Partition 0 of the shop's orders as group ``totals`` reads it (the connection keeps it then)."""
    return await ledger.backend.streams.read_stream(
        StreamRead(PARTITION_0, type_name(shop.Order), ("totals",), 4)
    )


@pytest.mark.parametrize("keyed", [(), (KeyedWrite(b"s" + b"customer-0", b"\x07"),)], ids=["plain", "keyed"])
async def test_a_lone_write_checks_its_lease_in_its_own_statement_and_a_zombies_changes_nothing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, keyed: tuple[KeyedWrite, ...]
) -> None:
    """A commit whose streams its connection kept is one statement, which checks the lease itself:
    no check beside it (the check is made to do nothing here, so only the statement can refuse), a
    zombie's refused with who holds the lease now, and not a row of any table changed. A keyed
    commit's values are parts of that statement too."""
    await shop.produce(postgres_url, 40, CUSTOMERS)
    add_member(postgres_url, "old", "-1 s")
    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        claim = partial(_claim, stream="shop/checkout/orders", group="totals", partitions=[0])
        [old] = await connection.call(partial(claim, owner="old"))
        [new] = await connection.call(partial(claim, owner="new"))  # old's row ran out: taken over
        read = await read_partition_0(ledger)  # the connection keeps the stream now
        assert read is not None
        checked: list[object] = []
        monkeypatch.setattr(PartitionLease, "check", lambda lease, conn: checked.append(lease))
        commit = MessageCommit(message=MessageRef(PARTITION_0, "totals", read.generation, 1), keyed=keyed)
        before = every_row(postgres_url)
        with pytest.raises(LeaseLostError, match="'new' \\(claim 2\\) holds it now: nothing was confirmed"):
            await PgStreamHooks(FencedConnection(connection, old)).commit([commit])
        assert every_row(postgres_url) == before and checked == []
        await read_partition_0(ledger)  # a failed call forgot what it kept: kept again
        await PgStreamHooks(FencedConnection(connection, new)).commit([commit])  # the holder's: alone
        again = await read_partition_0(ledger)
        assert again is not None and again.groups[0].acked_through == 1 and checked == []
        assert len(execute(postgres_url, "SELECT * FROM streamledger_keyed")) == len(keyed)


async def commit_together(
    commits: list[tuple[PartitionLease, MessageCommit]], connection: Any, monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    """Each commit under its lease, all made in one step of the event loop, so that they share one
    transaction (its batch's first attempt is seen to hold them all); what each raised (None: it landed)."""
    outcomes: list[Any] = [None] * len(commits)
    attempts: list[int] = []
    attempt = type(connection)._attempt

    def seen(self: Any, batch: list[Any]) -> None:
        attempts.append(len(batch))
        attempt(self, batch)

    async def one(i: int, lease: PartitionLease, commit: MessageCommit) -> None:
        try:
            await PgStreamHooks(FencedConnection(connection, lease)).commit([commit])
        except LeaseLostError as exc:
            outcomes[i] = exc

    with monkeypatch.context() as patched:
        patched.setattr(type(connection), "_attempt", seen)
        async with anyio.create_task_group() as tg:
            for i, (lease, commit) in enumerate(commits):
                tg.start_soon(one, i, lease, commit)
    assert attempts[0] == len(commits)  # they shared one transaction
    return outcomes


async def test_fenced_writes_sharing_a_transaction_each_check_their_lease_in_their_own_statement(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept commits under leases, gathered in one transaction: each write checks its lease itself
    (the check beside it does nothing here, so only the statements can refuse); zombies' change no
    row of any table, and the holder's land together, with no check beside them either."""
    await shop.produce(postgres_url, 40, CUSTOMERS)
    add_member(postgres_url, "old", "-1 s")
    partitions = [StreamRef("shop", "checkout", f"orders#{p}") for p in (0, 1)]
    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        claim = partial(_claim, stream="shop/checkout/orders", group="totals", partitions=[0, 1])
        old = await connection.call(partial(claim, owner="old"))
        new = await connection.call(partial(claim, owner="new"))  # old's row ran out: both taken over
        assert [lease.token for lease in new] == [2, 2]

        async def keep_both() -> list[MessageCommit]:
            commits = []
            for ref in partitions:
                read = await ledger.backend.streams.read_stream(
                    StreamRead(ref, type_name(shop.Order), ("totals",), 4)
                )
                assert read is not None and read.appended > 0
                commits.append(MessageCommit(message=MessageRef(ref, "totals", read.generation, 1)))
            return commits

        commits = await keep_both()
        checked: list[object] = []
        monkeypatch.setattr(PartitionLease, "check", lambda lease, conn: checked.append(lease))
        before = every_row(postgres_url)
        refused = await commit_together(list(zip(old, commits, strict=True)), connection, monkeypatch)
        assert [str(exc) for exc in refused] == [
            f"member 'old' lost its lease on partition {p} of shop/checkout/orders for group 'totals'"
            " (claim 1); 'new' (claim 2) holds it now: nothing was confirmed"
            for p in (0, 1)
        ]
        assert every_row(postgres_url) == before and checked == []
        commits = await keep_both()  # a failed call forgot what it kept: kept again
        assert await commit_together(list(zip(new, commits, strict=True)), connection, monkeypatch) == [
            None,
            None,
        ]
        assert checked == []
        for ref in partitions:
            again = await ledger.backend.streams.read_stream(
                StreamRead(ref, type_name(shop.Order), ("totals",), 4)
            )
            assert again is not None and again.groups[0].acked_through == 1


async def test_a_process_restarted_under_its_name_fences_the_one_before_it(postgres_url: str) -> None:
    """Its own lease is claimed again, its member row alive: the token rises, the earlier one is refused."""
    await shop.produce(postgres_url, 40, CUSTOMERS)
    add_member(postgres_url, "host:1", "1 min")
    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        claim = partial(_claim, stream="shop/checkout/orders", group="totals", owner="host:1", partitions=[0])
        [before] = await connection.call(claim)
        [after] = await connection.call(claim)  # the same name, alive: a restart of that process
        assert (before.token, after.token) == (1, 2)
        ref = StreamRef("shop", "checkout", "orders#0")
        read = await ledger.backend.streams.read_stream(
            StreamRead(ref, type_name(shop.Order), ("totals",), 4)
        )
        assert read is not None
        commit = MessageCommit(message=MessageRef(ref, "totals", read.generation, 1))
        with pytest.raises(LeaseLostError, match="'host:1' \\(claim 2\\) holds it now"):
            await PgStreamHooks(FencedConnection(connection, before)).commit([commit])
        await PgStreamHooks(FencedConnection(connection, after)).commit([commit])


async def test_a_member_started_after_the_writer_finished_handles_everything(postgres_url: str) -> None:
    await shop.produce(postgres_url, N, CUSTOMERS)
    events = Events()
    assert await member(postgres_url, "late", events)() == N
    assert await shop.totals(postgres_url) == expected()
    assert await member(postgres_url, "again", events)() == 0  # nothing left: nothing twice


async def test_inspect_shows_the_member_holding_each_partition_and_until_when(postgres_url: str) -> None:
    from .test_cli import cli

    await shop.produce(postgres_url, 40, CUSTOMERS)
    async with open_postgres(postgres_url) as ledger:
        claim = partial(_claim, stream="shop/checkout/orders", group="totals")
        await ledger.backend.connection.call(partial(claim, owner="host-a:41", partitions=[0, 2]))
        await ledger.backend.connection.call(partial(claim, owner="host-b:7", partitions=[1]))
    for name, alive in (("host-a:41", "1 min"), ("host-b:7", "-1 s")):  # b's row ran out
        execute(
            postgres_url,
            "INSERT INTO streamledger_members"
            " VALUES ('shop/checkout/orders', 'totals', %s, now() + %s::interval)",
            (name, alive),
        )
    rows = json.loads(cli("inspect", postgres_url, "--groups", "--json").stdout)
    owners = {r["partition"]: r["owner"] for r in rows}
    assert {p: o and (o["member"], o["expired"]) for p, o in owners.items()} == {
        "0/4": ("host-a:41", False),
        "1/4": ("host-b:7", True),
        "2/4": ("host-a:41", False),
        "3/4": None,  # nobody holds it
    }
    table = cli("inspect", postgres_url, "--groups").stdout.splitlines()
    assert table[0].split()[-1] == "OWNER"
    assert re.search(r"0/4  host-a:41 \(until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)$", table[1]), table[1]
    assert table[2].endswith("1/4  host-b:7 (lease expired)") and table[4].endswith("3/4  -")


class _LoseTheSession:
    """Ends the session of a member's third fenced transaction at its COMMIT (from the test's side).

    ``landed`` says whether the COMMIT reaches the server first (its answer is then lost with the
    session) or not (the server rolls the transaction back). Either way the member's ledger call
    raises ``OutcomeUnknownError``. Faults are wrapped around the named functions, in this process
    only: nothing in the library knows of them.
    """

    def __init__(self, url: str, *, landed: bool) -> None:
        self.url = url
        self.landed = landed
        self.checks = 0
        self.fenced: dict[int, int] = {}  # a connection whose open transaction checked a lease
        self.partition: int | None = None  # the partition of the transaction whose session ended

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import psycopg

        from ledger.postgres._pipelined import PipelinedTransaction

        check = PartitionLease.check
        leave = psycopg.Transaction.__exit__
        leave_pipelined = PipelinedTransaction.__exit__

        def counted_check(lease: PartitionLease, conn: Any) -> None:
            check(lease, conn)
            self.checks += 1
            if self.checks == 3:
                self.fenced[id(conn)] = lease.partition

        def lose_at_commit(tx: Any, kind: Any, exc: Any, tb: Any) -> bool:
            # a transaction of its own (psycopg's) or shared with other calls (in one pipeline)
            exit = leave_pipelined if isinstance(tx, PipelinedTransaction) else leave
            savepoint = getattr(tx, "savepoint_name", None)
            partition = None if savepoint else self.fenced.pop(id(tx.connection), None)
            if kind is not None or partition is None:
                return exit(tx, kind, exc, tb)
            self.partition = partition
            if self.landed:
                exit(tx, kind, exc, tb)  # committed; its answer is lost with the session below
                self.end(tx.connection)
                tx.connection.execute("SELECT 1")  # raises: the session is gone
                raise AssertionError("the session outlived pg_terminate_backend")
            self.end(tx.connection)
            return exit(tx, kind, exc, tb)  # its COMMIT meets the session gone

        monkeypatch.setattr(PartitionLease, "check", counted_check)
        monkeypatch.setattr(psycopg.Transaction, "__exit__", lose_at_commit)
        monkeypatch.setattr(PipelinedTransaction, "__exit__", lose_at_commit)

    def end(self, conn: Any) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as other:
            ended = other.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,))
            assert ended.fetchone() == (True,)


@pytest.mark.parametrize("landed", [False, True], ids=["rolled-back", "landed"])
async def test_a_member_whose_commit_is_lost_with_its_session_counts_the_partition_lost_and_goes_on(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """Its commit fails with OutcomeUnknownError (a process stopped in a transaction past the idle
    timeout, then continued, meets the same): it reports the partition lost and claims it again."""
    await shop.produce(postgres_url, N, CUSTOMERS)
    fault = _LoseTheSession(postgres_url, landed=landed)
    fault.install(monkeypatch)
    events = Events()
    handled = await member(postgres_url, "a", events)()
    lost = fault.partition
    assert lost is not None
    mine = [(p, e) for m, p, e in events.seen if m == "a" and p == lost]
    assert mine[:3] == [(lost, "claimed"), (lost, "lost"), (lost, "claimed")]  # then handled to its end
    assert (lost, "done") in mine
    assert await shop.totals(postgres_url) == expected()  # nothing twice, nothing left out
    if not landed:  # what the lost transaction held was handled again, once
        assert handled == N


@pytest.mark.parametrize("where", ["idle", "pipeline"])
async def test_a_session_stuck_in_a_transaction_holding_a_lease_row_is_ended_once_its_owner_ran_out(
    postgres_url: str, where: str
) -> None:
    """PostgreSQL ends no session waiting for its client in the middle of a pipeline, nor one idle in a
    transaction whose last message was a Flush (psycopg ends every pipeline with one): a member
    stopped there would hold its lease row, and its partition, for as long as it is stopped."""
    import psycopg

    from ledger.postgres._members import end_stuck_sessions

    await shop.produce(postgres_url, 40, CUSTOMERS)
    stream = "shop/checkout/orders"
    execute(
        postgres_url,
        "INSERT INTO streamledger_members VALUES (%s, 'totals', 'old', now() + interval '1 min')",
        (stream,),
    )
    lock = "SELECT token FROM streamledger_partition_leases WHERE partition = 0 FOR SHARE"
    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        claim = partial(_claim, stream=stream, group="totals", partitions=[0], idle_seconds=0)
        [old] = await connection.call(partial(claim, owner="old"))
        stuck = psycopg.connect(postgres_url)
        with contextlib.ExitStack() as stack:
            if where == "idle":  # a session the server's idle timeout does not end
                stuck.execute("SET idle_in_transaction_session_timeout = 0")
                stuck.commit()
                stuck.execute(lock).fetchall()
            else:  # sent, with no Sync after it: the server waits for the rest of the pipeline
                stack.enter_context(pytest.raises(psycopg.OperationalError))
                stack.enter_context(stuck.pipeline())
                stuck.execute(lock)
            ending = partial(end_stuck_sessions, stream=stream, group="totals", partition=0, idle_seconds=0)
            assert await connection.call(ending) == 0  # its owner is alive: it holds the partition
            execute(postgres_url, "UPDATE streamledger_members SET expires_at = now() - interval '1 s'")
            [new] = await connection.call(partial(claim, owner="new"))  # ends the stuck session first
            assert (old.token, new.token) == (1, 2)
            if where == "idle":
                with pytest.raises(psycopg.OperationalError):
                    stuck.execute("SELECT 1")
        stuck.close()
