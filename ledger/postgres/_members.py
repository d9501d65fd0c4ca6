"""Group members: processes, on any machines, that share one consumer group of a partitioned stream.

``await consume(url, key, handler, scope=, node=, partitions=, group=)`` is
one member. It joins the group (a row of ``streamledger_members`` it keeps
alive), and claims the partitions that are its share under leases (rows of
``streamledger_partition_leases``, each valid while its owner's member row
is): partition ``p`` is the share of the ``p % M``-th of the ``M`` live
members, in the order of their names. It follows each partition it holds
(:func:`streams.follow_stream`: the writer may be any other process) and
handles it with ``handle_messages``, as a process handling its own stream
would: each message's ack, state, keyed state and budgets confirmed in one
transaction.

Every transaction a member makes for a partition first reads its lease
row ``FOR SHARE`` and refuses to go on unless the token is still its own
(:class:`~ledger.LeaseLostError`), as a worker's writes for its run do
(:mod:`ledger.postgres._leases`): a member paused or cut off past its
lease (a zombie) can confirm nothing once another took the partition over,
so nothing is applied twice. A member whose transaction on a partition
failed with its session (stopped inside it past the server's
``idle_in_transaction_session_timeout``, cut off, the server restarted)
confirmed nothing it had not confirmed before, whatever that transaction
was: it counts the partition lost, as when it finds the lease taken over,
and goes on, claiming it again if it is still its share and no live member
holds it (:data:`LOST_WITH_ITS_SESSION`).

Its transactions are repeatable read, on two connections: one for the
records it confirms, one for its rows, its leases and its reads of the
partitions. Serializable transactions of members of different partitions
aborted each other, PostgreSQL's predicate locks covering whole pages;
repeatable read is enough, as every write of a group's state on a
partition also writes its frontier row (the members' commits and
failures, the operators' moves and removals), where two writers always
meet and the later is aborted (docs/postgres.md).

Every third of the lease, a member renews its row (and with it its
leases), reads who is alive and which leases it still holds, gives up the
partitions no longer its share (it stops handling them first) and claims
the free ones that are (given up, or held by a member whose row ran out).
So when a member joins, the others hand it its share; when one dies or
stops renewing, the others take its partitions over within a lease and a
third. A member short of its share, or holding none while it waits for
the group to be done, looks again every second.

A member hears of each commit to a partition it follows, and of the
opening of a partition it waits for, from the server
(:mod:`ledger.postgres._notify`: one listening connection a member) and
reads the partition then. While its listener is away (the only time a
notification is lost) it reads anyway every ``poll_seconds``
(:data:`DEFAULT_POLL_SECONDS`); while it listens, every
:data:`~ledger.postgres._notify.LISTENING_POLL_SECONDS`. So an idle group
costs its members' renewals, a third of a lease apart, and nothing else.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, Final, TypeVar

import anyio
import anyio.abc
import msgspec
import psycopg

from streams import (
    Backoff,
    CompactedHistoryError,
    Key,
    KeyedState,
    StaleGenerationError,
    Stream,
    StreamReader,
    StreamRef,
    UnknownStreamError,
    follow_stream,
    handle_messages,
)
from streams.store import StreamRead, partition_name, qualified_type_name, single_error, type_name

from .._errors import LeaseLostError, LedgerUnreachableError, OutcomeUnknownError
from ._faults import find_cause
from ._leases import STUCK_ON_ITS_CLIENT, FencedConnection, held_or_lost, lost_error
from ._notify import Listener, Wakeup, open_listener, opened_topic, stream_topic
from ._store import IDLE_IN_TRANSACTION_SECONDS, RECONNECT_SECONDS, PgConnection, connected
from ._streams import PgStreamHooks
from ._view import PgView

__all__ = ["MemberReport", "PartitionLease", "consume", "print_member_report"]

T = TypeVar("T")

DEFAULT_LEASE_SECONDS: Final = 10.0
#: How long a member whose listener is away waits before it reads an idle partition anyway
#: (seconds): the bound on how late a lost notification makes a message.
DEFAULT_POLL_SECONDS: Final = 1.0
#: How often a member short of its share looks again, at most (seconds): a partition handed over
#: is claimed within it.
UNSETTLED_SECONDS: Final = 1.0

#: A member's report of what it did with a partition: (partition, event), the event one of
#: "claimed", "released" (its share changed), "lost" (its lease was taken over, or its session
#: ended inside a transaction there) or "done" (the writer's end is confirmed and the group handled
#: every message of the partition).
MemberReport = Callable[[int, str], None]

#: What ends a partition's handling when the member can confirm nothing more there, and so counts
#: the partition lost rather than failing: its lease was taken over (``LeaseLostError``); its
#: session ended inside a commit, so whether it landed is for the ledger to say
#: (``OutcomeUnknownError``: a process stopped in a transaction past the server's idle timeout, a
#: connection cut, a server restarted); the server stayed away past ``reconnect_seconds``
#: (``LedgerUnreachableError``: the member's next renewal then decides whether it goes on); or the
#: group was confirmed past what it reads (``CompactedHistoryError``: another member handled those
#: messages while this one was away). In each, what its handling had not confirmed was never
#: published (acks, state and keyed state are published only after their commit), and a new claim
#: follows the partition again from what the ledger holds.
LOST_WITH_ITS_SESSION: Final = (
    LeaseLostError,
    OutcomeUnknownError,
    LedgerUnreachableError,
    CompactedHistoryError,
)


def print_member_report(partition: int, event: str) -> None:
    """A report as one line on standard output: ``partition P: EVENT``."""
    print(f"partition {partition}: {event}", flush=True)


class PartitionLease(msgspec.Struct, frozen=True):
    """A member's claim on one partition of a group: valid while its lease row holds this token."""

    stream: str
    group: str
    partition: int
    owner: str
    token: int

    def check(self, conn: Any) -> None:
        """Refuse to go on unless this lease still holds its partition (locks the row until the end)."""
        row = conn.execute(
            "SELECT owner, token FROM streamledger_partition_leases"
            " WHERE stream = %s AND grp = %s AND partition = %s FOR SHARE",
            (self.stream, self.group, self.partition),
        ).fetchone()
        held_or_lost(row, self.token, self._lost)

    def lease_row(self) -> tuple[str, tuple[object, ...]]:
        """The lease's row for a write statement to check (:class:`~ledger.postgres._view.StatementFence`)."""
        return _PARTITION_LEASE_ROW, (self.stream, self.group, self.partition)

    def lost(self, holder: tuple[str, int] | None) -> Exception:
        return lost_error(holder, self.token, self._lost)

    @property
    def _lost(self) -> str:
        lost = f"member {self.owner!r} lost its lease on partition {self.partition} of {self.stream}"
        return f"{lost} for group {self.group!r}"


