"""Fixtures of the ledger tests: one ledger of either backend, opened as often as a test likes."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from ledger import open_ledger
from ledger.postgres import open_postgres

Opener = Callable[[], AbstractAsyncContextManager[Any]]


@pytest.fixture(params=["lmdb", "postgres"])
def open_any(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the same ledger each time: an LMDB directory, or a PostgreSQL database."""
    if request.param == "lmdb":
        return lambda: open_ledger(tmp_path / "ledger")
    url = request.getfixturevalue("postgres_url")
    return lambda: open_postgres(url)


def timeless(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``inspect``'s runs without their times: two ledgers filled at other moments report the same."""
    return [
        {
            k: [_timeless_node(node) for node in v] if k == "nodes" else v
            for k, v in run.items()
            if k not in _TIMES
        }
        for run in runs
    ]


_TIMES = ("created_at", "updated_at", "seconds", "started_at", "ended_at", "failed_at", "at")


def _timeless_node(node: dict[str, Any]) -> dict[str, Any]:
    return {
        k: [{f: x for f, x in failure.items() if f not in _TIMES} for failure in v] if k == "failed" else v
        for k, v in node.items()
        if k not in _TIMES
    }
