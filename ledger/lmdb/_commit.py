"""How an LMDB ledger commits a batch: one write transaction and one fsync for all its writes.

While a ledger serves writes (:meth:`ledger.lmdb._env.LedgerEnv.serve`), a
:class:`~ledger._committer.GroupCommitter` gathers them into batches and
hands each to :class:`LmdbBatches` on its writer thread, which owns every
write transaction (LMDB ties them to the thread that began them). Each write
is a function of an LMDB write transaction and runs in its own nested
transaction, so one that raises is rolled back alone and the others still
commit. A map too small for the batch is grown, up to its limit, and the
batch run again; at the limit each write is committed alone, so that only
those that do not fit fail. A damaged page, or a write LMDB refuses, fails
the batch as a whole: the committer then takes no more writes
(:mod:`ledger._committer`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import lmdb

from .._committer import Answer, Batch
from .._errors import MapFullError, WriteFailedError
from ._files import damaged

__all__ = ["CommitElsewhere", "CommittingEnv", "LmdbBatches", "LmdbWrite", "on_the_loop"]

#: One write: a function of the batch's (nested) write transaction, pure, as it may run again.
LmdbWrite = Callable[[lmdb.Transaction], Any]

#: Clear reader slots left by dead processes once every this many batches.
_READER_CHECK_EVERY: Final = 1024


class CommitElsewhere(BaseException):  # a request to move, not an error
    """Raised by a write committing on the loop's thread that would hold it long (a keyed log's merge).

    Nothing of the batch is written there; the writer thread makes it. A
    ``BaseException``, so that no write's own error handling answers it.
    """


_where = threading.local()


def on_the_loop() -> bool:
    """Whether the calling thread is making a batch on the event loop's thread (``commit_inline``)."""
    return bool(getattr(_where, "loop", False))


class CommittingEnv(Protocol):
    """What the writer thread uses of its environment (:class:`~ledger.lmdb._env.LedgerEnv`)."""

    path: Path
    max_map_size: int
    batch_observer: Callable[[int, int], None] | None

    def begin_write(self, parent: lmdb.Transaction | None = None) -> lmdb.Transaction: ...

    def grow_map(self) -> bool: ...

    def reader_check(self) -> int: ...

    def last_txn_id(self) -> int: ...


class LmdbBatches:
    """The writer thread's side of an LMDB ledger: commits each batch the committer hands it."""

    def __init__(self, env: CommittingEnv) -> None:
        self._env = env
        self._batches = 0
        self._txn_id: int | None = None  # the id of the last batch's transaction, once begun
        self._outcomes: list[tuple[bool, Any]] = []  # its outcomes, once all its writes ran

    def commit(self, batch: Batch[LmdbWrite]) -> Answer:
        """Writer thread: one write transaction and one fsync for the whole batch."""
        return self._commit(batch.writes)

    def commit_inline(self, batch: Batch[LmdbWrite]) -> Answer | None:
        """The loop's thread: the batch in one write transaction, or None if the map must grow first.

        Growing the map waits for this process's readers to end, and the
        loop's thread may hold one itself: that batch goes to the writer
        thread instead, nothing of it written here, as does one whose write
        raises :class:`CommitElsewhere` (a keyed log's merge, long).
        """
        _where.loop = True
        try:
            return Answer(self._try_batch(batch.writes))
        except (lmdb.MapFullError, CommitElsewhere):
            return None
        finally:
            _where.loop = False

    def interrupted(self) -> Answer | None:
        """The answer of the batch :meth:`commit_inline` was making when an exception cut it short.

        Its transaction either committed (LMDB's last transaction id reached
        its own) and this is its answer, or did not and wrote nothing: None.
        """
        if self._txn_id is None or self._env.last_txn_id() < self._txn_id:
            return None
        return Answer(self._outcomes)

    def _commit(self, writes: list[LmdbWrite]) -> Answer:
        """Each write's outcome, and how many times the map grew to make room for them."""
        growths = 0
        while True:
            try:
                return Answer(self._try_batch(writes), growths)
            except lmdb.MapFullError:
                if not self._env.grow_map():
                    break
                growths += 1
        if len(writes) == 1:
            error = MapFullError(
                f"a write to ledger {self._env.path} does not fit in its map limit of "
                f"{self._env.max_map_size} bytes; nothing of it was written. "
                "Open the ledger with a larger max_map_size"
            )
            return Answer([(False, error)], growths)
        outcomes: list[tuple[bool, Any]] = []
        for write in writes:
            alone = self._commit([write])
            outcomes.extend(alone.outcomes)
            growths += alone.growths
        return Answer(outcomes, growths)

    def _try_batch(self, writes: list[LmdbWrite]) -> list[tuple[bool, Any]]:
        self._txn_id = None
        txn = self._env.begin_write()
        self._txn_id = txn.id()
        try:
            alone = len(writes) == 1
            outcomes = self._run_alone(txn, writes[0]) if alone else self._run_nested(txn, writes)
            self._outcomes = outcomes
            if outcomes[-1][0] or not alone:
                txn.commit()
            else:  # a lone write refused: nothing to commit
                txn.abort()
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
            observer(len(writes), sum(1 for ok, _ in outcomes if ok))
        return outcomes

    def _run_nested(self, txn: lmdb.Transaction, writes: list[LmdbWrite]) -> list[tuple[bool, Any]]:
        """Each write in a transaction nested in ``txn``, so that one that raises is rolled back alone."""
        outcomes: list[tuple[bool, Any]] = []
        for write in writes:
            child = self._env.begin_write(parent=txn)
            try:
                value = write(child)
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
        return outcomes

    def _run_alone(self, txn: lmdb.Transaction, write: LmdbWrite) -> list[tuple[bool, Any]]:
        """A batch of one write, in ``txn`` itself: a write that raises aborts ``txn``, which held only it.

        The same outcome as a nested transaction rolled back alone, without
        the nested transaction's begin and merge (the lone write's case: a
        chain of nodes, a graph's steps, one run's checkpoints).
        """
        try:
            return [(True, write(txn))]
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:  # a damaged page met while writing: the whole batch fails
            raise damaged(self._env.path, exc) from None
        except Exception as exc:
            return [(False, exc)]


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
