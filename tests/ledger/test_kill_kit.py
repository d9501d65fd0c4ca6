"""ledger.testing: the kill loop and the history check users run on their own pipelines, on the demo."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fuzz.kill import one_round
from ledger import open_ledger
from ledger.testing import HistoryViolation, LedgerHistory
from streams import Key, Stream, open_scope


def test_fifty_kills_of_the_demo_leave_a_sound_history_and_the_exact_answer() -> None:
    # the round python -m fuzz.kill repeats: 50 kills over a million orders, the history checked
    # after each, the exact answer at the end (it raises HistoryViolation otherwise)
    assert one_round(kills=50, seed=20261130) == 50


async def test_the_history_check_fails_when_a_frontier_moves_back(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    numbers = Key("numbers", Stream[int])
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(numbers, node="src", groups=("g",))
        for n in range(3):
            await stream.writer().send(n)
        await stream.writer().flush()
        await stream.reader("g").ack(1)
        await stream.reader("g").ack(2)
    history = LedgerHistory(path)
    await anyio.to_thread.run_sync(history.observe)
    moved = tmp_path / "older"
    # another ledger whose frontier is behind: what a lost commit would look like
    async with open_ledger(moved) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(numbers, node="src", groups=("g",))
        for n in range(3):
            await stream.writer().send(n)
        await stream.writer().flush()
        await stream.reader("g").ack(1)
    history.path = moved
    with pytest.raises(HistoryViolation, match="group 'g': the frontier went back from 2 to 1"):
        await anyio.to_thread.run_sync(history.observe)
