"""The conformance suite runs every test against every store: MemoryStore and the LMDB ledger.

A test gets a :class:`World`: ``world.session()`` is one process lifetime
with the store's hooks; leaving it and entering a new one is a restart (for
the LMDB ledger the environment is closed and opened again from its files).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from ledger import open_ledger
from streams import MemoryStore, StreamHooks

__all__ = ["World"]


class World:
    """A store that outlives sessions."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.memory = MemoryStore()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[StreamHooks]:
        if self.kind == "memory":
            yield self.memory
        else:
            async with open_ledger(self.path) as ledger:
                yield ledger.streams


@pytest.fixture(params=["memory", "lmdb"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    return World(str(request.param), tmp_path / "ledger")
