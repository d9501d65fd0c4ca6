"""Three member processes share a group on PostgreSQL; one is SIGKILLed, one SIGSTOPped past its lease.

They run ``examples/customer_members.py``, the tutorial's example, with
leases of two seconds, while its producer appends the orders. The killed
member dies while handling; the paused one stops itself inside one of its
transactions (:mod:`tests.ledger.pg_fault_child`), holding its partition's
lease row, either before its commit's statements or just before its
COMMIT, and is let go once the others handled everything: the server has
ended its session meanwhile, so its transaction fails, and it counts that
partition lost and goes on, never ending with the session's error. Every
customer's total is exact: nothing the killed member confirmed is lost,
nothing the paused one did after its partitions were taken over is
confirmed (a late commit there would write totals from its stale cache),
and no partition is left unhandled (the steady member ends only once every
order is handled, and every partition's lag is 0).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ..ledger_command import ledger_command
from . import pg_fault_child
from .test_postgres_workers import _lines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "customer_members.py")
#: Orders: the kill comes once the first member claimed a partition and the pause at a member's third
#: fenced transaction, both early in the run; the rest is what the others take over.
N = 20_000
CUSTOMERS = 1_000


def _run(*args: str) -> subprocess.Popen[str]:
    return _spawn([sys.executable, EXAMPLE, *args])


def _spawn(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_stopped(process: subprocess.Popen[str], timeout: float) -> None:
    """Wait until ``process`` stopped itself (SIGSTOP): the kernel says so, no polling."""
    status: list[int] = []

    def wait() -> None:
        status.append(os.waitpid(process.pid, os.WUNTRACED)[1])

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout)
    assert status, f"the member did not stop within {timeout} s"
    assert os.WIFSTOPPED(status[0]), f"the member ended instead of stopping: status {status[0]}"


def _expected() -> dict[str, int]:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import customer_members as shop
    finally:
        sys.path.pop(0)
    totals: Counter[str] = Counter()
    for i in range(1, N + 1):
        order = shop.order(i, CUSTOMERS)
        totals[order.customer] += order.amount
    return dict(totals)


def _until_claimed(lines: queue.Queue[str], deadline: float) -> list[str]:
    """The lines of a member until it claimed a partition (it is handling it then)."""
    seen: list[str] = []
    while not seen or not seen[-1].endswith(": claimed\n"):
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        assert line, f"the member ended without claiming a partition: {seen}"
        seen.append(line)
    return seen


def _rest(lines: queue.Queue[str]) -> str:
    """What a member that ended printed after the lines already read."""
    out: list[str] = []
    while line := lines.get(timeout=60):
        out.append(line)
    return "".join(out)


@pytest.mark.parametrize("point", ["partition", "commit"])
def test_members_killed_and_paused_past_their_lease_leave_every_total_exact(
    postgres_url: str, tmp_path: Path, point: str
) -> None:
    killed, steady = _run("member", postgres_url, "killed", "2"), _run("member", postgres_url, "steady", "2")
    # stops itself inside a transaction holding its partition's lease row: before its commit's
    # statements (``partition``) or once they ran, before its COMMIT (``commit``)
    paused = _spawn(pg_fault_child.command(tmp_path, point, "member", postgres_url, "paused", "2"))
    members = {"killed": killed, "paused": paused, "steady": steady}
    producer = _run("produce", postgres_url, str(N), str(CUSTOMERS))
    lines = {name: _lines(process) for name, process in members.items()}
    try:
        deadline = time.monotonic() + 120
        _until_claimed(lines["killed"], deadline)
        killed.send_signal(signal.SIGKILL)  # dies while handling: its leases run out, the others take over
        killed.wait()
        _wait_stopped(paused, timeout=120)  # a zombie: alive, silent past its lease, its rows locked
        stopped_in = int((tmp_path / "paused").read_text())
        # safety nets (a loaded machine is slow, not wrong); every exit code is checked below, with what
        # each process said. The steady member ends once every partition is handled to its end; the
        # paused one, resumed, finds its session gone: the transaction it was in fails.
        if producer.wait(timeout=300) == 0 and steady.wait(timeout=300) == 0:
            paused.send_signal(signal.SIGCONT)
            paused.wait(timeout=120)
    finally:
        for process in (*members.values(), producer):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
        errors = {
            name: process.communicate()[1] for name, process in (*members.items(), ("producer", producer))
        }
    assert (producer.returncode, steady.returncode, paused.returncode) == (0, 0, 0), errors
    # resumed, the paused member finds the transaction it was in failed and its partition taken
    # over: it counts that partition lost, and goes on (finding every partition handled to its end)
    out_paused = _rest(lines["paused"])
    assert f"partition {stopped_in}: lost\n" in out_paused, (out_paused, errors["paused"])
    assert out_paused.endswith("\n") and "handled " in out_paused, out_paused
    groups = ledger_command("inspect", postgres_url, "--groups", "--json", check=True)
    rows = json.loads(groups.stdout)
    assert sorted((r["partition"], r["lag"]) for r in rows) == [(f"{p}/4", 0) for p in range(4)]
    totals = subprocess.run(
        [sys.executable, EXAMPLE, "totals", postgres_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(totals.stdout) == _expected()
    import psycopg

    with psycopg.connect(postgres_url) as conn:  # the members that ended gave their rows up
        left = conn.execute("SELECT member FROM streamledger_members WHERE member <> 'killed'").fetchall()
        assert left == []
