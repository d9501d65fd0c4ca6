"""ledger.testing: the kill loop and the history check users run on their own pipelines, on the demo."""

from __future__ import annotations

from pathlib import Path

import anyio
import lmdb
import pytest

from fuzz import kill, workload
from fuzz.kill import MAX_DELAY, one_round, shorter
from ledger import LedgerEnv, UnfinishedLedgerError, open_ledger
from ledger.testing import HistoryViolation, LedgerHistory
from streams import Key, Stream, open_scope


def test_twenty_kills_of_the_workload_leave_a_sound_history_and_the_exact_answer() -> None:
    # the round python -m fuzz.kill repeats (100 kills a round of 150,000 orders, for as long as it
    # is given): the history and one transaction per message checked after each kill, the exact
    # answer at the end (it raises HistoryViolation otherwise). Twenty kills reach about the first
    # 10,000 orders (each run reopens the ledger before it handles more), so a round of 30,000
    # meets the same kills and spends less on the orders after the last; a machine fast enough to
    # finish a round before its kills starts another, with half the delay (fuzz.kill.shorter)
    landed, delay = 0, MAX_DELAY
    for seed in range(20261130, 20261130 + 8):
        asked = 20 - landed
        here = one_round(kills=asked, seed=seed, messages=30_000, max_delay=delay)
        landed += here
        if landed == 20:
            break
        delay = shorter(delay, landed=here, asked=asked)
    assert landed == 20


def test_the_workload_check_catches_an_output_without_its_ack(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    assert workload.main([str(path), "--messages", "3500"]) == 0
    streams = workload.read(path)
    workload.check_answer(streams, 3500)  # the poisoned alert exhausted, every other stage exact
    assert [g["exhausted"] for g in streams["alerts"]["groups"]] == [1]
    streams["invoices"]["appended"] -= 1  # an invoice lost while its order stays billed
    with pytest.raises(workload.WorkloadViolation, match="invoices appended vs orders billed"):
        workload.check_confirmed(streams)
    streams["invoices"]["appended"] += 1
    [billing, _] = streams["orders"]["groups"]
    billing["state"] = {**billing["state"], "total": billing["state"]["total"] + 1}  # a state ahead
    with pytest.raises(workload.WorkloadViolation, match="billing state"):
        workload.check_confirmed(streams)


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


def test_a_ledger_killed_while_it_was_created_is_an_empty_history_not_damage(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    LedgerEnv.open(path).close()
    env = lmdb.open(str(path), max_dbs=16)  # as if killed before the named databases were made
    with env.begin(write=True) as txn:
        for name in (b"keyed", b"keyed_log"):  # the last two it makes
            txn.drop(env.open_db(name, txn=txn), delete=True)
    env.close()
    history = LedgerHistory(path)
    history.observe()  # nothing confirmed yet: no violation
    assert history.observations == 0
    LedgerEnv.open(path).close()  # the next run completes the creation
    history.observe()
    assert history.observations == 1


def test_a_kill_while_the_ledger_was_created_confirms_nothing_to_check(tmp_path: Path) -> None:
    # the shorter delays of a fast machine land kills before the workload's first commit
    path = tmp_path / "ledger"

    class Killed(Exception):
        pass

    def killed_at(step: str) -> None:
        if step == "schema":
            raise Killed

    with pytest.raises(Killed):
        LedgerEnv.open(path, on_creation_step=killed_at)
    with pytest.raises(UnfinishedLedgerError):
        workload.read(path)
    kill._confirmed(path, seed=1)  # nothing confirmed yet: nothing to hold it against
