"""The random-graph checkpoint machine on MemoryStore and the LMDB ledger, on both event loops."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from .node_machine import NodeMachine

SETTINGS = settings(
    max_examples=25,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _case(name: str, kind: str, backend: str) -> object:
    machine: type[NodeMachine] = type(name, (NodeMachine,), {"kind": kind, "backend": backend})
    case = machine.TestCase
    case.settings = SETTINGS
    return case


TestMemoryOnAsyncio = _case("NodesMemoryOnAsyncio", "memory", "asyncio")
TestMemoryOnTrio = _case("NodesMemoryOnTrio", "memory", "trio")
TestLmdbOnAsyncio = _case("NodesLmdbOnAsyncio", "lmdb", "asyncio")
TestLmdbOnTrio = _case("NodesLmdbOnTrio", "lmdb", "trio")
