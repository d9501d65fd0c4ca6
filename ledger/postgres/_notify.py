"""Wake-ups without polling: the server's notifications of commits, read on the event loop.

A transaction that appends to a stream, or changes what its followers must
see (finishes it, fails it, reopens it, changes its groups), sends
``pg_notify('streamledger', <stream id>)`` inside its one write statement
(:mod:`ledger.postgres._view`); one that makes a run due for a worker
(submits it, gives its lease up while it is still running) sends
:data:`RUNS`, a cancellation :func:`cancelled_topic`, and the making of a
stream's row :func:`opened_topic` (for members waiting for its writer). PostgreSQL
delivers a notification only once its transaction committed, so a
rolled-back write wakes nobody.

A :class:`Listener` is one autocommit connection that ``LISTEN``\\s on the
channel, made in a worker thread and then read on the event loop: it waits
for its socket to be readable (``anyio.wait_readable``), reads what arrived
(``PGconn.consume_input``) and sets the :class:`Wakeup` of every waiter on
each notification's payload (a stream id, or one of the names above). No
thread waits, on asyncio or on trio.

A notification is a hint, never the record: a waiter woken reads the
ledger. The server tells a listening session of every commit that
notified, so a notification is lost only while the listener has no
connection, and an idle waiter costs no reads while it listens: its wait
is bounded by :data:`LISTENING_POLL_SECONDS` then, and by its own poll
(``poll_seconds``) only while the listener is away. When its connection
breaks (the server restarted, the session was ended), the listener wakes
every waiter (they poll from then on), connects again with a bounded,
jittered backoff and wakes every waiter once it listens again, so they
read what was committed meanwhile. TCP keepalives find a connection whose
server went silent; the longer bound covers the time they take.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import psycopg
import psycopg.pq

__all__ = [
    "CHANNEL",
    "RUNS",
    "Listener",
    "Wakeup",
    "cancelled_topic",
    "open_listener",
    "opened_topic",
    "stream_topic",
]

#: The channel every notification of a ledger goes on (databases apart never hear each other's; the
#: ledgers of two schemas of one database do, and only read for nothing).
CHANNEL: Final = "streamledger"
#: The payload of a change a worker waiting for a due run may care about.
RUNS: Final = "runs"

#: How long a waiter waits for a notification while its listener listens (seconds), whatever its
#: own poll: the bound for a connection gone silent that keepalives have not noticed yet.
LISTENING_POLL_SECONDS: Final = 30.0
#: The first wait before connecting again, and the longest (seconds); each failed attempt doubles it.
FIRST_BACKOFF_SECONDS: Final = 0.05
MAX_BACKOFF_SECONDS: Final = 5.0
#: libpq's TCP keepalives on the listener's connection: a server gone silent (a host that vanished,
#: a cut link) is noticed within about ``idle + interval * count`` seconds, and the listener connects
#: again, waking its waiters.
KEEPALIVES: Final = "keepalives=1 keepalives_idle=10 keepalives_interval=5 keepalives_count=3"


def stream_topic(stream_id: int) -> str:
    """The payload of a commit to the stream of id ``stream_id`` (its row of ``streamledger_streams``)."""
    return str(stream_id)


def opened_topic(ref: str) -> str:
    """The payload of the opening of stream ``ref`` (its row made): a follower waiting for it reads it.

    A digest of the name, so any name fits a notification's payload.
    """
    return "opened " + hashlib.blake2b(ref.encode(), digest_size=12).hexdigest()


def cancelled_topic(run_id: str) -> str:
    """The payload of the cancellation of run ``run_id``: the worker holding it stops it at once."""
    return f"cancelled {run_id}"


class Wakeup:
    """One waiter's interest in a topic: set by each notification of it, and when the listener reconnects.

    A :class:`streams.Wakeups`: :meth:`wait` returns once a notification
    arrived since the last :meth:`wait` returned (or since it was made), or
    after its bound: ``seconds`` while the listener is away,
    :data:`LISTENING_POLL_SECONDS` (or ``seconds`` if longer) while it listens.
    """

    __slots__ = ("_event", "_listener", "topic")

    def __init__(self, topic: str, listener: Listener) -> None:
        self.topic = topic
        self._listener = listener
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        """Whether a notification arrived that no :meth:`wait` has returned for yet."""
        return self._event.is_set()

    def bound(self, seconds: float, due: float | None = None) -> float:
        """How long :meth:`wait` waits at most for a notification: see :meth:`wait`."""
        bound = max(seconds, LISTENING_POLL_SECONDS) if self._listener.listening else seconds
        return bound if due is None else max(0.0, min(bound, due))

    async def wait(self, seconds: float, *, due: float | None = None) -> None:
        """Until a notification since the last return (at once if one came meanwhile), or the bound.

        The bound is ``seconds`` while the listener is away, longer while it
        listens (a connection break ends the wait); ``due``, if given, caps
        it: the seconds until something falls due that no notification
        tells of (a lease running out).
        """
        if self._event.is_set():
            await anyio.lowlevel.checkpoint()
        else:
            with anyio.move_on_after(self.bound(seconds, due)):
                await self._event.wait()
        if self._event.is_set():
            self._event = anyio.Event()


class Listener:
    """One connection listening for a ledger's notifications, and the waiters each one wakes.

    Made by :func:`open_listener`, which runs it in a task of its own.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._waiting: dict[str, set[Wakeup]] = {}
        #: Connections made, notifications read, and whether it listens now (for tests and benches).
        self.connections = 0
        self.notifications = 0
        self.listening = False
        #: The backend pid of its connection while it listens (a test ends that session).
        self.backend_pid: int | None = None
        #: Why its last connection ended, or its last attempt failed (None while all is well).
        self.last_error: psycopg.Error | None = None

    @contextmanager
    def watching(self, topic: str) -> Iterator[Wakeup]:
        """A :class:`Wakeup` set by every notification of ``topic`` while the block runs."""
        wakeup = Wakeup(topic, self)
        waiters = self._waiting.setdefault(topic, set())
        waiters.add(wakeup)
        try:
            yield wakeup
        finally:
            waiters.discard(wakeup)
            if not waiters:
                del self._waiting[topic]

    def _wake(self, topic: str) -> None:
        for wakeup in self._waiting.get(topic, ()):
            wakeup.set()

    def _wake_all(self) -> None:
        for waiters in self._waiting.values():
            for wakeup in waiters:
                wakeup.set()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, connecting again whenever the connection breaks.

        ``task_status`` is told once the first attempt listens or failed:
        waiters made before then count what their first read does not see.
        """
        started = False
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            try:
                conn = await self._connect()
            except psycopg.Error as exc:  # the server is away: its waiters poll until it is back
                self.last_error = exc
            else:
                try:
                    self.listening, self.last_error = True, None
                    backoff = FIRST_BACKOFF_SECONDS
                    self._wake_all()  # whatever was committed while nobody listened is read again
                    if not started:
                        task_status.started()
                        started = True
                    await self._read(conn)
                except psycopg.Error as exc:  # the connection broke: connect again
                    self.last_error = exc
                finally:
                    self.listening, self.backend_pid = False, None
                    self._wake_all()  # their waits were bounded for a listener: they poll from now on
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(conn.close)
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(random.uniform(backoff / 2, backoff))
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def _connect(self) -> Any:
        """A new connection that listens on :data:`CHANNEL` (made in a worker thread)."""
        made: list[Any] = []

        def connect() -> None:
            conn = psycopg.connect(_with_keepalives(self.url), autocommit=True)
            made.append(conn)
            conn.execute(f"LISTEN {CHANNEL}")

        try:
            await anyio.to_thread.run_sync(connect)
        except BaseException:  # failed, or cancelled while it connected: close what it made
            with anyio.CancelScope(shield=True):
                for conn in made:
                    await anyio.to_thread.run_sync(conn.close)
            raise
        conn = made[0]
        self.connections += 1
        self.backend_pid = conn.info.backend_pid
        return conn

    async def _read(self, conn: Any) -> None:
        """Wake the waiters of each notification that arrives, until the connection breaks (raises)."""
        pgconn = conn.pgconn
        self._drain(pgconn)
        while True:
            await anyio.wait_readable(conn.fileno())
            pgconn.consume_input()  # psycopg.OperationalError once the server closed the connection
            self._drain(pgconn)
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listening connection broke")

    def _drain(self, pgconn: psycopg.pq.abc.PGconn) -> None:
        while (notify := pgconn.notifies()) is not None:
            self.notifications += 1
            self._wake(notify.extra.decode(errors="replace"))  # another program may use the channel


def _with_keepalives(url: str) -> str:
    """``url`` with :data:`KEEPALIVES`, unless it sets keepalives itself."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    for pair in KEEPALIVES.split():
        name, value = pair.split("=")
        params.setdefault(name, value)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


@asynccontextmanager
async def open_listener(url: str) -> AsyncIterator[Listener]:
    """A :class:`Listener` of the ledger at ``url``, listening (or trying to) for the block."""
    listener = Listener(url)
    async with anyio.create_task_group() as tg:
        await tg.start(listener.serve)
        try:
            yield listener
        finally:
            tg.cancel_scope.cancel()
