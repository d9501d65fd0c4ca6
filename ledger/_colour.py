"""Colour on a terminal: whether the command line colours what it prints, and in which colour.

:func:`colours_for` decides once per command, in CPython's own order
(``Lib/_colorize.py``): ``--json`` is never coloured; ``NO_COLOR`` set and
not empty turns colour off (no-color.org); ``FORCE_COLOR`` set and not empty
turns it on, even in a pipe (force-color.org); ``TERM=dumb`` turns it off;
else stdout is coloured only if it is a terminal. A pipe, a file or a test's
capture gets the same bytes as without this module.

Status words take the colour of their meaning (:data:`STATUS_COLOURS`):
red for what failed (a run, a node, a message out of its budget), yellow
for what waits on someone (a group stopped or behind, a cancelled run),
green for what ended well, cyan for what is under way.
Headers are bold. Colour is added after a table's columns are padded, so
widths count only the text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final, TextIO

__all__ = ["PLAIN", "STATUS_COLOURS", "Colours", "colours_for"]

_RED: Final = "31"
_GREEN: Final = "32"
_YELLOW: Final = "33"
_CYAN: Final = "36"
_BOLD: Final = "1"

#: Each status word the command line prints, and its SGR colour.
STATUS_COLOURS: Final[Mapping[str, str]] = {
    "failed": _RED,
    "exhausted": _RED,
    "stopped": _YELLOW,
    "lagging": _YELLOW,
    "cancelled": _YELLOW,
    "interrupted": _YELLOW,
    "completed": _GREEN,
    "finished": _GREEN,
    "sound": _GREEN,
    "running": _CYAN,
    "active": _CYAN,
}


class Colours:
    """What a command prints, coloured if ``enabled``; else every method returns its text as it is."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled

    def status(self, text: str, word: str | None = None) -> str:
        """``text`` in the colour of the status ``word`` (default: ``text`` itself, stripped)."""
        code = STATUS_COLOURS.get(text.strip() if word is None else word)
        return self._sgr(code, text) if code is not None else text

    def header(self, text: str) -> str:
        return self._sgr(_BOLD, text)

    def _sgr(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and text else text


#: No colour at all.
PLAIN: Final = Colours(enabled=False)


def colours_for(out: TextIO, *, json: bool = False, environ: Mapping[str, str] = os.environ) -> Colours:
    """Whether what is printed on ``out`` is coloured (the module's docstring says the order)."""
    if json or environ.get("NO_COLOR"):
        return PLAIN
    if environ.get("FORCE_COLOR"):
        return Colours(enabled=True)
    if environ.get("TERM") == "dumb":
        return PLAIN
    try:
        return Colours(enabled=out.isatty())
    except ValueError:  # a closed stream
        return PLAIN
