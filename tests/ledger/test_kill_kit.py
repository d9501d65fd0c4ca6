"""ledger.testing: the kill loop and the history check users run on their own pipelines, on the demo."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from ledger import LedgerEnv, inspect_ledger, open_ledger
from ledger.testing import HistoryViolation, LedgerHistory, kill_until_done
from streams import Key, Stream, open_scope

ROOT = Path(__file__).resolve().parents[2]
N = 1_000_000


def test_fifty_kills_of_the_demo_leave_a_sound_history_and_the_exact_answer(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    history = LedgerHistory(path)
    command = [
        sys.executable,
        "-m",
        "ledger",
        "demo",
        str(path),
        "--messages",
        str(N),
        "--progress-interval",
        "60",
    ]
    landed = kill_until_done(
        command, kills=50, max_delay=0.6, seed=20261130, after_kill=history.observe, cwd=ROOT
    )
    assert landed == 50
    assert history.observations >= 40  # a kill before the ledger exists observes nothing
    history.observe()
    env = LedgerEnv.open_readonly(path)
    try:
        streams = {s["key"]: s for s in inspect_ledger(env)["streams"]}
    finally:
        env.close()
    assert streams["orders"]["groups"][0]["state"] == {"total": N * (N + 1) // 2, "count": N}
    assert streams["invoices"]["appended"] == N


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
