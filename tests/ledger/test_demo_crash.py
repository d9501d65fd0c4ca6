"""Kill ``python -m ledger demo`` with SIGKILL at random moments; it must end with the uninterrupted answer.

The kills come from the crash-testing kit users have (``ledger.testing``):
``kill_until_done`` kills the demo at random moments and lets the last run
finish; after every kill ``LedgerHistory`` requires a sound ledger that never
went back, and this test requires one transaction per message: billing's
frontier, its committed state and the invoices it sent agree exactly, and
audit is never ahead of the invoices.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger import LedgerEnv, UnfinishedLedgerError, inspect_ledger
from ledger.testing import LedgerHistory, kill_until_done

ROOT = Path(__file__).resolve().parents[2]
N = 400_000
KILLS = 8
#: The longest a run of the demo lives before its kill: past the interpreter's start and the ledger's
#: open (about a second on a loaded 2-core machine), so that kills land while it bills and audits.
MAX_DELAY = 1.6


def inspect(path: Path) -> dict[str, dict[str, Any]]:
    env = LedgerEnv.open(path, create=False)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    return {s["key"]: s for s in report["streams"]}


def check_one_transaction_per_message(streams: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """The invariants a kill at any instant must leave; returns (billed, audited)."""
    orders = streams["orders"]
    [billing] = orders["groups"]
    if "invoices" not in streams:  # killed before node billing opened it: it billed nothing yet
        assert billing["acked_through"] == 0 and not orders["failed"]
        return 0, 0
    invoices = streams["invoices"]
    [audit] = invoices["groups"]
    billed, audited = billing["acked_through"], audit["acked_through"]
    assert billed <= orders["appended"] <= N
    # one commit confirms billing's ack, its state and its invoice together
    assert invoices["appended"] == billed
    assert billing["state"] in (None, {"total": billed * (billed + 1) // 2, "count": billed})
    assert billing["pending"] == orders["appended"] - billed
    assert audited <= invoices["appended"]
    assert audit["state"] in (None, {"count": audited})
    assert billing["exhausted"] == audit["exhausted"] == 0
    assert not orders["failed"] and not invoices["failed"]
    return billed, audited


def assert_uninterrupted_answer(path: Path) -> tuple[int, int]:
    """The figures of an uninterrupted run; returns the generations the two streams reached.

    Each stream is opened by its writer node when that node starts, so a kill
    between the two opens raises one generation and not the other.
    """
    streams = inspect(path)
    orders, invoices = streams["orders"], streams["invoices"]
    assert orders["appended"] == invoices["appended"] == N
    assert orders["finished"] and invoices["finished"]
    assert orders["generation"] >= 1 and invoices["generation"] >= 1
    [billing] = orders["groups"]
    [audit] = invoices["groups"]
    assert billing["acked_through"] == audit["acked_through"] == N
    assert billing["pending"] == audit["pending"] == 0
    assert billing["state"] == {"total": N * (N + 1) // 2, "count": N}
    assert audit["state"] == {"count": N}
    return int(orders["generation"]), int(invoices["generation"])


@pytest.mark.slow
def test_demo_killed_at_random_moments_ends_with_the_uninterrupted_answer(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    path = tmp_path / "ledger"
    history = LedgerHistory(path)
    frontiers: list[tuple[int, int]] = []

    def after_kill() -> None:
        history.observe()
        if not (path / "data.mdb").exists():
            return
        try:
            streams = inspect(path)
        except UnfinishedLedgerError:  # killed while the ledger was created: nothing confirmed yet
            assert not frontiers
            return
        if "orders" in streams:
            frontiers.append(check_one_transaction_per_message(streams))

    command = [sys.executable, "-m", "ledger", "demo", str(path), "--messages", str(N)]
    landed = kill_until_done(
        command, kills=KILLS, max_delay=MAX_DELAY, seed=seed, after_kill=after_kill, cwd=ROOT
    )
    print(f"{landed} kills landed; billed and audited after each: {frontiers}")
    assert landed >= 1
    history.observe()
    generation = assert_uninterrupted_answer(path)

    before = (path / "data.mdb").read_bytes()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and "already finished; nothing changed" in again.stdout, again.stderr
    assert (path / "data.mdb").read_bytes() == before
    assert assert_uninterrupted_answer(path) == generation
