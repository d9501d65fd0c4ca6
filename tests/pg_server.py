"""The test session's private PostgreSQL server, started on first use and stopped at exit.

The ``postgres_server`` fixture and the stateful machines (which cannot take
fixtures) share it; each test gets a schema of its own (:func:`new_ledger_url`).
"""

from __future__ import annotations

import atexit
import itertools
import os
from typing import Any

_server: Any = None
_context: Any = None
_schemas = itertools.count()


class Unavailable(Exception):
    """No server can run here (no binaries, or the postgres extra is missing)."""


def server() -> Any:
    """The running server (a :class:`ledger.postgres.server.PrivateServer`)."""
    global _server, _context
    if _server is None:
        try:
            from ledger.postgres.server import ServerUnavailableError, private_server
        except ImportError as missing:  # pragma: no cover - the dev extra installs psycopg
            raise Unavailable(f"the postgres extra is not installed: {missing}") from None
        # the suite kills processes, never the machine: a commit's WAL written, not flushed, survives
        # every crash it makes (the server's own too), and the suite runs a fifth faster
        context = private_server(fsync=False)
        try:
            _server = context.__enter__()
        except ServerUnavailableError as exc:
            raise Unavailable(str(exc)) from None
        _context = context
        atexit.register(_stop)
    return _server


def _stop() -> None:
    global _server, _context
    if _context is not None:
        context, _context, _server = _context, None, None
        context.__exit__(None, None, None)


def new_ledger_url() -> str:
    """A URL of a new, empty ledger: a schema of its own on the session's server."""
    import psycopg

    running = server()
    schema = f"t{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(running.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{running.url}&options=-csearch_path%3D{schema}"
