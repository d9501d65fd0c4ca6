"""Run the partitioned-stream machine on the three stores and both event loops."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from .partition_machine import PartitionMachine

SETTINGS = settings(
    max_examples=10,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _case(kind: str, backend: str) -> object:
    name = f"Partitions{kind.title()}On{backend.title()}"
    machine: type[PartitionMachine] = type(name, (PartitionMachine,), {"kind": kind, "backend": backend})
    case = machine.TestCase
    case.settings = SETTINGS
    return case


TestMemoryOnAsyncio = _case("memory", "asyncio")
TestMemoryOnTrio = _case("memory", "trio")
TestLmdbOnAsyncio = _case("lmdb", "asyncio")
TestLmdbOnTrio = _case("lmdb", "trio")
TestPostgresOnAsyncio = _case("postgres", "asyncio")
TestPostgresOnTrio = _case("postgres", "trio")
