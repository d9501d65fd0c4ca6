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


def _case(machine: type[LedgerMachine] | type[LockstepMachine]) -> object:
    case = machine.TestCase
    case.settings = SETTINGS
    if issubclass(machine, LockstepMachine) or machine.kind == "postgres":
        return pytest.mark.postgres(case)
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
