"""A PostgreSQL row under another key, or missing, is refused by each read path meeting it; nothing written.

Rows carry no seals: each names its key inside (a frontier its group, a run
record its run id, a node record its node), and the read paths compare, as
``check`` does. Each case edits the tables as damage would, then runs
``inspect``, the stream's reopening and the run's resume: each refuses with
a typed error (``inspect`` with one line and exit 4) and the tables are
exactly as they were.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from ledger import CorruptRecordError, LedgerError, connect
from streams import GroupFrontier, StreamsError, open_scope

from .pool_graphs import N, summing
from .test_cli import cli
from .test_postgres_cli import ORDERS, fill

TABLES = (
    "streamledger_streams",
    "streamledger_groups",
    "streamledger_messages",
    "streamledger_attempts",
    "streamledger_keyed",
    "streamledger_runs",
    "streamledger_nodes",
    "streamledger_node_attempts",
    "streamledger_scopes",
)

#: Each damage, and the read paths that meet it (the others read none of it, and may write).
DAMAGE = {
    "a group's row renamed": (
        "UPDATE streamledger_groups SET name = 'billinh' WHERE name = 'billing'",
        {"reopen"},
    ),
    "a group's row holding another's frontier": (
        "UPDATE streamledger_groups SET frontier = (SELECT frontier FROM streamledger_groups"
        " WHERE name = 'audit') WHERE name = 'billing'",
        {"reopen"},
    ),
    "a group's row deleted": ("DELETE FROM streamledger_groups WHERE name = 'audit'", {"reopen"}),
    # billing acked 3 of 5; audit's frontier, as written by a later release or by hand, acked 9
    "a group acknowledged past the last append": (
        "UPDATE streamledger_groups SET frontier = %s WHERE name = 'audit'",
        {"reopen"},
    ),
    "a run's row under another id": (
        "UPDATE streamledger_runs SET run_id = 'sum-5' WHERE run_id = 'sum-4'",
        {"resume", "runs"},
    ),
    "a node's row under another name": (
        "UPDATE streamledger_nodes SET node = 'zz' WHERE node = (SELECT min(node) FROM streamledger_nodes)",
        {"resume"},
    ),
}


def tables(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in TABLES}


async def reopen(url: str) -> None:
    async with connect(url) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        await scope.open_stream(ORDERS, node="intake", groups=("billing", "audit"), resumable=True)


async def resume(url: str) -> None:
    async with connect(url) as ledger:
        await ledger.resume("sum-4", summing())


async def runs(url: str) -> None:
    async with connect(url) as ledger:
        await ledger.runs()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_row_under_another_key_or_missing_is_refused_by_every_read_path(
    postgres_url: str, damage: str
) -> None:
    anyio.run(fill, lambda: connect(postgres_url))
    sql, meeting = DAMAGE[damage]
    params = (msgspec.msgpack.encode(GroupFrontier(group="audit", acked_through=9)),) if "%s" in sql else ()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql, params)
    before = tables(postgres_url)
    shown = cli("inspect", postgres_url)
    assert shown.returncode == 4, (damage, shown.stdout, shown.stderr)
    assert len(shown.stderr.splitlines()) == 1 and "damaged" in shown.stderr, shown.stderr
    assert cli("check", postgres_url).returncode == 4
    assert tables(postgres_url) == before
    for path in (reopen, resume, runs):
        if path.__name__ not in meeting:
            continue
        with pytest.raises((LedgerError, StreamsError)):  # typed, and nothing written
            anyio.run(path, postgres_url)
        assert tables(postgres_url) == before, (damage, path.__name__)


def test_a_row_holding_another_rows_record_fails_the_read_that_meets_it(postgres_url: str) -> None:
    anyio.run(fill, lambda: connect(postgres_url))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(DAMAGE["a run's row under another id"][0])
    with pytest.raises(
        CorruptRecordError, match=r"run 'sum-5' in streamledger_runs holds another id's digest"
    ):
        anyio.run(runs, postgres_url)
    # the id asked for is found by its digest: never a new run under an id whose row moved
    with pytest.raises(CorruptRecordError, match=r"row of run 'sum-4' .* kept under run id 'sum-5'"):
        anyio.run(resume, postgres_url)

    async def run_again(url: str) -> None:
        async with connect(url) as ledger:
            await ledger.run(summing(), {N: 4}, run_id="sum-4")

    before = tables(postgres_url)
    with pytest.raises(CorruptRecordError):
        anyio.run(run_again, postgres_url)
    assert tables(postgres_url) == before
