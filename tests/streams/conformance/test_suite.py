"""The conformance suite (``streams.testing``), each check a test, on every store and event loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from streams.testing import StoreWorld, stream_store_checks

from .conftest import World

CHECKS = stream_store_checks()


@pytest.mark.parametrize(("name", "check"), CHECKS, ids=[name for name, _ in CHECKS])
async def test_conformance(world: World, name: str, check: Callable[[StoreWorld], Awaitable[None]]) -> None:
    await check(world)