_PARTITION_LEASE_ROW: Final = (
    "SELECT owner, token FROM streamledger_partition_leases"
    " WHERE stream = %b::text AND grp = %b::text AND partition = %b::int FOR SHARE"
)


class _Tick(msgspec.Struct, frozen=True):
    """What a member learns renewing: who is alive, the tokens of its leases, which others hold."""

    live: tuple[str, ...]
    mine: dict[int, int]
    held_by_others: frozenset[int]


def _renew(view: PgView, *, stream: str, group: str, owner: str, seconds: float) -> _Tick:
    conn = view.connection
    conn.execute(
        "INSERT INTO streamledger_members (stream, grp, member, expires_at)"
        " VALUES (%s, %s, %s, now() + make_interval(secs => %s))"
        " ON CONFLICT (stream, grp, member) DO UPDATE SET expires_at = EXCLUDED.expires_at",
        (stream, group, owner, seconds),
    )
    mine = conn.execute(
        "SELECT partition, token FROM streamledger_partition_leases"
        " WHERE stream = %s AND grp = %s AND owner = %s",
        (stream, group, owner),
    ).fetchall()
    live = conn.execute(
        "SELECT member FROM streamledger_members WHERE stream = %s AND grp = %s AND expires_at > now()"
        " ORDER BY member",
        (stream, group),
    ).fetchall()
    others = conn.execute(
        "SELECT l.partition FROM streamledger_partition_leases l JOIN streamledger_members m"
        " ON m.stream = l.stream AND m.grp = l.grp AND m.member = l.owner"
        " WHERE l.stream = %s AND l.grp = %s AND l.owner <> %s AND m.expires_at > now()",
        (stream, group, owner),
    ).fetchall()
    return _Tick(
        tuple(row[0] for row in live),
        {row[0]: row[1] for row in mine},
        frozenset(row[0] for row in others),
    )


