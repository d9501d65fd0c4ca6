"""Group commit, one shape for both backends: a ticket per write, a batch per transaction, an answer.

Each backend gives the :class:`GroupCommitter` one function, run on a writer
thread of the committer's own: it commits a :class:`Batch` of writes in one
transaction (LMDB: one write transaction and one fsync; PostgreSQL: one
serializable transaction and one WAL flush) and returns its :class:`Answer`,
one outcome per write. The committer gathers the writes, hands the writer
thread one batch at a time and answers each :class:`WriteTicket` once its
transaction is over, so the event loop never waits on the store and no task
sits between a write and its commit.

**When a batch is handed over.** The writes that matter most for latency are
the ones a landing itself sets off: a confirmation pipeline whose batch just
landed cuts its next one (:data:`streams._pipeline.SETTLE_STEPS` steps
later, so that the readers of what it published stage their work first), and
a handler woken by the messages just published commits them. Those writes
come a few steps of the event loop after the landing. A committer that handed
the next batch over at once would send them a transaction later, to wait for
all of it first: in the demo's pipeline at 50,000 orders a second an order
then crossed 6.5 transactions from its send to audit's delivery, against the
2.5 it needs (the one in flight when it was sent, its append's, billing's
commit). So after a landing the committer lets :data:`GATHER_STEPS` steps of
the loop pass before it hands over the next batch. A write submitted while no
batch is in flight and none just landed leaves at the end of its own step,
with the others of that step. Every write still leaves in the first
transaction that begins after it, and nothing is confirmed or published
before its transaction commits.

**A lone write on an idle loop** (LMDB) commits on the loop's own thread
when the batch is one write, nothing else is ready to run on the loop, no
timer is due before the commit would end (judged by the last lone commit)
and that commit took at most :data:`INLINE_LIMIT`. The thread that would
only wait for the writer thread's answer waits for the disk itself, saving
the two wake-ups between them (a durable chain's nodes, a graph's steps, a
run's checkpoints). Work that arrives meanwhile (I/O, a timer come early)
waits at most that one commit; a slower disk has its commits made on the
writer thread again until one is quick. An exception a signal's handler
raises in the middle leaves no batch half done: one that committed is
answered, one that did not goes to the writer thread, and the exception
goes on its way.

**How a failure reaches its callers**, on both backends alike:

- A write its backend refuses (its rules raised, it does not fit, the
  server refused its statements) is answered with that error alone; the
  other writes of its batch still commit.
- A batch the backend cannot commit at all (its function raised) answers
  each of its writes with that error, and the committer takes no more: every
  write submitted after it is answered with :class:`~ledger.WriteFailedError`,
  and :meth:`GroupCommitter.run` raises the error. The ledger is reopened to
  recover; it holds exactly what committed.
- A write whose caller is cancelled before its batch is handed over is
  withdrawn: it is never made. Once handed over it runs to its end; its
  caller gets the cancellation, and the ledger holds whatever it did.

Each batch is one ``streamledger.commit_batch`` span (writes, failed writes,
map growths), linked to the spans its writes were submitted under (a
handler's ``process`` span, a run's), started and ended on the event loop so
the writer thread does no tracing work.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final, Generic, NamedTuple, Protocol, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
from opentelemetry.trace import Link, Span, SpanContext, get_current_span

from streams.store import ATTR, INSTRUMENTS, SPAN, failed, single_error, tracer

from ._errors import WriteFailedError

__all__ = [
    "GATHER_STEPS",
    "INLINE_LIMIT",
    "Answer",
    "Batch",
    "BatchTimer",
    "BeforeCommit",
    "GroupCommitter",
    "ServesWrites",
    "WriteTicket",
    "serving",
]

T = TypeVar("T")
W = TypeVar("W")

#: Steps of the event loop the committer lets pass after a landing before it hands over the next
#: batch: the committers the landing woke resume in the first and cut two steps later
#: (``streams._pipeline.SETTLE_STEPS``); a step with nothing to run costs microseconds.
GATHER_STEPS: Final = 3

#: A lone write commits on the loop's own thread (when nothing else is ready to run) only while the
#: last commit of a lone write took at most this many seconds: a disk that slow or slower has its
#: commits made on the writer thread, where the loop's other tasks run beside them.
INLINE_LIMIT: Final = 0.002

#: Called on the writer thread after each batch with when it was handed over, when its commit
#: began and when it ended (``time.perf_counter``): the benchmarks' measure of the writer's time.
BatchTimer = Callable[[float, float, float], None]

#: A fault hook for tests: called on the writer thread with each batch's size before its
#: transaction begins; what it raises fails the whole batch, as a store refusing it would.
BeforeCommit = Callable[[int], None]


class WriteTicket(Generic[T]):
    """One submitted write; await :meth:`wait` for its result once its batch committed."""

    __slots__ = ("_committer", "_done", "_error", "_result", "origin", "write")

    def __init__(self, write: Any, committer: GroupCommitter[Any]) -> None:
        #: What the backend commits: a function of its transaction, or its description of a call.
        self.write = write
        #: The span the write was submitted under: the commit batch that confirms it links to it.
        self.origin: SpanContext = get_current_span().get_span_context()
        self._committer = committer
        self._done = anyio.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    async def wait(self) -> T:
        """Wait until the write committed and return its result, or raise its error.

        Cancelled before its batch was handed over, the write is withdrawn and
        never made.
        """
        try:
            await self._done.wait()
        except BaseException:
            if not self._done.is_set():
                self._committer._withdraw(self)
            raise
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def resolve(self, ok: bool, value: Any) -> None:
        """Settle the ticket (the committer's call): ``value`` is the result, or the error if not ``ok``."""
        if ok:
            self._result = value
        else:
            self._error = value
        self._done.set()


class Batch(Generic[W]):
    """The writes one transaction commits, in the order they were submitted."""

    __slots__ = ("handed", "writes")

    def __init__(self, writes: list[W], handed: float) -> None:
        self.writes = writes
        #: When the batch was handed to the writer thread (``time.perf_counter``).
        self.handed = handed


class Answer(NamedTuple):
    """What a backend's commit says of a batch: one ``(True, result)`` or ``(False, error)`` per write."""

    outcomes: Sequence[tuple[bool, Any]]
    #: How many times the store grew to make room for the batch (LMDB's map), for its span.
    growths: int = 0


class InlineCommit(Protocol[W]):
    """A backend's commit of a lone write on the loop's own thread (``LmdbBatches``)."""

    def commit_inline(self, batch: Batch[W]) -> Answer | None:
        """The batch's answer, or None when it cannot be made here without waiting for other work.

        (LMDB: its map must grow.) None means nothing of it was written: the
        batch goes to the writer thread.
        """

    def interrupted(self) -> Answer | None:
        """After :meth:`commit_inline` was cut short by an exception not its own: its answer if it committed.

        None if nothing of it was written.
        """


class GroupCommitter(Generic[W]):
    """Commits the writes submitted to one ledger while it serves; see the module docstring.

    Made on the event loop's thread, where every method but ``commit`` runs
    (and where a lone write on an idle loop commits: the module docstring).
    Writes submitted while no batch is committing leave together at the end
    of the loop's current step; writes submitted while one commits wait in
    ``_pending`` and leave together after it lands. The writer thread lands a
    batch by scheduling :meth:`_landed` on the loop, so a write costs one
    hand-over and one wake-up of the loop, with no task of the committer's in
    between (on trio a task of the committer's runs the functions of the
    loop's own thread, the dispatch and the steps after a landing: see
    ``_LoopCalls``). The writer thread runs under ``SCHED_BATCH`` where
    there is one, so that handing it a batch does not stall the loop's
    thread (``_never_preempt_the_waker``).
    """

    def __init__(
        self,
        commit: Callable[[Batch[W]], Answer],
        *,
        where: str,
        attributes: Mapping[str, str],
        timer: Callable[[], BatchTimer | None] = lambda: None,
        before_commit: BeforeCommit | None = None,
        inline: InlineCommit[W] | None = None,
    ) -> None:
        self._commit = commit
        # a fault hook holds batches on the writer thread, where the loop runs beside them
        self._inline = inline if before_commit is None else None
        self._lone_seconds = 0.0  # how long the last batch of one write took to commit
        self._before_commit = before_commit
        self._where = where
        self._timer = timer
        self._attributes = dict(attributes)
        # the global provider's tracer, which follows a provider set later (a proxy until then)
        self._tracer = tracer()
        self._pending: list[WriteTicket[Any]] = []
        self._batch: list[WriteTicket[Any]] | None = None  # the batch the writer thread holds
        self._span: Span | None = None
        self._stopping = False
        self._closed = False  # run() has ended: nothing more is handed to the writer thread
        self._failure: BaseException | None = None
        self._finished = anyio.Event()  # stopped with nothing left, or a batch failed
        self._handed = 0.0  # when the batch with the writer thread was handed over
        self._loop = _LoopCalls()
        self._dispatching = False  # a dispatch is scheduled, or a batch is with the writer thread
        self._gathering = 0  # loop steps still to let pass before the next dispatch
        self._writer = _WriterThread(
            self._commit_timed, self._loop.from_thread(self._landed), name=f"streamledger-writer {where}"
        )

    def submit(self, write: W) -> WriteTicket[Any]:
        ticket: WriteTicket[Any] = WriteTicket(write, self)
        if self._failure is not None or self._closed:
            ticket.resolve(False, self._stopped_error())
            return ticket
        self._pending.append(ticket)
        if not self._dispatching:  # the writes submitted in this step of the loop leave together
            self._dispatching = True
            self._loop.soon(self._dispatch)
        return ticket

    async def write(self, write: W) -> Any:
        """Submit ``write`` and wait for its answer."""
        return await self.submit(write).wait()

    def stop(self) -> None:
        """Let :meth:`run` return once every write submitted so far is committed."""
        self._stopping = True
        if not self._dispatching:
            self._finished.set()

    async def run(self) -> None:
        """Wait until :meth:`stop` and every write submitted before it is committed; shielded.

        Code that unwinds after a cancellation (a handler confirming what it
        finished, a shielded cleanup) can still write until the owner of the
        ledger stops serving. If a batch fails, the writes queued behind it
        are answered with :class:`~ledger.WriteFailedError` and the error is
        raised.
        """
        try:
            with anyio.CancelScope(shield=True):
                if self._loop.drains:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._loop.drain)
                        await self._finished.wait()
                        tg.cancel_scope.cancel()
                else:
                    await self._finished.wait()
        finally:
            self._closed = True
            self._writer.stop()
            if self._batch is not None:  # the loop stopped under us: the writer thread has landed it
                self._landed()
            self._fail_pending()
        if self._failure is not None:
            raise self._failure

    def _withdraw(self, ticket: WriteTicket[Any]) -> None:
        """A caller cancelled before its write's batch was handed over: the write is never made."""
        with contextlib.suppress(ValueError):  # handed over already: it runs to its end
            self._pending.remove(ticket)

    def _gather(self) -> None:
        """Loop thread: let :data:`GATHER_STEPS` steps pass after a landing, then dispatch.

        A write waiting while nothing else is ready to run leaves at once:
        no other task can add to its batch before the loop waits again
        (asyncio; trio does not show the tasks of its current batch).
        """
        if (
            self._gathering > 0
            and not self._closed
            and not (self._pending and self._loop.sees_every_task and self._loop.idle())
        ):
            self._gathering -= 1
            self._loop.soon(self._gather)
            return
        self._dispatch()

    def _dispatch(self) -> None:
        """Loop thread: hand the writes pending to the writer thread, or commit a lone one here."""
        batch, self._pending = self._pending, []
        if not batch or self._failure is not None or self._closed:
            self._pending[:0] = batch
            self._dispatching = False
            if self._stopping:
                self._finished.set()
            return
        self._batch = batch
        self._span = self._tracer.start_span(SPAN.COMMIT_BATCH, links=_links(batch))
        self._handed = time.perf_counter()
        handed = Batch([ticket.write for ticket in batch], self._handed)
        if (
            len(batch) == 1
            and self._inline is not None
            and self._lone_seconds <= INLINE_LIMIT
            and self._loop.idle(self._lone_seconds)
        ):
            try:
                if self._commit_inline(self._inline, handed):
                    return
            except BaseException:
                self._recover_inline(self._inline, handed)
                raise
        self._writer.hand(handed)

    def _commit_inline(self, inline: InlineCommit[W], batch: Batch[W]) -> bool:
        """Loop thread: commit a lone write here, with nothing else ready to run; False to hand it over.

        The loop's thread waits for the disk as the writer thread would, and
        saves the two wake-ups between them.
        """
        began = time.perf_counter()
        try:
            answer = inline.commit_inline(batch)
        except Exception as exc:  # the store failed the batch: as on the writer thread
            self._land(False, exc)
            return True
        ended = time.perf_counter()
        if answer is None:
            return False
        self._lone_seconds = ended - began
        timer = self._timer()
        if timer is not None:
            timer(batch.handed, began, ended)
        self._land(True, answer)
        return True

    def _recover_inline(self, inline: InlineCommit[W], batch: Batch[W]) -> None:
        """An exception not the store's (a signal's handler raising) cut the commit on the loop short.

        A batch begun finishes and is answered, as on the writer thread: the
        answer of one that committed lands, one that did not goes to the
        writer thread. The exception then goes on its way.
        """
        if self._batch is None:  # it landed before the exception
            return
        answer = inline.interrupted()
        if answer is None:
            self._writer.hand(batch)
        else:
            self._land(True, answer)

    def _landed(self) -> None:
        """Loop thread: answer the batch the writer thread committed, then hand it the next one."""
        if self._batch is not None:
            self._land(*self._writer.take())

    def _land(self, ok: bool, value: Any) -> None:
        """Loop thread: answer the batch in flight with its outcome, then gather the next one."""
        batch, span = self._batch, self._span
        if batch is None or span is None:
            return
        self._batch = self._span = None
        self._dispatching = False
        INSTRUMENTS.ledger_commit_duration.record(time.perf_counter() - self._handed, self._attributes)
        INSTRUMENTS.ledger_batch_writes.record(len(batch), self._attributes)
        if ok:
            answer: Answer = value
            refused = 0
            for ticket, (written, result) in zip(batch, answer.outcomes, strict=True):
                refused += not written
                ticket.resolve(written, result)
            if span.is_recording():
                span.set_attributes(
                    {
                        ATTR.BATCH_WRITES: len(batch),
                        ATTR.BATCH_FAILED: refused,
                        ATTR.BATCH_MAP_GROWTHS: answer.growths,
                    }
                )
            span.end()
            if not self._closed:  # what the landing sets off may still join the next batch
                self._dispatching = True
                self._gathering = GATHER_STEPS - 1
                self._loop.soon(self._gather)
            elif self._stopping:
                self._finished.set()
            return
        error = (
            value if isinstance(value, Exception) else WriteFailedError(f"write batch interrupted: {value!r}")
        )
        for ticket in batch:
            ticket.resolve(False, error)
        if span.is_recording():
            span.set_attributes({ATTR.BATCH_WRITES: len(batch), ATTR.BATCH_FAILED: len(batch)})
            failed(span, error)
        span.end()
        self._failure = error
        self._fail_pending()
        self._finished.set()

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, []
        for ticket in pending:
            ticket.resolve(False, self._stopped_error())

    def _stopped_error(self) -> WriteFailedError:
        if self._failure is None:
            return WriteFailedError(f"{self._where} stopped serving writes; this write was not made")
        return WriteFailedError(
            f"{self._where} stopped serving writes after a failed batch; "
            "this write was not made: reopen the ledger to recover"
        )

    def _commit_timed(self, batch: Batch[W]) -> Answer:
        """Writer thread: the backend's commit, reported to the ``timer`` if there is one."""
        if self._before_commit is not None:
            self._before_commit(len(batch.writes))
        began = time.perf_counter()
        try:
            return self._commit(batch)
        finally:
            ended = time.perf_counter()
            if len(batch.writes) == 1:
                self._lone_seconds = ended - began
            timer = self._timer()
            if timer is not None:
                timer(batch.handed, began, ended)


