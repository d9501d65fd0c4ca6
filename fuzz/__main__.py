"""``python -m fuzz --minutes N``: run the ledger's stateful machines for N minutes.

It imports the machines of the test suite (``tests/ledger/stateful.py`` for
streams, ``tests/ledger/node_machine.py`` for random graphs in checkpoint
mode crashed, cancelled by the host and faulted at any hook call, with node
code that swallows cancellations, early readers, retried writers and
resumes with another aspect chain) and runs them in rounds with fresh seeds
and longer programs than the suite does, cycling through the stores, the
lockstep machine and the event loops, until the time is up. ``--only nodes``
runs only the machines whose name holds ``nodes`` (``lmdb``, ``trio``,
``lockstep``, ... pick others). A failure prints hypothesis's shrunk program
and exits 1. ``--only keyflips`` runs the whole key-flip sweep instead
(:mod:`fuzz.keyflips`, every bit of every key byte), once.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from tests.ledger.node_machine import NodeMachine
from tests.ledger.stateful import LedgerMachine, LockstepMachine


def machines() -> list[type[RuleBasedStateMachine]]:
    found: list[type[RuleBasedStateMachine]] = []
    for backend in ("asyncio", "trio"):
        for kind in ("lmdb", "memory"):
            found.append(type(f"Fuzz_{kind}_{backend}", (LedgerMachine,), {"kind": kind, "backend": backend}))
            found.append(
                type(f"Fuzz_nodes_{kind}_{backend}", (NodeMachine,), {"kind": kind, "backend": backend})
            )
        found.append(
            type(f"Fuzz_postgres_{backend}", (LedgerMachine,), {"kind": "postgres", "backend": backend})
        )
        found.append(type(f"Fuzz_lockstep_{backend}", (LockstepMachine,), {"backend": backend}))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fuzz", description="Run the ledger's stateful machines for a while."
    )
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to run (default 5)")
    parser.add_argument("--steps", type=int, default=60, help="rules per program (default 60)")
    parser.add_argument("--examples", type=int, default=25, help="programs per round (default 25)")
    parser.add_argument(
        "--only", default="", help="run only the machines whose name holds this (nodes, lmdb, trio, ...)"
    )
    args = parser.parse_args(argv)
    if args.only == "keyflips":  # a sweep, not a machine: it runs once, whole
        from fuzz.keyflips import main as keyflips

        return keyflips(["--every-bit"])
    chosen = [machine for machine in machines() if args.only in machine.__name__.removeprefix("Fuzz_")]
    if not chosen:
        parser.error(f"no machine's name holds {args.only!r}")
    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    for machine in itertools.cycle(chosen):
        if time.monotonic() >= deadline:
            break
        rounds += 1
        started = time.monotonic()
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=args.examples,
                stateful_step_count=args.steps,
                deadline=None,
                database=None,
                phases=[Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            ),
        )
        print(
            f"round {rounds}: {machine.__name__.removeprefix('Fuzz_')}, "
            f"{args.examples} programs of up to "
            f"{args.steps} rules, {time.monotonic() - started:.1f}s, no counterexample",
            flush=True,
        )
    print(f"fuzz: {rounds} rounds in {args.minutes} minutes, no counterexample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
