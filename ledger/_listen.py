"""Listening on an address (``console``, ``metrics``): every way it fails is one typed error.

A port in use, an address that is not this machine's, a host name that
does not resolve: each is :class:`~ledger.ListenAddressError`, one line on
the command line (exit 2), never a traceback.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TypeVar

from ._errors import ListenAddressError

__all__ = ["listening"]

T = TypeVar("T")


def listening(host: str, port: int, serve: Callable[[], T]) -> T:
    """``serve()``, which binds ``host:port``; its failure to bind as :class:`ListenAddressError`."""
    try:
        return serve()
    except socket.gaierror as exc:
        raise ListenAddressError(
            f"cannot listen on {host}:{port}: the host {host!r} does not resolve ({exc.strerror})"
        ) from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ListenAddressError(f"cannot listen on {host}:{port}: {why[:1].lower()}{why[1:]}") from None
