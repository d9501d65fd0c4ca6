"""A ledger by where it is, an LMDB directory or a PostgreSQL URL: ``connect`` opens it, ``tools_for``
the command line's tools on it."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from ._backend import Backend
from ._errors import NotALedgerError
from ._ledger import Ledger
from ._tools import Tools

__all__ = ["connect", "is_url", "tools_for"]

#: The schemes of a PostgreSQL ledger's URL; a target of any other ``scheme://`` is no ledger.
_SCHEMES: Final = ("postgresql://", "postgres://")
#: A URL's start (RFC 3986: a letter, then letters, digits, ``+``, ``-`` or ``.``), as no path starts.
_ANY_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` names a PostgreSQL ledger (a ``postgresql://`` URL) rather than a directory.

    A URL of another scheme (``http://host/x``) is neither, and is refused
    here, where every command and :func:`connect` resolve their target, with
    :class:`~ledger.NotALedgerError`: read as a path it would name a
    directory ``http:/host/x``.
    """
    if not isinstance(target, str):
        return False
    if target.startswith(_SCHEMES):
        return True
    if _ANY_URL.match(target):
        scheme = target.partition("://")[0]
        raise NotALedgerError(
            f"{scheme}:// is not a ledger's scheme: a ledger is a directory, or a postgresql:// "
            "(or postgres://) URL"
        )
    return False


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