#: A claim takes a partition no lease holds, one whose owner's row ran out, or one its own name
#: holds (a process restarted under the same name: the claim fences the one before it).
_CLAIM: Final = """
INSERT INTO streamledger_partition_leases AS l (stream, grp, partition, owner, token)
VALUES (%(stream)s, %(grp)s, %(partition)s, %(owner)s, 1)
ON CONFLICT (stream, grp, partition) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1
WHERE l.owner = EXCLUDED.owner OR NOT EXISTS (
    SELECT 1 FROM streamledger_members m
    WHERE m.stream = l.stream AND m.grp = l.grp AND m.member = l.owner AND m.expires_at > now()
)
RETURNING token
"""


#: Ends the session of a member stuck (:data:`~._leases.STUCK_ON_ITS_CLIENT`) inside a transaction
#: holding a partition's lease row, once its owner's row ran out. The locking transaction is the one
#: whose id is the row's ``xmax``; ending its session rolls it back, as the server's timeout would have.
_END_STUCK: Final = f"""
SELECT pg_terminate_backend(a.pid, 1000)
FROM streamledger_partition_leases l JOIN pg_stat_activity a ON a.backend_xid = l.xmax
WHERE l.stream = %(stream)s AND l.grp = %(grp)s AND l.partition = %(partition)s
  AND {STUCK_ON_ITS_CLIENT}
  AND NOT EXISTS (
    SELECT 1 FROM streamledger_members m
    WHERE m.stream = l.stream AND m.grp = l.grp AND m.member = l.owner AND m.expires_at > now()
  )
"""


def _stream_id(view: PgView, *, ref: StreamRef) -> int | None:
    """The id of stream ``ref`` (what the notifications of its commits carry), or None if it has none."""
    row = view.connection.execute(
        "SELECT id FROM streamledger_streams WHERE scope = %s AND node = %s AND key = %s",
        (ref.scope, ref.node, ref.key),
    ).fetchone()
    return None if row is None else int(row[0])


def end_stuck_sessions(view: PgView, *, stream: str, group: str, partition: int, idle_seconds: float) -> int:
    """End the sessions stuck holding ``partition``'s lease row (:data:`_END_STUCK`); how many."""
    params = {"stream": stream, "grp": group, "partition": partition, "idle": idle_seconds}
    return len(view.connection.execute(_END_STUCK, params).fetchall())


def _claim(
    view: PgView,
    *,
    stream: str,
    group: str,
    owner: str,
    partitions: list[int],
    idle_seconds: float = IDLE_IN_TRANSACTION_SECONDS,
) -> list[PartitionLease]:
    """Claim each of ``partitions`` that no live member holds; the leases won.

    A session stuck idle in a transaction for more than ``idle_seconds``
    that holds a partition's lease row, for an owner whose row ran out, is
    ended first (:data:`_END_STUCK`).
    """
    won: list[PartitionLease] = []
    for partition in partitions:
        end_stuck_sessions(view, stream=stream, group=group, partition=partition, idle_seconds=idle_seconds)
        params = {"stream": stream, "grp": group, "partition": partition, "owner": owner}
        row = view.connection.execute(_CLAIM, params).fetchone()
        if row is not None:
            won.append(PartitionLease(stream, group, partition, owner, row[0]))
    return won


def _release(view: PgView, *, leases: list[PartitionLease]) -> None:
    for lease in leases:
        view.connection.execute(
            "DELETE FROM streamledger_partition_leases"
            " WHERE stream = %s AND grp = %s AND partition = %s AND token = %s",
            (lease.stream, lease.group, lease.partition, lease.token),
        )


