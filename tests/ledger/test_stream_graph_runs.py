"""The orders fan-out example (one stream, three Sub aliases, one nested) killed with SIGKILL, resumed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ledger._check import check_ledger
from ledger._env import LedgerEnv
from ledger.testing import LedgerHistory, kill_until_done

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "orders_fanout.py"
ORDERS = 200
ANSWER = "billed=1799 audited=200 heavy=82"  # what an uninterrupted run prints


def example(path: Path) -> list[str]:
    return [sys.executable, str(EXAMPLE), str(path), "run-1", str(ORDERS)]


def test_an_uninterrupted_run_gives_the_answer_and_a_second_call_only_reads_it(tmp_path: Path) -> None:
    first = subprocess.run(
        example(tmp_path / "ledger"), capture_output=True, text=True, check=True, timeout=120
    )
    assert first.stdout.strip() == f"{ANSWER} (ran)"
    again = subprocess.run(
        example(tmp_path / "ledger"), capture_output=True, text=True, check=True, timeout=120
    )
    assert again.stdout.strip() == f"{ANSWER} (already finished)"


def test_killed_at_random_moments_the_fanout_ends_with_the_uninterrupted_answer(tmp_path: Path) -> None:
    landed = 0
    for attempt in range(10):  # a run that finishes before its kills starts over on a new ledger
        path = tmp_path / f"ledger-{attempt}"
        history = LedgerHistory(path)
        command = example(path)
        landed += kill_until_done(
            command,
            kills=5,
            max_delay=1.5,
            seed=20261130 + attempt,
            after_kill=history.observe,  # sound after every kill, nothing moved back
            cwd=ROOT,
            env={**os.environ, "ORDER_DELAY": "0.005"},
        )
        history.observe()
        final = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
        assert final.stdout.strip() == f"{ANSWER} (already finished)"
        env = LedgerEnv.open_readonly(path)
        try:
            report = check_ledger(env)
        finally:
            env.close()
        assert report.sound, report.problems
        if landed >= 5:
            break
    assert landed >= 5
