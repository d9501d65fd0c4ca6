"""Group commit: the writes a ledger serves, gathered into one LMDB transaction and one fsync.

While a ledger serves writes (:meth:`ledger.LedgerEnv.serve`), a
:class:`GroupCommitter` exists for it, and only then. Each write is a
function of an LMDB write transaction, submitted for a :class:`WriteTicket`.
The committer gathers every write submitted while the previous batch was
committing into one write transaction and one fsync. Each write runs in its
own nested transaction, so one that raises is rolled back alone and the
others still commit. One writer thread owns every write transaction (LMDB
ties them to the thread that began them); the committer hands it a batch and
is woken once when it is durable, so the event loop never blocks on LMDB.

Each batch is one ``streamledger.commit_batch`` span (writes, failed writes,
map growths), started and ended on the event loop so the writer thread does
no tracing work.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import anyio
import anyio.abc
import lmdb

from streams.store import ATTR, SPAN, failed, tracer

from ._errors import MapFullError, WriteFailedError
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

    __slots__ = ("_done", "_error", "_fn", "_result")

    def __init__(self, fn: Callable[[lmdb.Transaction], T]) -> None:
        self._fn = fn
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
    """Commits the writes submitted to one ledger while it serves; see the module docstring."""

    def __init__(self, env: LedgerEnv, *, before_commit: BeforeCommit | None = None) -> None:
        self._env = env
        self._before_commit = before_commit
        self._pending: list[WriteTicket[Any]] = []
        self._wakeup = anyio.Event()
        self._stopping = False
        self._batches = 0
        self._writer = _WriterThread(self._commit_batch, name=f"streamledger-writer {env.path.name}")

    def submit(self, fn: Callable[[lmdb.Transaction], T]) -> WriteTicket[T]:
        ticket: WriteTicket[T] = WriteTicket(fn)
        self._pending.append(ticket)
        self._wakeup.set()
        return ticket

    def stop(self) -> None:
        """Let :meth:`run` return once every write submitted so far is committed."""
        self._stopping = True
        self._wakeup.set()

    async def run(self) -> None:
        """Commit submitted writes until :meth:`stop`, then what is pending; shielded from cancellation.

        Code that unwinds after a cancellation (a handler confirming what it
        finished, a shielded cleanup) can still write until the owner of the
        ledger stops serving. If a batch fails, the writes queued behind it
        are answered with :class:`WriteFailedError` and the error is raised.
        """
        try:
            with anyio.CancelScope(shield=True):
                while True:
                    await self._wakeup.wait()
                    self._wakeup = anyio.Event()
                    await self._commit_pending()
                    if self._stopping and not self._pending:
                        break
        finally:
            self._writer.stop()
            pending, self._pending = self._pending, []
            for ticket in pending:
                ticket.resolve(
                    False,
                    WriteFailedError(
                        f"ledger {self._env.path} stopped serving writes after a failed batch; "
                        "this write was not made: reopen the ledger to recover"
                    ),
                )

    async def _commit_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        span = tracer().start_span(SPAN.COMMIT_BATCH)
        try:
            outcomes, growths = await self._writer.commit(batch)
        except BaseException as exc:
            error = (
                exc if isinstance(exc, Exception) else WriteFailedError(f"write batch interrupted: {exc!r}")
            )
            for ticket in batch:
                ticket.resolve(False, error)
            if span.is_recording():
                span.set_attributes({ATTR.BATCH_WRITES: len(batch), ATTR.BATCH_FAILED: len(batch)})
                failed(span, error)
            span.end()
            raise
        refused = 0
        for ticket, (ok, value) in zip(batch, outcomes, strict=True):
            refused += not ok
            ticket.resolve(ok, value)
        if span.is_recording():
            span.set_attributes(
                {
                    ATTR.BATCH_WRITES: len(batch),
                    ATTR.BATCH_FAILED: refused,
                    ATTR.BATCH_MAP_GROWTHS: growths,
                }
            )
        span.end()

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


class _WriterThread:
    """The one thread that owns the ledger's write transactions.

    The committer hands it a batch through a queue and waits, without
    blocking the event loop, for one byte on a socket pair: one wake-up of
    the loop per committed batch, on asyncio and trio alike.
    """

    def __init__(self, commit: Callable[[list[WriteTicket[Any]]], Any], *, name: str) -> None:
        self._commit = commit
        self._requests: queue.SimpleQueue[list[WriteTicket[Any]] | None] = queue.SimpleQueue()
        self._results: collections.deque[tuple[bool, Any]] = collections.deque()
        self._receive, self._send = socket.socketpair()
        self._receive.setblocking(False)
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
            self._send.send(b"\0")

    async def commit(self, batch: list[WriteTicket[Any]]) -> Any:
        """Commit ``batch`` on the writer thread; a batch handed over always finishes."""
        self._requests.put(batch)
        with anyio.CancelScope(shield=True):
            while not self._results:
                await anyio.wait_readable(self._receive)
                with contextlib.suppress(BlockingIOError):
                    self._receive.recv(4096)
        ok, value = self._results.popleft()
        if ok:
            return value
        raise value

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join()
        self._receive.close()
        self._send.close()
