"""Fixtures of the ledger tests: one ledger of either backend, opened as often as a test likes."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from ledger import open_ledger
from ledger.lmdb import _keyed_log
from ledger.postgres import open_postgres

Opener = Callable[[], AbstractAsyncContextManager[Any]]


@pytest.fixture(params=["lmdb", "postgres"])
def open_any(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the same ledger each time: an LMDB directory, or a PostgreSQL database."""
    if request.param == "lmdb":
        return lambda: open_ledger(tmp_path / "ledger")
    url = request.getfixturevalue("postgres_url")
    return lambda: open_postgres(url)


@pytest.fixture
def keyed_in_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every commit merges the keyed log of the groups it writes into the ``keyed`` table at once.

    For the tests of the table's records themselves (their keys, checksums
    and manifest); the log in front of it has tests of its own.
    """
    monkeypatch.setattr(_keyed_log, "MERGE_KEYS", 1)


#: What a report holds of the clock: times of runs, nodes, failures, appends, and ages.
_TIMES = frozenset(
    {
        "created_at",
        "updated_at",
        "seconds",
        "started_at",
        "ended_at",
        "failed_at",
        "at",
        "last_appended_at",
        "oldest_unacked_at",
        "lag_seconds",
        "appended_at",
        "last_activity",
        "lease_expires",
    }
)


def without_times(value: Any) -> Any:
    """``value`` (a report or part of one) without what it holds of the clock, at any depth."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k not in _TIMES}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def timeless(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``inspect``'s runs without their times: two ledgers filled at other moments report the same."""
    found: list[dict[str, Any]] = without_times(runs)
    return found
