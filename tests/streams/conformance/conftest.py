"""The conformance suite runs every test against every store: MemoryStore, the LMDB ledger, the
PostgreSQL ledger, and the example store of docs/stores.md (built from ``streams.store`` alone).

A test gets a :class:`World`: ``world.session()`` is one process lifetime
with the store's hooks; leaving it and entering a new one is a restart (for
the LMDB ledger the environment is closed and opened again from its files).
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from ledger import open_ledger
from streams import MemoryStore, StreamHooks

__all__ = ["World"]


def example_store() -> StreamHooks:
    """A new DictStore, the store docs/stores.md writes from streams.store alone."""
    return _DOCS_STORE()


def example_view(hooks: StreamHooks) -> Any:
    """A fresh record view of an example store, as each of its calls makes one."""
    return _DOCS_MODULE.DictView(hooks)


def _load_docs_module() -> types.ModuleType:
    page = (Path(__file__).resolve().parents[3] / "docs" / "stores.md").read_text()
    block = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[0]
    module = types.ModuleType("docs_stores")  # a real module: annotations look names up in it
    sys.modules[module.__name__] = module
    exec(compile(block, "docs/stores.md", "exec"), module.__dict__)
    return module


_DOCS_MODULE = _load_docs_module()
_DOCS_STORE: Callable[[], StreamHooks] = _DOCS_MODULE.DictStore


class World:
    """A store that outlives sessions."""

    def __init__(self, kind: str, path: Path, url: str = "") -> None:
        self.kind = kind
        self.path = path
        self.url = url
        self.memory = MemoryStore()
        self.example = example_store()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[StreamHooks]:
        if self.kind == "memory":
            yield self.memory
        elif self.kind == "example":
            yield self.example
        elif self.kind == "postgres":
            from ledger.postgres import open_postgres

            async with open_postgres(self.url) as ledger:
                yield ledger.streams
        else:
            async with open_ledger(self.path) as ledger:
                yield ledger.streams


@pytest.fixture(params=["memory", "lmdb", "example", "postgres"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    kind = str(request.param)
    url = request.getfixturevalue("postgres_url") if kind == "postgres" else ""
    return World(kind, tmp_path / "ledger", url)
