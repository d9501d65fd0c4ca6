"""``python -m fuzz.bitflips [--flips N | --every] [--seed S]``: the bit-flip suite, longer.

It runs the test suite's bit-flip child (``tests/ledger/bitflip_child.py``):
a ledger holding every kind of record, compacted so every page is in use,
each flip in a fresh copy, read as a user would. ``--every`` flips every bit
of every page (about 300,000 flips, a quarter of an hour here). A signal,
a traceback or other data read back is a failure: it prints the flip and
exits 1.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.ledger.test_bitflips import ALLOWED

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.bitflips", description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=20_000, help="seeded random flips (default 20000)")
    parser.add_argument("--every", action="store_true", help="flip every bit of every page instead")
    parser.add_argument("--seed", type=int, default=1, help="the random flips' seed (default 1)")
    args = parser.parse_args(argv)
    flips = "all" if args.every else str(args.flips)
    with tempfile.TemporaryDirectory(prefix="bitflips-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "tests.ledger.bitflip_child", tmp, str(args.seed), flips],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    outcomes = collections.Counter(line["outcome"] for line in lines if "outcome" in line)
    print(
        f"bitflips: {sum(outcomes.values())} flips: "
        + ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
    )
    bad = [line for line in lines if "outcome" in line and line["outcome"] not in ALLOWED]
    if done.returncode != 0 or bad:
        last = lines[-1] if lines else None
        print(f"FAILED: exit {done.returncode}; {bad[:3] or last}; {done.stderr[-500:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
