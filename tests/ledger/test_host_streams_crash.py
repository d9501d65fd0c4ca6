"""A host feeding a graph's root stream and reading its outlet, killed with SIGKILL at random moments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ledger import LedgerEnv, inspect_ledger

from ._kills import ROOT, killed_until_landed

EXAMPLE = ROOT / "examples" / "host_desk.py"
ORDERS = 200
ANSWER = "billed=1799 mailed=200 mailed_total=1799"  # what an uninterrupted run prints


def example(path: Path) -> list[str]:
    return [sys.executable, str(EXAMPLE), str(path), "desk-1", str(ORDERS)]


def streams(path: Path) -> dict[str, dict[str, Any]]:
    env = LedgerEnv.open_readonly(path)
    try:
        report = inspect_ledger(env, values=True)
    finally:
        env.close()
    return {s["key"]: s for s in report["streams"]}


def frontiers_at_n(path: Path, landed: int) -> None:
    """Every group read every message once: the host's writer sent each order once, its reader acked all."""
    held = streams(path)
    orders, invoices = held["orders"], held["invoices"]
    assert (orders["node"], orders["appended"], orders["finished"]) == ("host", ORDERS, True)
    assert [(g["group"], g["acked_through"]) for g in orders["groups"]] == [("billing", ORDERS)]
    assert invoices["appended"] == ORDERS and invoices["finished"]
    [mailer] = invoices["groups"]
    assert (mailer["group"], mailer["acked_through"], mailer["pending"]) == ("mailer", ORDERS, 0)
    assert mailer["state"] == {"count": ORDERS, "total": 1799}


def test_an_uninterrupted_host_run_gives_the_answer_and_a_second_call_only_reads_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    first = subprocess.run(example(ledger), capture_output=True, text=True, check=True, timeout=120)
    assert first.stdout.strip() == f"{ANSWER} (ran)"
    again = subprocess.run(example(ledger), capture_output=True, text=True, check=True, timeout=120)
    assert again.stdout.strip() == f"{ANSWER} (already finished)"
    frontiers_at_n(ledger, 0)


def test_killed_at_random_moments_the_host_streams_end_with_every_effect_once(tmp_path: Path) -> None:
    killed_until_landed(
        tmp_path,
        example,
        expected=f"{ANSWER} (already finished)",
        env={**os.environ, "ORDER_DELAY": "0.005"},
        max_delay=1.5,
        check=frontiers_at_n,
    )