def _leave(view: PgView, *, stream: str, group: str, owner: str) -> None:
    view.connection.execute(
        "DELETE FROM streamledger_members WHERE stream = %s AND grp = %s AND member = %s",
        (stream, group, owner),
    )


def share_of(owner: str, live: tuple[str, ...], partitions: int) -> frozenset[int]:
    """The partitions that are ``owner``'s share when ``live`` (in name order) are the live members."""
    if owner not in live:
        return frozenset()
    index, count = live.index(owner), len(live)
    return frozenset(p for p in range(partitions) if p % count == index)


class _Held:
    """A partition this member handles: its lease, the scope that stops its handling, how it ended."""

    def __init__(self, lease: PartitionLease) -> None:
        self.lease = lease
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()
        self.outcome = ""  # "done" or "lost" once its handling returned by itself


class _Member:
    """One member's partitions, and the rounds in which it renews, gives up and claims them."""

    def __init__(
        self,
        connection: PgConnection,
        coordination: PgConnection,
        listener: Listener,
        key: Key[Stream[Any]],
        handler: Callable[..., Any],
        options: dict[str, Any],
        *,
        scope: str,
        node: str,
        partitions: int,
        group: str,
        owner: str,
        lease_seconds: float,
        poll_seconds: float,
        report: MemberReport,
    ) -> None:
        self.connection = connection  # the ledger's records: serializable, each partition's fenced
        self.coordination = coordination  # the members' rows and leases, the polls: repeatable read
        self.reads = PgStreamHooks(coordination)
        self.listener = listener  # the server's notifications of commits to the partitions
        self.key = key
        self.handler = handler
        self.options = options  # handle_messages' own
        self.scope = scope
        self.node = node
        self.partitions = partitions
        self.group = group
        self.owner = owner
        self.stream = str(StreamRef(scope=scope, node=node, key=key.name))
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.report = report
        self.handled = 0
        self.held: dict[int, _Held] = {}
        self.done: set[int] = set()
        self.settled = False  # it holds its whole share (or handled it)

    async def run(self, until_done: bool) -> None:
        # join, then wait a moment before taking a share: members started together (a deployment)
        # each take theirs at once, instead of the first taking every partition and handing most
        # of them over (Kafka's group.initial.rebalance.delay.ms is the same idea)
        await self.renew()
        await anyio.sleep(min(self.lease_seconds / 3, UNSETTLED_SECONDS))
        with single_error():
            async with anyio.create_task_group() as tg:
                while not (await self.round(tg) and until_done):
                    # a member short of its share, or holding none while it waits for the end,
                    # looks again soon: partitions are being handed over to it, or the last ones
                    # finished
                    wait = self.lease_seconds / 3
                    if not self.settled or (until_done and not self.held):
                        wait = min(wait, UNSETTLED_SECONDS)
                    with anyio.move_on_after(wait):
                        await _any_stopped(self.held)
                tg.cancel_scope.cancel()

    async def renew(self) -> _Tick:
        """Renew this member's row (and so its leases); who is alive, and which leases it holds."""
        return await self.coordination.call(
            partial(
                _renew, stream=self.stream, group=self.group, owner=self.owner, seconds=self.lease_seconds
            ),
            idempotent=True,
        )

    async def round(self, tg: anyio.abc.TaskGroup) -> bool:
        """Renew, give up what is no longer this member's, claim its share; whether all is done."""
        tick = await self.renew()
        ended = [part for part in self.held.values() if part.stopped.is_set()]
        finished = [part for part in ended if part.outcome == "done"]
        self.done.update(part.lease.partition for part in finished)
        await self.give_up(finished, "done")
        for part in ended:
            if part.outcome != "done":  # lost: its lease is another member's
                self.forget(part, "lost")
        lost = [part for p, part in self.held.items() if tick.mine.get(p) != part.lease.token]
        await _stop(lost)  # they could confirm nothing more: their leases are gone
        for part in lost:
            self.forget(part, "lost")
        share = share_of(self.owner, tick.live, self.partitions)
        surplus = [part for p, part in self.held.items() if p not in share]
        await _stop(surplus)
        await self.give_up(surplus, "released")
        taken = self.held.keys() | self.done | tick.held_by_others
        wanted = sorted(share - taken)
        if wanted:
            # a claim run twice is one claim (a lease its name holds is claimed again): one whose
            # commit was lost with its session runs again, rather than failing the member
            won = await self.coordination.call(
                partial(_claim, stream=self.stream, group=self.group, owner=self.owner, partitions=wanted),
                idempotent=True,
            )
            for lease in won:
                part = self.held[lease.partition] = _Held(lease)
                self.report(lease.partition, "claimed")
                tg.start_soon(self.handle, part)
        self.settled = share <= self.held.keys() | self.done
        return len(self.done) == self.partitions or (not self.held and await self.all_done())

    def forget(self, part: _Held, event: str) -> None:
        del self.held[part.lease.partition]
        self.report(part.lease.partition, event)

    async def give_up(self, parts: list[_Held], event: str) -> None:
        if parts:
            given = [part.lease for part in parts]
            await self.coordination.call(partial(_release, leases=given), idempotent=True)
            for part in parts:
                self.forget(part, event)

    async def leave(self) -> None:
        """Give up every lease and the member's row (shielded: the block may be cancelled)."""
        with anyio.CancelScope(shield=True):
            mine = [part.lease for part in self.held.values()]
            try:
                await self.coordination.call(partial(_release, leases=mine), idempotent=True)
                await self.coordination.call(
                    partial(_leave, stream=self.stream, group=self.group, owner=self.owner), idempotent=True
                )
            except Exception:  # the server is away: the rows run out there
                pass

    async def handle(self, part: _Held) -> None:
        """Handle one partition under its lease until it is done, the lease is lost or it is stopped."""
        index = part.lease.partition
        ref = StreamRef(scope=self.scope, node=self.node, key=partition_name(self.key.name, index))
        try:
            with part.scope:
                while True:
                    with self.listener.watching(opened_topic(str(ref))) as opened:  # before it reads
                        stream_id = await self.coordination.call(
                            partial(_stream_id, ref=ref), idempotent=True
                        )
                        if stream_id is None:  # the writer has not opened it yet: look again once it did
                            await opened.wait(self.poll_seconds)
                            continue
                    with self.listener.watching(stream_topic(stream_id)) as wakeup:  # before it reads
                        if await self.follow(part, wakeup):
                            return
                        # the writer reopened the stream, or its group is not there yet: follow it
                        # again (at once if a commit to it was told since)
                        await wakeup.wait(self.poll_seconds)
        finally:
            part.stopped.set()

    async def follow(self, part: _Held, wakeup: Wakeup) -> bool:
        """Follow and handle the partition, woken by ``wakeup``; whether that ended its handling here."""
        hooks = PgStreamHooks(FencedConnection(self.connection, part.lease))
        try:
            async with follow_stream(
                hooks,
                self.key,
                scope=self.scope,
                node=self.node,
                group=self.group,
                partition=(part.lease.partition, self.partitions),
                poll_seconds=self.poll_seconds,
                reads=self.reads,  # what is confirmed, read beside the commits
                wakeups=wakeup,
            ) as reader:
                start = _acked(reader)
                try:
                    await handle_messages(reader, self.handler, **self.options)
                finally:  # what it confirmed, however it stopped
                    self.handled += _acked(reader) - start
            part.outcome = "done"
            return True
        except Exception as exc:
            if _lost_with_its_session(exc):
                part.outcome = "lost"  # it confirmed nothing more: claimed again if its share
                return True
            if find_cause(exc, StaleGenerationError) is None and not isinstance(exc, UnknownStreamError):
                raise
            return False

    async def all_done(self) -> bool:
        """Whether every partition's end is confirmed and the group handled all of it."""
        for p in range(self.partitions):
            ref = StreamRef(scope=self.scope, node=self.node, key=partition_name(self.key.name, p))
            request = StreamRead(
                ref,
                type_name(self.key.item_type),
                (self.group,),
                self.partitions,
                legacy_type_name=qualified_type_name(self.key.item_type),
            )
            read = await self.reads.read_stream(request)
            if read is None or not read.finished or read.groups[0].acked_through < read.appended:
                return False
        return True


