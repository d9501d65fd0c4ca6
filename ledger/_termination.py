"""SIGTERM stops a command as Ctrl-C does, and neither is lost where Python drops exceptions.

A signal's Python handler runs wherever the main thread is between two
steps, which may be a ``__del__`` or a weak reference's callback run by the
garbage collector. An exception raised there is not raised: Python reports
it as ignored (``sys.unraisablehook``) and goes on, so a command told to stop
would run on. While :func:`stops_as_interrupts` holds, the hook raises such a
stop again a moment later (a timer's signal), at a step outside the callback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["Terminated", "stops_as_interrupts"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be: the command stops the same way and says so."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


#: How soon a dropped stop is raised again (seconds): a step later, outside the callback that dropped it.
_AGAIN = 0.001


@contextmanager
def stops_as_interrupts() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated`; a stop dropped by a callback is raised again (main thread).

    The hook cannot raise it itself (it is such a callback), nor signal this
    process (the handler would run inside the hook): it sets a timer, whose
    signal raises the stop where the main thread is then.
    """
    previous_hook = sys.unraisablehook
    dropped: list[KeyboardInterrupt] = []

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):  # Ctrl-C or SIGTERM
            dropped[:] = [unraisable.exc_value]
            signal.setitimer(signal.ITIMER_REAL, _AGAIN)
        else:
            previous_hook(unraisable)

    def again(signum: int, frame: object) -> None:
        if dropped:
            raise type(dropped.pop())()

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_alarm = signal.signal(signal.SIGALRM, again)
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.setitimer(signal.ITIMER_REAL, 0)
        dropped.clear()
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signal.SIGTERM, previous)
