"""``python -m fuzz.restarts --minutes N``: stop a PostgreSQL server under its workers, round after round.

Each round submits runs to a new ledger (a schema of its own on a private
server), starts two worker processes, stops the server with ``pg_ctl stop
-m immediate`` at random moments and starts it again after a random time,
then requires every run to end with its answer and no lease left: the
suite's ``test_a_server_stopped_at_random_moments_of_a_run_loses_nothing``
(it is imported, not copied), with more runs and more stops. It prints each
round's seed, and exits 1 at the first round that fails (run that seed
again with ``--seed``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from ledger.postgres.server import private_server
from tests.ledger.test_postgres_restarts import new_url, restarts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fuzz.restarts", description="Stop a PostgreSQL server under its workers, at random."
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to run (default 5)")
    parser.add_argument("--runs", type=int, default=12, help="runs per round (default 12)")
    parser.add_argument("--stops", type=int, default=4, help="server stops per round (default 4)")
    parser.add_argument("--seed", type=int, help="run one round with this seed")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    with private_server() as server:
        while rounds == 0 or (args.seed is None and time.monotonic() < deadline):
            seed = args.seed if args.seed is not None else random.randrange(2**32)
            rounds += 1
            started = time.monotonic()
            try:
                restarts(server, new_url(server), random.Random(seed), runs=args.runs, stops=args.stops)
            except AssertionError as failed:
                print(f"round {rounds} (--seed {seed}) failed: {failed}", flush=True)
                return 1
            print(
                f"round {rounds} (seed {seed}): {time.monotonic() - started:.1f}s, every run exact",
                flush=True,
            )
    print(f"restarts: {rounds} rounds, every run exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
