"""Progress of a long command on a terminal: one line on stderr, rewritten in place, erased when done.

Only a terminal sees it. :func:`progress_on` gives a silent :class:`Progress`
when stderr is no terminal (a pipe, a file, a test's capture) or the command
prints JSON, so logs and pipes get the command's own lines and nothing else;
stdout is never written. A tool says what it knows cheaply, a phase with
its total when known (messages from the stream's descriptor, records from
LMDB's database sizes, bytes from the map in use) and each unit done; the
line is drawn at most every :data:`INTERVAL` seconds, so counting one
record costs a comparison, and an unknown total shows a count and a rate.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, TextIO

__all__ = ["INTERVAL", "SILENT", "Progress", "as_clock", "progress_on", "watching"]

#: Seconds between two drawings of the line.
INTERVAL: Final = 0.1
_BAR: Final = 24
_MOST: Final = 1 << 16  # the most units counted between two looks at the clock
_NEVER: Final = 1 << 62
_STEADY: Final = 1.0  # seconds into a phase before its rate (and ETA) mean something


class Progress:
    """A command's progress: phases, each with its units done of a total; drawn on ``out`` if it is given.

    With no ``out`` it only counts: every tool takes one, and one that is
    silent costs nothing to report to.
    """

    def __init__(self, out: TextIO | None = None, *, now: Callable[[], float] = time.monotonic) -> None:
        self._out = out
        self._clock = now
        self._label = ""
        self._unit = ""
        self._total: int | None = None
        self._done = 0
        self._started = self._drawn = self._looked = 0.0
        self._stride = 1
        self._next = _NEVER  # the count at which to look at the clock again
        self._shown = False
        self._width = 80

    @property
    def live(self) -> bool:
        """Whether the line is drawn: a caller may skip work done only to report (polling a file's size)."""
        return self._out is not None

    def phase(self, label: str, total: int | None, *, unit: str = "records") -> None:
        """Start counting ``unit`` of ``label`` from 0 (of ``total``, if known); drawn at once."""
        self._label, self._unit, self._total, self._done = label, unit, total, 0
        if self._out is None:
            return
        self._started = self._looked = self._clock()
        self._stride = 1
        self._width = _columns(self._out)
        self._draw(self._started)

    def advance(self, count: int = 1) -> None:
        """``count`` more units done."""
        self._done += count
        if self._done >= self._next:
            self._look()

    def reached(self, done: int) -> None:
        """``done`` units done in all (what a poll of a copy's size found)."""
        self._done = done
        if self._done >= self._next:
            self._look()

    def clear(self) -> None:
        """Erase the line: before the terminal shows anything else, and at the end."""
        self._next = _NEVER
        if self._out is not None and self._shown:
            self._out.write("\r\x1b[K")
            self._out.flush()
            self._shown = False

    def _look(self) -> None:
        now = self._clock()
        since, self._looked = now - self._looked, now
        if since < INTERVAL / 4:  # counting fast: look less often
            self._stride = min(self._stride * 2, _MOST)
        elif since > INTERVAL:
            self._stride = max(self._stride // 2, 1)
        if now - self._drawn >= INTERVAL:
            self._draw(now)
        else:
            self._next = self._done + self._stride

    def _draw(self, now: float) -> None:
        assert self._out is not None
        self._drawn = now
        self._next = self._done + self._stride
        text = _line(self._label, self._done, self._total, self._unit, now - self._started, self._width - 1)
        self._out.write(f"\r{text}\x1b[K")
        self._out.flush()
        self._shown = True


#: A progress nobody sees.
SILENT: Final = Progress()


@contextmanager
def progress_on(out: TextIO, *, quiet: bool = False) -> Iterator[Progress]:
    """A progress drawn on ``out`` if it is a terminal and not ``quiet`` (--json), else a silent one;
    its line erased when the block ends, however it ends."""
    progress = Progress(out if not quiet and out.isatty() else None)
    try:
        yield progress
    finally:
        progress.clear()


@contextmanager
def watching(progress: Progress, measure: Callable[[], int], *, every: float = INTERVAL) -> Iterator[None]:
    """While the block runs, ``progress`` reaches ``measure()`` every ``every`` seconds, from a thread.

    For a blocking call that reports nothing itself (LMDB's copy, which
    releases the GIL; ``pg_dump``): ``measure`` reads what it wrote so far
    and must not raise. The thread is joined before the block is left.
    """
    if not progress.live:
        yield
        return
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every):
            progress.reached(measure())

    thread = threading.Thread(target=poll, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _line(label: str, done: int, total: int | None, unit: str, seconds: float, width: int) -> str:
    """The line: label, bar, share, amounts, rate and ETA; the bar left out if the terminal is narrow."""
    rate = done / seconds if seconds >= _STEADY else 0.0
    speed = f"  {_amount(rate, unit)}/s" if rate > 0 else ""
    named = "" if unit == "bytes" else f" {unit}"  # a size says its unit itself
    if total is None:
        return f"{label}: {_amount(done, unit)}{named}{speed}"[:width]
    total = max(total, done)  # an estimate (PostgreSQL's) may fall short
    share = done / total if total else 1.0
    filled = int(share * _BAR)
    bar = " [" + "#" * filled + "-" * (_BAR - filled) + "]"
    eta = as_clock((total - done) / rate) if rate > 0 else "--:--"
    rest = f" {share:4.0%}  {_amount(done, unit)}/{_amount(total, unit)}{named}{speed}  ETA {eta}"
    line = f"{label}{bar}{rest}"
    return line if len(line) <= width else f"{label}{rest}"[:width]


def _amount(value: float, unit: str) -> str:
    """A count with thousands separated; bytes as B, KiB, MiB or GiB."""
    if unit != "bytes":
        return f"{value:,.0f}"
    for size, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if value >= size:
            return f"{value / size:.1f} {suffix}"
    return f"{value:.0f} B"


def _columns(out: TextIO) -> int:
    """The terminal's width (80 if it says none, as a new pseudo-terminal does)."""
    try:
        columns = os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError):
        return 80
    return columns or 80


def as_clock(seconds: float) -> str:
    """``seconds`` as m:ss (or h:mm:ss)."""
    whole = int(seconds + 0.5)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
