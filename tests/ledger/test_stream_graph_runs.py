"""The orders fan-out example (one stream, three Sub aliases, one nested) killed with SIGKILL, resumed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._kills import ROOT, killed_until_landed

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
    killed_until_landed(
        tmp_path,
        example,
        expected=f"{ANSWER} (already finished)",
        env={**os.environ, "ORDER_DELAY": "0.005"},
        max_delay=1.5,
    )
