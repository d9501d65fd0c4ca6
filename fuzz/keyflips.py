"""``python -m fuzz.keyflips [--sample N] [--every-bit]``: the key-flip sweep, whole.

It runs the test suite's key-flip child (``tests/ledger/keyflip_child.py``):
a demo killed mid-run, a finished demo and durable graph runs, and each key
byte of their live pages (every database, leaf and branch keys, LMDB's main
database and free list) flipped in a fresh copy, opened without ``check`` by
``inspect``, ``messages``, the resumed demo and the graph resumed. By default it
flips one bit of every key byte (a few seconds here); ``--every-bit`` flips
each of the eight (half a minute), ``--sample N`` at most N bytes a database.
Anything but the reference figures or a typed refusal that wrote nothing
prints the flip and exits 1. ``python -m fuzz --only keyflips`` runs it too.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.ledger.test_keyflips import ALLOWED

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.keyflips", description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=None, help="at most N key bytes a database")
    parser.add_argument("--every-bit", action="store_true", help="flip each bit of a byte, not one")
    args = parser.parse_args(argv)
    sample = "all" if args.sample is None else str(args.sample)
    with tempfile.TemporaryDirectory(prefix="keyflips-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "tests.ledger.keyflip_child", tmp, sample, "8" if args.every_bit else "1"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    flips = [line for line in lines if "outcome" in line]
    for ledger in dict.fromkeys(line["ledger"] for line in flips):
        outcomes = collections.Counter(line["outcome"] for line in flips if line["ledger"] == ledger)
        print(
            f"keyflips: {ledger}: {sum(outcomes.values())} runs: "
            + ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
        )
    bad = [line for line in flips if line["outcome"] not in ALLOWED]
    if done.returncode != 0 or bad:
        last = lines[-1] if lines else None
        print(f"FAILED: exit {done.returncode}; {bad[:3] or last}; {done.stderr[-500:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
