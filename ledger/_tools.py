"""What the command line asks of a backend, by where the ledger is: a directory or a ``postgresql://`` URL.

Each backend package exports one :class:`Tools` (``ledger.lmdb.TOOLS``,
``ledger.postgres.TOOLS``); the command line picks it with
:func:`tools_for` and never reaches into a backend's private modules. Every
tool reads one snapshot beside the ledger's running owners and writes
nothing, except ``backup`` (into its new destination). The long ones,
``messages``, ``check`` and ``backup``, report to a
:class:`~ledger._progress.Progress` the command line draws on a terminal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from streams import StreamRef

from ._check import LedgerCheck
from ._messages import KeyFilter
from ._progress import SILENT, Progress

__all__ = ["BackupTool", "CheckTool", "DemoTool", "MessagesTool", "Tools"]


class MessagesTool(Protocol):
    """``messages``: a stream's kept messages from sequence ``start`` on, at most ``limit``; the last
    ``last`` of them; of the partition of a key (:func:`~ledger._messages.messages_of`)."""

    def __call__(
        self,
        target: str,
        ref: StreamRef,
        start: int,
        limit: int | None,
        /,
        *,
        last: int | None = None,
        key: KeyFilter | None = None,
        progress: Progress = SILENT,
    ) -> dict[str, Any]: ...


class CheckTool(Protocol):
    """``check``: every record decoded and every reference followed."""

    def __call__(self, target: str, /, *, progress: Progress = SILENT) -> LedgerCheck: ...


class BackupTool(Protocol):
    """``backup``: a consistent copy into the new directory ``destination``, and the check of the copy."""

    def __call__(self, target: str, destination: Path, /, *, progress: Progress = SILENT) -> LedgerCheck: ...


class DemoTool(Protocol):
    """``demo``: run or resume the demo as run ``run_id`` (``fresh``: deleted first and started anew)."""

    def __call__(
        self,
        target: str,
        messages: int,
        workers: int,
        progress: Callable[[Any], None] | None,
        interval: float,
        max_map_size: int,
        /,
        *,
        run_id: str,
        fresh: bool,
    ) -> Awaitable[Any]: ...


@dataclass(frozen=True)
class Tools:
    """A backend's tools, each taking the ledger's path or URL first; only backup and demo write."""

    #: The ledger as messages name it (a URL without its password).
    describe: Callable[[str], str]
    #: The ledger as its metrics name it (``streamledger.ledger``): the directory's name, the database's.
    name: Callable[[str], str]
    #: ``inspect``'s report: streams with their groups, runs, graph runs (values only if asked).
    inspect: Callable[[str, bool], dict[str, Any]]
    #: ``messages``: a stream's kept messages from a sequence on, at most a limit.
    messages: MessagesTool
    #: ``keys``: a group's confirmed keyed state from a key (included) to a key (excluded), at most a limit.
    keys: Callable[[str, StreamRef, str, bytes, bytes | None, int], dict[str, Any]]
    #: ``check``: every record decoded and every reference followed.
    check: CheckTool
    #: ``backup``: a consistent copy into a new directory, and the check of what was copied.
    backup: BackupTool
    #: What the copy is and how it is brought back, said after ``backup``'s line (or nothing).
    backup_note: str
    #: ``demo``: run or resume the demo (messages, workers, progress, interval, map limit; run id, fresh).
    demo: DemoTool
