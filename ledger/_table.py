"""Tables of the command line: rows of text as aligned columns."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Paint", "aligned"]

#: How a cell is shown, given its row, its column and its text: its text with colour codes, or as it is.
Paint = Callable[[int, int, str], str]


def aligned(
    rows: Sequence[tuple[str, ...]], *, left: int, ragged_last: bool = False, paint: Paint | None = None
) -> list[str]:
    """Rows as lines of columns two spaces apart: the first ``left`` aligned left, the others right.

    With ``ragged_last`` the last column (free text) is not padded.
    ``paint`` colours a cell's text once the widths are counted, so the
    columns line up on a terminal as they do in a pipe.
    """
    fixed = len(rows[0]) - ragged_last
    widths = [max(len(row[i]) for row in rows) for i in range(fixed)]
    lines = []
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            shown = cell if paint is None else paint(r, i, cell)
            pad = " " * (widths[i] - len(cell)) if i < fixed else ""
            cells.append(shown + pad if i < left else pad + shown)
        lines.append("  ".join(cells).rstrip())
    return lines