async def consume(
    url: str,
    key: Key[Stream[T]],
    handler: Callable[..., Any],
    *,
    scope: str,
    node: str,
    partitions: int,
    group: str,
    keyed: KeyedState[Any, Any] | None = None,
    attempts: int = 1,
    backoff: Backoff | None = None,
    owner: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    until_done: bool = True,
    report: MemberReport = print_member_report,
    reconnect_seconds: float = RECONNECT_SECONDS,
) -> int:
    """Be a member of ``group`` on the partitioned stream ``key`` until it is done; the messages it handled.

    The stream is the one a writer opened with ``scope.open_partitioned(key,
    node=node, partitions=partitions, groups=(..., group, ...))`` in scope
    ``scope``, in any process. ``handler(tx, value)``, ``keyed``,
    ``attempts`` and ``backoff`` are ``handle_messages``' own. ``owner``
    names the member (default host and pid); members of one group need
    distinct names. With ``until_done`` (the default) it returns once the
    writer's end is confirmed on every partition and the group handled them
    all; else it runs until cancelled. A handler's error that exhausts a
    message's budget is raised, as ``handle_messages`` raises it.

    A member reads a partition it holds as soon as the server notifies it
    of a commit there, and, while it has nothing to hand out, at least every
    ``poll_seconds`` while its listening connection is away (the bound a
    lost notification makes it late by).
    """
    if lease_seconds <= 0 or poll_seconds <= 0:
        raise ValueError("lease_seconds and poll_seconds must be positive")
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions is a number of partitions, at least 1, not {partitions!r}")
    async with (
        _connection(url, reconnect_seconds) as records,
        _connection(url, reconnect_seconds) as coordination,
        open_listener(url) as listener,
    ):
        member = _Member(
            records,
            coordination,
            listener,
            key,
            handler,
            {"keyed": keyed, "attempts": attempts, "backoff": backoff},
            scope=scope,
            node=node,
            partitions=partitions,
            group=group,
            owner=owner or f"{socket.gethostname()}:{os.getpid()}",
            lease_seconds=lease_seconds,
            poll_seconds=poll_seconds,
            report=report,
        )
        try:
            await member.run(until_done)
        finally:
            await member.leave()
    return member.handled