class ServesWrites(abc.ABC, Generic[W]):
    """What a backend's writes go through while it serves (``LedgerEnv``, ``PgConnection``): a committer.

    A subclass says how its committer is made (:meth:`_new_committer`) and
    submits to ``_committer`` while it is not None.
    """

    _committer: GroupCommitter[W] | None = None

    @abc.abstractmethod
    def _new_committer(self, before_commit: BeforeCommit | None) -> GroupCommitter[W]:
        """The committer :meth:`serve` runs, over this backend's batch commit."""

    async def serve(
        self,
        *,
        before_commit: BeforeCommit | None = None,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Commit the writes submitted (a :class:`GroupCommitter`) until :meth:`stop_serving`.

        Then commits what is pending and returns. It is shielded from
        cancellation: code that unwinds after a cancellation can still write
        until the owner of the ledger stops it. ``before_commit`` is a fault
        hook for tests (:data:`BeforeCommit`).
        """
        committer = self._new_committer(before_commit)
        self._committer = committer
        task_status.started()
        try:
            await committer.run()
        finally:
            self._committer = None

    def stop_serving(self) -> None:
        """Let :meth:`serve` return once every write submitted so far is committed."""
        if self._committer is not None:
            self._committer.stop()


@contextlib.asynccontextmanager
async def serving(part: ServesWrites[Any]) -> AsyncIterator[None]:
    """Serve ``part``'s writes for the block; on its way out, every write it submitted is committed."""
    with single_error():
        async with anyio.create_task_group() as tg:
            await tg.start(part.serve)
            try:
                yield
            finally:
                # serve() ignores cancellation: the block may still write while it unwinds
                part.stop_serving()


def _links(batch: list[WriteTicket[Any]]) -> list[Link]:
    """One link to each distinct span the batch's writes were submitted under."""
    origins: dict[tuple[int, int], SpanContext] = {}
    for ticket in batch:
        origin = ticket.origin
        if origin.is_valid:
            origins.setdefault((origin.trace_id, origin.span_id), origin)
    return [Link(origin) for origin in origins.values()]


class _LoopCalls:
    """Scheduling functions on the current event loop: from its own thread, or from any thread.

    On asyncio a function for the loop's own thread is a ``call_soon``. Trio
    has one way to schedule a function, its token's ``run_sync_soon``, and
    each call writes to the loop's wake-up socket and wakes a task that reads
    it, even from the loop's own thread: four such calls a batch (its
    dispatch and the steps after its landing) cost a lone write more than
    the write itself. So on trio the functions of the loop's own thread go to
    a list that a task of the committer's (:meth:`drain`) runs, woken by an
    event: no system call. Either way a function runs in the loop's next
    step. Only the writer thread's landing crosses with ``run_sync_soon``.
    """

    def __init__(self) -> None:
        native: Any = anyio.lowlevel.current_token().native_token
        self._queued: list[Callable[[], None]] = []
        self._wake: anyio.Event | None = None
        #: Whether :meth:`idle` sees every task due to run, or (trio) those of the loop's next batch only.
        self.sees_every_task: bool
        if hasattr(native, "run_sync_soon"):  # trio's TrioToken: one call, from any thread
            import trio.lowlevel  # only where trio runs the loop

            statistics = trio.lowlevel.current_statistics
            self.drains = True
            self._soon: Callable[[Callable[[], None]], object] = self._queue
            self._threadsafe: Callable[[Callable[[], None]], object] = native.run_sync_soon
            # the tasks trio runs in its current batch are not in its statistics: only the next's
            self.sees_every_task = False
            self._busy: Callable[[float], bool] = lambda within: (
                bool(self._queued) or _trio_busy(statistics(), within)
            )
        else:  # an asyncio event loop
            self.drains = False
            self._soon = native.call_soon
            self._threadsafe = native.call_soon_threadsafe
            # asyncio keeps the callbacks due in its next step in ``_ready``, with no public way to
            # ask; a loop without one (another implementation) is never taken to be idle
            ready = getattr(native, "_ready", None)
            self.sees_every_task = True  # each callback of a step leaves ``_ready`` as it runs
            # and its timers in ``_scheduled``, a heap (the next first) it may replace with a new list
            if isinstance(ready, collections.deque) and isinstance(getattr(native, "_scheduled", None), list):
                self._busy = lambda within: bool(ready) or _timer_due(native, within)
            else:
                self._busy = lambda within: True

    def soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop after the current step (call from the loop's thread)."""
        self._soon(fn)

    def idle(self, within: float = 0.0) -> bool:
        """Nothing else is ready to run on the loop, nor a timer due ``within`` seconds (loop's thread).

        The loop would wait for I/O next, or for a timer due later. On trio,
        the tasks of the batch it runs now are not seen
        (:attr:`sees_every_task`): they run after what the caller does next.
        """
        return not self._busy(within)

    def from_thread(self, fn: Callable[[], None]) -> Callable[[], None]:
        """A function any thread may call to have ``fn`` run soon on the loop's thread."""
        threadsafe = self._threadsafe

        def call() -> None:
            threadsafe(fn)

        return call

    def _queue(self, fn: Callable[[], None]) -> None:
        self._queued.append(fn)
        if self._wake is not None:
            self._wake.set()

    async def drain(self) -> None:
        """Run the functions :meth:`soon` queues, a step after each was queued (trio); until cancelled."""
        while True:
            if not self._queued:
                self._wake = anyio.Event()
                try:
                    await self._wake.wait()
                finally:
                    self._wake = None
            else:
                await anyio.lowlevel.cancel_shielded_checkpoint()  # queued before this task ran: a step
            calls, self._queued = self._queued, []
            for fn in calls:
                fn()


class _WriterThread(Generic[W]):
    """The one thread that runs a ledger's write transactions.

    :meth:`hand` gives it a batch through a queue; once the batch is
    committed (or failed) it keeps the outcome for :meth:`take` and calls
    ``landed``, which schedules the committer on the event loop: one wake-up
    of the loop per batch, on asyncio and trio alike.
    """

    def __init__(
        self, commit: Callable[[Batch[W]], Answer], landed: Callable[[], None], *, name: str
    ) -> None:
        self._commit = commit
        self._landed = landed
        self._requests: queue.SimpleQueue[Batch[W] | None] = queue.SimpleQueue()
        self._results: collections.deque[tuple[bool, Any]] = collections.deque()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        _never_preempt_the_waker()
        while True:
            batch = self._requests.get()
            if batch is None:
                return
            try:
                result: tuple[bool, Any] = (True, self._commit(batch))
            except BaseException as exc:
                result = (False, exc)
            self._results.append(result)
            with contextlib.suppress(RuntimeError):  # the loop closed: run() takes the outcome itself
                self._landed()

    def hand(self, batch: Batch[W]) -> None:
        """Commit ``batch`` on the writer thread; a batch handed over always finishes."""
        self._requests.put(batch)

    def take(self) -> tuple[bool, Any]:
        """The outcome of the batch handed over first: ``(True, answer)`` or ``(False, error)``."""
        return self._results.popleft()

    def stop(self) -> None:
        """Finish the batch handed over, if any, and end the thread."""
        self._requests.put(None)
        self._thread.join()


def _timer_due(loop: Any, within: float) -> bool:
    """An asyncio loop's next timer is due ``within`` seconds (read afresh: asyncio replaces the heap)."""
    timers: list[Any] = getattr(loop, "_scheduled", [])
    return bool(timers) and timers[0].when() <= loop.time() + within


def _trio_busy(statistics: Any, within: float) -> bool:
    """Trio's run statistics say a task or a function from another thread waits, or a deadline is near."""
    return bool(
        statistics.tasks_runnable
        or statistics.run_sync_soon_queue_size
        or statistics.seconds_to_next_deadline <= within
    )


def _never_preempt_the_waker() -> None:
    """Linux: put the calling thread (the writer) under ``SCHED_BATCH``, so its wake-ups preempt no one.

    The event loop's thread wakes the writer thread by handing it a batch,
    while it holds the GIL. Under the default policy the kernel often runs
    the woken thread at once in the loop thread's place, only for it to find
    the GIL taken and sleep again: two context switches, and the loop's
    thread stalled in the hand-over (a median of 4 to 11 µs a hand-over here,
    against 1.5 under ``SCHED_BATCH``). A batch thread woken waits for a free
    CPU or its turn instead, by when the loop has usually released the GIL.
    It is otherwise scheduled as before (the same nice value, the same share
    of the CPU). Elsewhere, or where the policy cannot be set, nothing changes.
    """
    set_policy = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if set_policy is None or batch is None:
        return
    with contextlib.suppress(OSError):  # not allowed here: the default policy stays
        set_policy(0, batch, os.sched_param(0))
