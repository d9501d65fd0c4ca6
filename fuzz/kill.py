"""``python -m fuzz.kill --minutes N``: kill a multi-stage workload at random moments, round after round.

Each round runs ``python -m fuzz.workload`` (:mod:`fuzz.workload`: four
streams, five groups, handlers that fail on chosen messages, one poisoned
message exhausted for good, outputs that name their order) on a fresh
ledger, kills it ``--kills`` times at random moments, and after every kill
checks the ledger's history (``ledger.testing``: sound, nothing moved back,
no budget refilled) and what one transaction per message implies
(:func:`fuzz.workload.check_confirmed`). At the end it requires the exact
answer. It prints the kills made and exits 1 at the first violation.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from ledger import UnfinishedLedgerError
from ledger.testing import HistoryViolation, LedgerHistory, kill_until_done

from .workload import WorkloadViolation, check_answer, check_confirmed, read

ROOT = Path(__file__).resolve().parents[1]
#: Orders per round: enough that the workload rarely finishes before its kills.
N = 150_000
#: The longest a run of the workload lives before its kill. Longer than the interpreter's start and the
#: ledger's open (a second on a loaded 2-core machine), so that kills land inside the handlers'
#: transactions, not only in the start of a process that has not opened the ledger yet.
MAX_DELAY = 1.6


def one_round(kills: int, seed: int, *, messages: int = N, max_delay: float = MAX_DELAY) -> int:
    """One fresh ledger killed up to ``kills`` times, checked after each; returns the kills that landed.

    Each run is killed after a random delay of up to ``max_delay`` seconds. Fewer kills land when
    the workload finishes first: a machine that fast needs a shorter delay (:func:`shorter`).
    Raises :class:`HistoryViolation`.
    """
    with tempfile.TemporaryDirectory(prefix="kill-") as tmp:
        path = Path(tmp) / "ledger"
        history = LedgerHistory(path)

        def after_kill() -> None:
            history.observe()
            if (path / "data.mdb").exists():
                _confirmed(path, seed)

        command = [sys.executable, "-m", "fuzz.workload", str(path), "--messages", str(messages)]
        landed = kill_until_done(
            command, kills=kills, max_delay=max_delay, seed=seed, after_kill=after_kill, cwd=ROOT
        )
        history.observe()
        try:
            check_answer(read(path), messages)
        except WorkloadViolation as wrong:
            raise HistoryViolation(
                f"round {seed}: the workload did not end with the exact answer: {wrong}"
            ) from None
        return landed


def shorter(max_delay: float, *, landed: int, asked: int) -> float:
    """The delay for the next round: half as long when the workload finished before its kills.

    The kills then land in the run on a machine of any speed, not only on one as slow as the
    delay was chosen for.
    """
    return max_delay / 2 if landed < asked else max_delay


def _confirmed(path: Path, seed: int) -> None:
    try:
        streams = read(path)
    except UnfinishedLedgerError:  # killed while the ledger was created: nothing confirmed yet
        return
    try:
        check_confirmed(streams)
    except WorkloadViolation as wrong:
        raise HistoryViolation(f"round {seed}, after a kill: {wrong}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.kill", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    parser.add_argument("--kills", type=int, default=100, help="kills per round (default 100)")
    parser.add_argument(
        "--messages", type=int, default=N, help=f"the workload's messages a round (default {N})"
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    total = rounds = 0
    seeds = random.Random()
    delay = MAX_DELAY
    try:
        while time.monotonic() < deadline:
            seed = seeds.randrange(2**32)
            landed = one_round(args.kills, seed, messages=args.messages, max_delay=delay)
            delay = shorter(delay, landed=landed, asked=args.kills)
            total += landed
            rounds += 1
            print(f"round {rounds} (seed {seed}): {total} kills so far, exact answer", flush=True)
    except HistoryViolation as violation:
        print(f"FAILED after {total} kills: {violation}", file=sys.stderr)
        return 1
    print(f"fuzz.kill: {total} kills in {rounds} rounds, every history sound, every answer exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
