"""Run the ledger's stateful machine on both stores and both event loops."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from .stateful import LedgerMachine

SETTINGS = settings(
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class LmdbOnAsyncio(LedgerMachine):
    kind = "lmdb"
    backend = "asyncio"


class LmdbOnTrio(LedgerMachine):
    kind = "lmdb"
    backend = "trio"


class MemoryOnAsyncio(LedgerMachine):
    kind = "memory"
    backend = "asyncio"


TestLmdbOnAsyncio = LmdbOnAsyncio.TestCase
TestLmdbOnAsyncio.settings = SETTINGS
TestLmdbOnTrio = LmdbOnTrio.TestCase
TestLmdbOnTrio.settings = SETTINGS
TestMemoryOnAsyncio = MemoryOnAsyncio.TestCase
TestMemoryOnAsyncio.settings = SETTINGS