def _lost_with_its_session(exc: BaseException) -> bool:
    """Whether a partition's handling ended with :data:`LOST_WITH_ITS_SESSION` (the engine may wrap it)."""
    return any(find_cause(exc, kind) is not None for kind in LOST_WITH_ITS_SESSION)


def _acked(reader: StreamReader[Any]) -> int:
    """How many messages of the stream ``reader``'s group has acknowledged, as this process knows."""
    snapshot = reader.stream.snapshot()
    return snapshot.appended - snapshot.groups[0].pending


def _connection(url: str, reconnect_seconds: float) -> AbstractAsyncContextManager[PgConnection]:
    """A connection of a member, repeatable read (docs/postgres.md says why that is enough).

    Serializable, members of different partitions would abort each other:
    PostgreSQL keeps a transaction's predicate locks per page once it reads
    more than a few rows of it, and pages hold the rows of every partition.
    """
    return connected(
        PgConnection(
            url, reconnect_seconds=reconnect_seconds, isolation=psycopg.IsolationLevel.REPEATABLE_READ
        )
    )


async def _stop(parts: list[_Held]) -> None:
    for part in parts:
        part.scope.cancel()
    for part in parts:
        await part.stopped.wait()


async def _any_stopped(held: dict[int, _Held]) -> None:
    """Until a partition's handling stopped (it is done, or lost): the member looks again then."""
    parts = list(held.values())
    if not parts:
        await anyio.sleep(math.inf)
    async with anyio.create_task_group() as tg:

        async def wait(part: _Held) -> None:
            await part.stopped.wait()
            tg.cancel_scope.cancel()

        for part in parts:
            tg.start_soon(wait, part)
