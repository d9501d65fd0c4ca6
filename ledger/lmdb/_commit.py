"""Group commit: the writes a ledger serves, gathered into one LMDB transaction and one fsync.

While a ledger serves writes (:meth:`ledger.LedgerEnv.serve`), a
:class:`GroupCommitter` exists for it, and only then. Each write is a
function of an LMDB write transaction, submitted for a :class:`WriteTicket`.
The committer gathers the writes submitted in one step of the event loop, or
while the previous batch was committing, into one write transaction and one
fsync. Once a batch lands it waits a few more steps of the loop
(:data:`~ledger._gather.GATHER_STEPS`, where the policy is stated) before it
hands over the next one, so the writes that the landing itself set off (a
handler's next commit, the commit of the messages it just published) share
that transaction instead of waiting for a whole one more. Each write runs in its
own nested transaction, so one that raises is rolled back alone and the
others still commit. One writer thread owns every write transaction (LMDB
ties them to the thread that began them); the committer hands it a batch and
the writer thread schedules one callback on the loop when it is durable, so
the event loop never blocks on LMDB and no task sits between a write and its
commit.

Each batch is one ``streamledger.commit_batch`` span (writes, failed writes,
map growths), linked to the spans its writes were submitted under (a
handler's ``process`` span, a run's), started and ended on the event loop so
the writer thread does no tracing work.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import lmdb
from opentelemetry.trace import Link, Span, SpanContext, get_current_span

from streams.store import ATTR, INSTRUMENTS, SPAN, failed, tracer

from .._errors import MapFullError, WriteFailedError
from .._gather import GATHER_STEPS
from ._files import damaged

if TYPE_CHECKING:
    from ._env import LedgerEnv

__all__ = ["BeforeCommit", "GroupCommitter", "WriteTicket"]

T = TypeVar("T")

#: A fault hook for tests: called on the writer thread with each batch's size before its
#: transaction begins; what it raises fails the whole batch, as a refused LMDB write would.
BeforeCommit = Callable[[int], None]

#: Clear reader slots left by dead processes once every this many batches.
_READER_CHECK_EVERY: Final = 1024


class WriteTicket(Generic[T]):
    """One submitted write; await :meth:`wait` for its result once its batch is durable."""

    __slots__ = ("_done", "_error", "_fn", "_result", "origin")

    def __init__(self, fn: Callable[[lmdb.Transaction], T]) -> None:
        self._fn = fn
        #: The span the write was submitted under: the commit batch that confirms it links to it.
        self.origin: SpanContext = get_current_span().get_span_context()
        self._done = anyio.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    async def wait(self) -> T:
        """Wait until the write is committed and return what its function returned."""
        await self._done.wait()
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


class GroupCommitter:
    """Commits the writes submitted to one ledger while it serves; see the module docstring.

    Made on the event loop's thread, where every method but :meth:`_commit_batch`
    runs. Writes submitted while no batch is committing leave together at the
    end of the loop's current step; writes submitted while one commits wait in
    ``_pending`` and leave together when it lands. The writer thread lands a
    batch by scheduling :meth:`_landed` on the loop, so a write costs one
    hand-over and one wake-up of the loop, with no task of the committer's in
    between.
    """

    def __init__(self, env: LedgerEnv, *, before_commit: BeforeCommit | None = None) -> None:
        self._env = env
        self._before_commit = before_commit
        self._pending: list[WriteTicket[Any]] = []
        self._batch: list[WriteTicket[Any]] | None = None  # the batch the writer thread holds
        self._span: Span | None = None
        self._stopping = False
        self._closed = False  # run() has ended: nothing more is handed to the writer thread
        self._failure: BaseException | None = None
        self._finished = anyio.Event()  # stopped with nothing left, or a batch failed
        self._batches = 0
        self._handed = 0.0  # when the batch with the writer thread was handed over
        self._attributes = {ATTR.LEDGER: env.path.name}
        self._loop = _LoopCalls()
        self._dispatching = False  # a dispatch is scheduled, or a batch is with the writer thread
        self._gathering = 0  # loop steps still to let pass before the next dispatch
        self._writer = _WriterThread(
            self._commit_timed,
            self._loop.from_thread(self._landed),
            name=f"streamledger-writer {env.path.name}",
        )

    def submit(self, fn: Callable[[lmdb.Transaction], T]) -> WriteTicket[T]:
        ticket: WriteTicket[T] = WriteTicket(fn)
        if self._failure is not None:
            ticket.resolve(False, self._stopped_error())
            return ticket
        self._pending.append(ticket)
        if not self._dispatching:  # the writes submitted in this step of the loop leave together
            self._dispatching = True
            self._loop.soon(self._dispatch)
        return ticket

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
        are answered with :class:`WriteFailedError` and the error is raised.
        """
        try:
            with anyio.CancelScope(shield=True):
                await self._finished.wait()
        finally:
            self._closed = True
            self._writer.stop()
            if self._batch is not None:  # the loop stopped under us: the writer thread has landed it
                self._landed()
            self._fail_pending()
        if self._failure is not None:
            raise self._failure

    def _gather(self) -> None:
        """Loop thread: let :data:`GATHER_STEPS` steps pass after a landing, then dispatch."""
        if self._gathering > 0 and not self._closed:
            self._gathering -= 1
            self._loop.soon(self._gather)
            return
        self._dispatch()

    def _dispatch(self) -> None:
        batch, self._pending = self._pending, []
        if not batch or self._failure is not None or self._closed:
            self._pending[:0] = batch
            self._dispatching = False
            if self._stopping:
                self._finished.set()
            return
        self._batch = batch
        self._span = tracer().start_span(SPAN.COMMIT_BATCH, links=_links(batch))
        self._handed = time.perf_counter()
        self._writer.hand(batch)

    def _landed(self) -> None:
        """Loop thread: settle the batch the writer thread committed, then hand it the next one."""
        batch, span = self._batch, self._span
        if batch is None or span is None:
            return
        self._batch = self._span = None
        self._dispatching = False
        ok, value = self._writer.take()
        INSTRUMENTS.ledger_commit_duration.record(time.perf_counter() - self._handed, self._attributes)
        INSTRUMENTS.ledger_batch_writes.record(len(batch), self._attributes)
        if ok:
            outcomes, growths = value
            refused = 0
            for ticket, (written, result) in zip(batch, outcomes, strict=True):
                refused += not written
                ticket.resolve(written, result)
            if span.is_recording():
                span.set_attributes(
                    {
                        ATTR.BATCH_WRITES: len(batch),
                        ATTR.BATCH_FAILED: refused,
                        ATTR.BATCH_MAP_GROWTHS: growths,
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
        return WriteFailedError(
            f"ledger {self._env.path} stopped serving writes after a failed batch; "
            "this write was not made: reopen the ledger to recover"
        )

    def _commit_timed(self, batch: list[WriteTicket[Any]]) -> tuple[list[tuple[bool, Any]], int]:
        """Writer thread: :meth:`_commit_batch`, reported to the ledger's ``batch_timer`` if it has one."""
        timer = self._env.batch_timer
        if timer is None:
            return self._commit_batch(batch)
        began = time.perf_counter()
        try:
            return self._commit_batch(batch)
        finally:
            timer(self._handed, began, time.perf_counter())

    def _commit_batch(self, batch: list[WriteTicket[Any]]) -> tuple[list[tuple[bool, Any]], int]:
        """Writer thread: one write transaction and one fsync for the whole batch.

        Returns each write's outcome and how many times the map grew. When the
        map cannot grow any more, each write is committed alone so that only
        those that do not fit fail, with :class:`MapFullError`.
        """
        if self._before_commit is not None:
            self._before_commit(len(batch))
        growths = 0
        while True:
            try:
                return self._try_batch(batch), growths
            except lmdb.MapFullError:
                if not self._env.grow_map():
                    break
                growths += 1
        if len(batch) == 1:
            error = MapFullError(
                f"a write to ledger {self._env.path} does not fit in its map limit of "
                f"{self._env.max_map_size} bytes; nothing of it was written. "
                "Open the ledger with a larger max_map_size"
            )
            return [(False, error)], growths
        outcomes: list[tuple[bool, Any]] = []
        for ticket in batch:
            outcome, _ = self._commit_batch([ticket])
            outcomes.extend(outcome)
        return outcomes, growths

    def _try_batch(self, batch: list[WriteTicket[Any]]) -> list[tuple[bool, Any]]:
        txn = self._env.begin_write()
        try:
            outcomes: list[tuple[bool, Any]] = []
            for ticket in batch:
                child = self._env.begin_write(parent=txn)
                try:
                    value = ticket._fn(child)
                except lmdb.MapFullError:
                    child.abort()
                    raise
                except lmdb.Error as exc:  # a damaged page met while writing: the whole batch fails
                    child.abort()
                    raise damaged(self._env.path, exc) from None
                except Exception as exc:
                    child.abort()
                    outcomes.append((False, exc))
                else:
                    child.commit()
                    outcomes.append((True, value))
            txn.commit()
        except lmdb.MapFullError:
            txn.abort()
            raise
        except lmdb.Error as exc:
            txn.abort()
            raise WriteFailedError(
                f"LMDB refused a write batch on {self._env.path}: {exc}{_disk_note(self._env.path)}"
            ) from exc
        except BaseException:
            txn.abort()
            raise
        self._batches += 1
        if self._batches % _READER_CHECK_EVERY == 0:
            self._env.reader_check()
        observer = self._env.batch_observer
        if observer is not None:
            observer(len(batch), sum(1 for ok, _ in outcomes if ok))
        return outcomes


def _links(batch: list[WriteTicket[Any]]) -> list[Link]:
    """One link to each distinct span the batch's writes were submitted under."""
    origins: dict[tuple[int, int], SpanContext] = {}
    for ticket in batch:
        origin = ticket.origin
        if origin.is_valid:
            origins.setdefault((origin.trace_id, origin.span_id), origin)
    return [Link(origin) for origin in origins.values()]


def _disk_note(path: Path) -> str:
    """Why a write may have failed that LMDB does not say (it reports a full disk as an I/O error)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return ""
    free = stats.f_bavail * stats.f_frsize
    if free >= _DISK_NEARLY_FULL:
        return ""
    return (
        f"; the disk holding it is full ({free} bytes free): free space, then run the same command "
        "again to resume"
    )


#: Free space under which a failed write is put down to a full disk.
_DISK_NEARLY_FULL: Final = 1 << 20


class _LoopCalls:
    """Scheduling functions on the current event loop: from its own thread, or from any thread."""

    def __init__(self) -> None:
        native: Any = anyio.lowlevel.current_token().native_token
        if hasattr(native, "run_sync_soon"):  # trio's TrioToken: one call, from any thread
            self._soon: Callable[[Callable[[], None]], object] = native.run_sync_soon
            self._threadsafe: Callable[[Callable[[], None]], object] = native.run_sync_soon
        else:  # an asyncio event loop
            self._soon = native.call_soon
            self._threadsafe = native.call_soon_threadsafe

    def soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop after the current step (call from the loop's thread)."""
        self._soon(fn)

    def from_thread(self, fn: Callable[[], None]) -> Callable[[], None]:
        """A function any thread may call to have ``fn`` run soon on the loop's thread."""
        threadsafe = self._threadsafe

        def call() -> None:
            threadsafe(fn)

        return call


class _WriterThread:
    """The one thread that owns the ledger's write transactions.

    :meth:`hand` gives it a batch through a queue; once the batch is
    committed (or failed) it keeps the outcome for :meth:`take` and calls
    ``landed``, which schedules the committer on the event loop: one wake-up
    of the loop per batch, on asyncio and trio alike.
    """

    def __init__(
        self, commit: Callable[[list[WriteTicket[Any]]], Any], landed: Callable[[], None], *, name: str
    ) -> None:
        self._commit = commit
        self._landed = landed
        self._requests: queue.SimpleQueue[list[WriteTicket[Any]] | None] = queue.SimpleQueue()
        self._results: collections.deque[tuple[bool, Any]] = collections.deque()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
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

    def hand(self, batch: list[WriteTicket[Any]]) -> None:
        """Commit ``batch`` on the writer thread; a batch handed over always finishes."""
        self._requests.put(batch)

    def take(self) -> tuple[bool, Any]:
        """The outcome of the batch handed over first: ``(True, result)`` or ``(False, error)``."""
        return self._results.popleft()

    def stop(self) -> None:
        """Finish the batch handed over, if any, and end the thread."""
        self._requests.put(None)
        self._thread.join()
