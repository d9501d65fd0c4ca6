"""Kill ``python -m ledger demo`` with SIGKILL at random moments; it must end with the uninterrupted answer.

Each kill moment is chosen from the demo's own progress: the test reads its
progress lines from a pipe and kills it after a random number of them, plus
a random fraction of a reporting interval, so the kill lands anywhere in a
commit batch. After every kill the ledger must hold one transaction per
message: billing's frontier, its committed state and the invoices it sent
agree exactly, and audit is never ahead of the invoices.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from ledger import LedgerEnv, inspect_ledger

ROOT = Path(__file__).resolve().parents[2]
N = 50_000
KILLS = 4
INTERVAL = 0.05
#: How long any one wait on the demo may take before the test gives up.
PATIENCE = 60.0


def inspect(path: Path) -> dict[str, dict[str, Any]]:
    env = LedgerEnv.open(path, create=False)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    return {s["key"]: s for s in report["streams"]}


def check_one_transaction_per_message(streams: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """The invariants a kill at any instant must leave; returns (billed, audited)."""
    orders, invoices = streams["orders"], streams["invoices"]
    [billing] = orders["groups"]
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
    assert orders["generation"] == invoices["generation"]
    return billed, audited


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class Demo:
    """One ``python -m ledger demo`` process whose stderr lines arrive on a queue."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "ledger", "demo", str(path)),
                *("--messages", str(N), "--progress-interval", str(INTERVAL)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stderr is not None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._out = ""
        self._ended = False  # the pump reached the end of stderr
        self._reader = threading.Thread(target=_pump, args=(self.process.stderr, self.lines), daemon=True)
        self._reader.start()

    def wait_progress(self, count: int) -> bool:
        """Wait for ``count`` more progress lines; False if the demo ended first."""
        seen = 0
        while seen < count:
            line = self.lines.get(timeout=PATIENCE)
            if line is None:
                self._ended = True
                return False
            self.stderr.append(line)
            if line.startswith("progress: "):
                seen += 1
        return True

    def kill(self) -> None:
        """Send SIGKILL (the demo may have ended just before it lands)."""
        os.kill(self.process.pid, signal.SIGKILL)

    def finish(self) -> tuple[int, str]:
        """Wait for the demo to end; its exit code and stdout."""
        self._finish_reading()
        self.process.wait(timeout=PATIENCE)
        return self.process.returncode, self._out

    def _finish_reading(self) -> None:
        while not self._ended:
            line = self.lines.get(timeout=PATIENCE)
            if line is None:
                self._ended = True
            else:
                self.stderr.append(line)
        self._reader.join(timeout=PATIENCE)
        assert self.process.stdout is not None and self.process.stderr is not None
        self._out = self.process.stdout.read()
        self.process.stdout.close()
        self.process.stderr.close()


def assert_uninterrupted_answer(path: Path, *, generation: int) -> None:
    streams = inspect(path)
    orders, invoices = streams["orders"], streams["invoices"]
    assert orders["appended"] == invoices["appended"] == N
    assert orders["finished"] and invoices["finished"]
    assert orders["generation"] == invoices["generation"] == generation
    [billing] = orders["groups"]
    [audit] = invoices["groups"]
    assert billing["acked_through"] == audit["acked_through"] == N
    assert billing["pending"] == audit["pending"] == 0
    assert billing["state"] == {"total": N * (N + 1) // 2, "count": N}
    assert audit["state"] == {"count": N}


@pytest.mark.slow
def test_demo_killed_at_random_moments_ends_with_the_uninterrupted_answer(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"seed {seed}")
    rng = random.Random(seed)
    deadline = time.monotonic() + 45
    most_reports = 6  # halved whenever a demo finishes first, so faster machines still get their kills
    for attempt in range(100):
        # a fresh ledger each time a demo finished before it was killed KILLS times
        path = tmp_path / f"ledger-{attempt}"
        opens = 0  # runs that opened the streams; each raises the generation once
        kills = 0
        last = (0, 0)
        while True:
            assert time.monotonic() < deadline, f"the kills did not land in time (seed {seed})"
            demo = Demo(path)
            reports = rng.randint(1, most_reports)
            if kills < KILLS and demo.wait_progress(reports):
                # anywhere within the next reporting interval, not on a report's boundary
                time.sleep(rng.uniform(0, INTERVAL))
                demo.kill()
            code, out = demo.finish()
            stderr = "".join(demo.stderr)
            assert "Traceback" not in stderr, stderr
            if code == -signal.SIGKILL:
                kills += 1
                opens += 1
                streams = inspect(path)
                assert streams["orders"]["generation"] == opens
                billed, audited = check_one_transaction_per_message(streams)
                assert billed >= last[0] and audited >= last[1], "a frontier moved back"
                last = (billed, audited)
                print(f"kill {kills}: after {reports} reports, billed {billed}, audited {audited}")
                continue
            assert code == 0, stderr
            if "already finished; nothing changed" in out:
                print("the last kill landed after the demo finished")
            else:
                opens += 1
                n = N
                figures = f"{n} orders, billing total {n * (n + 1) // 2}, {n} invoices, audit count {n}"
                assert out.startswith(f"demo finished: {figures}; "), out
                assert ("(resumed; " in out) == (kills > 0), out
            assert_uninterrupted_answer(path, generation=opens)
            break
        if kills == KILLS:
            break
        most_reports = max(1, most_reports // 2)
        print(f"the demo finished after {kills} kills; starting over")

    before = (path / "data.mdb").read_bytes()
    again = Demo(path)
    code, out = again.finish()
    assert code == 0 and "already finished; nothing changed" in out
    assert (path / "data.mdb").read_bytes() == before
    assert_uninterrupted_answer(path, generation=opens)
