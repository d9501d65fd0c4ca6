"""A stream's append-time marks against a model that knows every message's append time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams._store._marks import MARK_SPACING_MS, MAX_MARKS, appended_at, marked

#: Batches: (messages in it, milliseconds since the batch before), and where compaction got to.
batches = st.lists(
    st.tuples(st.integers(1, 50), st.integers(0, 3 * MARK_SPACING_MS), st.integers(0, 100)),
    min_size=1,
    max_size=400,
)


@given(batches)
def test_a_message_is_never_said_to_be_newer_than_it_is_and_marks_stay_few(
    plan: list[tuple[int, int, int]],
) -> None:
    marks: tuple[int, ...] = ()
    appended: list[int] = []  # each message's true append time, seq = index + 1
    now, compacted, thinned = 1_700_000_000_000, 0, False
    for size, wait, compact in plan:
        now += wait
        first = len(appended) + 1
        before = len(marks)
        marks = marked(marks, first, now, compacted)
        thinned = thinned or len(marks) < before
        appended.extend([now] * size)
        compacted = min(len(appended), compacted + compact)
        assert len(marks) // 2 <= MAX_MARKS + 1
        seqs = marks[::2]
        assert list(seqs) == sorted(set(seqs)) and list(marks[1::2]) == sorted(marks[1::2])
    for seq in range(compacted + 1, len(appended) + 1):
        at = appended_at(marks, seq)
        assert at is not None and at * 1000 <= appended[seq - 1]  # never hides how old it is
        if not thinned:
            assert appended[seq - 1] - at * 1000 < MARK_SPACING_MS  # to within a mark's spacing


def test_a_stream_without_marks_knows_no_time() -> None:
    assert appended_at((), 1) is None
    assert marked((), 1, 5_000, 0) == (1, 5_000)
    assert marked((1, 5_000), 4, 5_500, 0) == (1, 5_000)  # within the spacing: no new mark
    assert marked((1, 5_000), 4, 6_000, 0) == (1, 5_000, 4, 6_000)
    assert marked((1, 5_000, 4, 6_000, 9, 8_000), 12, 8_100, 3) == (4, 6_000, 9, 8_000)  # 1-3 compacted
    assert marked((1, 5_000, 4, 6_000, 9, 8_000), 12, 8_100, 8) == (9, 8_000)
