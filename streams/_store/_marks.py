"""When a stream's messages were appended: sparse time marks kept in its descriptor.

A stream keeps no time per message (that would be eight more bytes each on
the hot path); its descriptor keeps *marks* instead, ``(seq, unix ms)``
pairs, flat: the first message of an append batch and its time, whenever
at least :data:`MARK_SPACING_MS` passed since the last mark. A message was
appended at or after the time of the last mark at or below its sequence,
and less than that spacing after it while marks are dense, so
:func:`appended_at` of a message is an upper bound on its age to about a
second. Marks of compacted messages go (one stays below the first kept
message), and past :data:`MAX_MARKS` the older half is thinned to every
other mark: the descriptor stays small however far a group lags, and the
ages of the oldest messages grow coarser, never wrong in the direction of
hiding lag.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Final

__all__ = ["MARK_SPACING_MS", "MAX_MARKS", "appended_at", "marked"]

#: Milliseconds between two marks of a stream at least.
MARK_SPACING_MS: Final = 1000
#: The most marks a descriptor keeps.
MAX_MARKS: Final = 64


def marked(marks: tuple[int, ...], first_seq: int, now_ms: int, compacted_through: int) -> tuple[int, ...]:
    """``marks`` after an append of messages from ``first_seq`` at ``now_ms``; the same tuple if unchanged."""
    count = len(marks) // 2
    start = 0
    while start + 1 < count and marks[2 * (start + 1)] <= compacted_through + 1:
        start += 1  # the next mark is at or below the first message kept: this one is of compacted ones
    due = count == 0 or now_ms - marks[-1] >= MARK_SPACING_MS
    if start == 0 and not due:
        return marks
    kept = marks[2 * start :] + ((first_seq, now_ms) if due else ())
    if len(kept) // 2 > MAX_MARKS:
        pairs = [kept[i : i + 2] for i in range(0, len(kept), 2)]
        half = len(pairs) // 2
        kept = tuple(x for pair in pairs[:half:2] + pairs[half:] for x in pair)
    return kept


def appended_at(marks: tuple[int, ...], seq: int) -> float | None:
    """When message ``seq`` was appended at the earliest (Unix seconds), by ``marks``; None before any."""
    seqs = marks[::2]
    i = bisect_right(seqs, seq) - 1
    return None if i < 0 else marks[2 * i + 1] / 1000
