"""A ledger by where it is, an LMDB directory or a PostgreSQL URL: ``connect`` opens it, ``tools_for``
the command line's tools on it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ._backend import Backend
from ._ledger import Ledger
from ._tools import Tools

__all__ = ["connect", "is_url", "tools_for"]


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names a PostgreSQL ledger (a ``postgresql://`` URL) rather than a directory."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


@asynccontextmanager
async def connect(target: str | os.PathLike[str], **options: Any) -> AsyncIterator[Ledger[Backend]]:
    """Open the ledger at ``target``: :func:`~ledger.open_ledger` for a path, ``open_postgres`` for a URL.

    Both give the one :class:`~ledger.Ledger`, with ``streams``, ``nodes``,
    ``run``, ``resume``, ``submit``, ``runs`` and ``graph_runs``, so a
    program written against it moves from a directory to a server by
    changing this one argument. ``options`` are :func:`~ledger.open_ledger`'s
    (a URL takes none).
    """
    if is_url(target):
        if options:
            raise TypeError(f"a PostgreSQL ledger takes no options, got {sorted(options)}")
        from .postgres import open_postgres

        async with open_postgres(str(target)) as ledger:
            yield ledger
    else:
        from .lmdb import open_ledger

        async with open_ledger(target, **options) as local:
            yield local


def tools_for(target: str | os.PathLike[str]) -> Tools:
    """The tools of the backend ``target`` names; PostgreSQL's are imported only for a URL."""
    if is_url(target):
        from .postgres import TOOLS as postgres

        return postgres
    from .lmdb import TOOLS as lmdb

    return lmdb
