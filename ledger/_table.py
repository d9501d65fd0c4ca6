"""Tables of the command line: rows of text as aligned columns."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["aligned"]


def aligned(rows: Sequence[tuple[str, ...]], *, left: int, ragged_last: bool = False) -> list[str]:
    """Rows as lines of columns two spaces apart: the first ``left`` aligned left, the others right.

    With ``ragged_last`` the last column (free text) is not padded.
    """
    fixed = len(rows[0]) - ragged_last
    widths = [max(len(row[i]) for row in rows) for i in range(fixed)]
    lines = []
    for row in rows:
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row[:fixed], widths, strict=True))
        ]
        lines.append("  ".join([*cells, *row[fixed:]]).rstrip())
    return lines
