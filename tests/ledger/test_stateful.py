"""Run the ledger's stateful machines on the three stores and both event loops."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from .stateful import LedgerMachine, LockstepMachine

SETTINGS = settings(
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
#: A program on PostgreSQL costs the most (a schema made and its tables created for each, a round trip
#: for each call; on the loaded 2-core machine these four machines took 35-67 s each, LMDB's 12-15 s):
#: half the programs here, each as long, and ``python -m fuzz --only postgres`` (or ``lockstep``) runs
#: the same machines 25 programs of 60 rules a round for as long as it is given.
ON_POSTGRES = settings(SETTINGS, max_examples=10)


def _case(machine: type[LedgerMachine] | type[LockstepMachine]) -> object:
    case = machine.TestCase
    if issubclass(machine, LockstepMachine) or machine.kind == "postgres":
        case.settings = ON_POSTGRES
        return pytest.mark.postgres(case)
    case.settings = SETTINGS
    return case


TestLmdbOnAsyncio = _case(type("LmdbOnAsyncio", (LedgerMachine,), {"kind": "lmdb", "backend": "asyncio"}))
TestLmdbOnTrio = _case(type("LmdbOnTrio", (LedgerMachine,), {"kind": "lmdb", "backend": "trio"}))
TestMemoryOnAsyncio = _case(
    type("MemoryOnAsyncio", (LedgerMachine,), {"kind": "memory", "backend": "asyncio"})
)
TestMemoryOnTrio = _case(type("MemoryOnTrio", (LedgerMachine,), {"kind": "memory", "backend": "trio"}))
TestPostgresOnAsyncio = _case(
    type("PostgresOnAsyncio", (LedgerMachine,), {"kind": "postgres", "backend": "asyncio"})
)
TestPostgresOnTrio = _case(type("PostgresOnTrio", (LedgerMachine,), {"kind": "postgres", "backend": "trio"}))
TestLockstepOnAsyncio = _case(type("LockstepOnAsyncio", (LockstepMachine,), {"backend": "asyncio"}))
TestLockstepOnTrio = _case(type("LockstepOnTrio", (LockstepMachine,), {"backend": "trio"}))
