"""The command line's tools on an LMDB ledger: each opens the environment read-only, beside its owner."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import lmdb

from streams import StreamRef

from .._check import LedgerCheck
from .._errors import BackupDestinationError
from .._messages import KeyFilter
from .._progress import SILENT, Progress, watching
from .._tools import Tools
from ._check import check_ledger
from ._env import LedgerEnv
from ._inspect import inspect_ledger, view_keys, view_messages

__all__ = ["TOOLS"]


@contextmanager
def _read_only(path: str | Path, *, verify: bool = True) -> Iterator[LedgerEnv]:
    """Opened read-only beside its owner; verified as every open is, unless the caller lists the damage."""
    env = LedgerEnv.open_readonly(path, verify=verify)
    try:
        yield env
    finally:
        env.close()


def _inspect(path: str, values: bool) -> dict[str, Any]:
    with _read_only(path) as env:
        return inspect_ledger(env, values=values)


def _messages(
    path: str,
    ref: StreamRef,
    start: int,
    limit: int | None,
    /,
    *,
    last: int | None = None,
    key: KeyFilter | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    with _read_only(path) as env:
        return view_messages(env, ref, start=start, limit=limit, last=last, key=key, progress=progress)


def _keys(
    path: str, ref: StreamRef, group: str, start: bytes, stop: bytes | None, limit: int
) -> dict[str, Any]:
    with _read_only(path) as env:
        return view_keys(env, ref, group, start=start, stop=stop, limit=limit)


def _check(path: str, /, *, progress: Progress = SILENT) -> LedgerCheck:
    with _read_only(path, verify=False) as env:  # it lists the damage instead of stopping at it
        return check_ledger(env, progress=progress)


def _backup(path: str, destination: Path, /, *, progress: Progress = SILENT) -> LedgerCheck:
    """A compacted copy as of the moment it starts (the owner may keep writing); the copy's check.

    ``progress`` follows the copy's file as it grows, of the source's map in
    use, then the check of the copy.
    """
    with _read_only(path, verify=False) as env:  # the copy is checked below
        progress.phase("copying", env.used_size(), unit="bytes")
        try:
            with watching(progress, partial(_size, destination / "data.mdb")):
                env.copy_to(destination)
        except (OSError, lmdb.Error) as exc:  # a read-only or full destination, one this user may not write
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise BackupDestinationError(f"the copy cannot be written to {destination}: {reason}") from None
    return _check(str(destination), progress=progress)


def _size(path: Path) -> int:
    """The size of the file at ``path`` so far (0 before it is made)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def _demo(
    path: str,
    messages: int,
    workers: int,
    progress: Callable[[Any], None] | None,
    interval: float,
    max_map_size: int,
    /,
    *,
    run_id: str,
    fresh: bool,
) -> Any:
    from .._errors import DemoMismatchError
    from ._demo import run_demo

    if workers != 1:
        raise DemoMismatchError("--workers runs the demo on a PostgreSQL URL; an LMDB ledger has one owner")
    return await run_demo(
        path,
        messages,
        progress=progress,
        progress_interval=interval,
        max_map_size=max_map_size,
        run_id=run_id,
        fresh=fresh,
    )


TOOLS = Tools(
    describe=str,
    name=lambda path: Path(path).resolve().name,
    inspect=_inspect,
    messages=_messages,
    keys=_keys,
    check=_check,
    backup=_backup,
    backup_note="",
    demo=_demo,
)
