"""``python -m fuzz.kill --minutes N``: kill the demo with SIGKILL at random moments, round after round.

Each round runs ``python -m ledger demo`` on a fresh ledger of a million
orders (two stages: billing keeps a running total and sends an invoice per
order, audit counts invoices), kills it ``--kills`` times at random moments,
checks the ledger's history after every kill (``ledger.testing``), and at
the end requires the exact answer. It prints the kills made and exits 1 at
the first violation.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from ledger import LedgerEnv, inspect_ledger
from ledger.testing import HistoryViolation, LedgerHistory, kill_until_done

ROOT = Path(__file__).resolve().parents[1]
N = 1_000_000


def one_round(kills: int, seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="kill-") as tmp:
        path = Path(tmp) / "ledger"
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
            command, kills=kills, max_delay=0.6, seed=seed, after_kill=history.observe, cwd=ROOT
        )
        history.observe()
        env = LedgerEnv.open_readonly(path)
        try:
            streams = {s["key"]: s for s in inspect_ledger(env)["streams"]}
        finally:
            env.close()
        state = streams["orders"]["groups"][0]["state"]
        if state != {"total": N * (N + 1) // 2, "count": N} or streams["invoices"]["appended"] != N:
            raise HistoryViolation(f"round {seed}: the demo ended with {state}, not the exact answer")
        return landed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.kill", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    parser.add_argument("--kills", type=int, default=100, help="kills per round (default 100)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    total = rounds = 0
    seeds = random.Random()
    try:
        while time.monotonic() < deadline:
            seed = seeds.randrange(2**32)
            total += one_round(args.kills, seed)
            rounds += 1
            print(f"round {rounds} (seed {seed}): {total} kills so far, exact answer", flush=True)
    except HistoryViolation as violation:
        print(f"FAILED after {total} kills: {violation}", file=sys.stderr)
        return 1
    print(f"fuzz.kill: {total} kills in {rounds} rounds, every history sound, every answer exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
