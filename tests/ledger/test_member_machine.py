"""Run the group-member machine on PostgreSQL, on both event loops."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from .member_machine import MemberMachine

pytestmark = pytest.mark.postgres

SETTINGS = settings(
    max_examples=6,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _case(backend: str) -> object:
    machine: type[MemberMachine] = type(f"MembersOn{backend.title()}", (MemberMachine,), {"backend": backend})
    case = machine.TestCase
    case.settings = SETTINGS
    return case


TestMembersOnAsyncio = _case("asyncio")
TestMembersOnTrio = _case("trio")
