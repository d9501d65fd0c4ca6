"""``python -m ledger inspect`` and ``check`` on a PostgreSQL URL, beside the same on an LMDB path."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import psycopg

from ledger import open_ledger
from ledger.postgres import open_postgres
from streams import Key, KeyedState, MessageTx, Stream, handle_messages, open_scope

from .conftest import timeless, without_times
from .pool_graphs import N, summing
from .test_cli import cli

ORDERS = Key("orders", Stream[int])


async def fill(opening: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
    """Five orders, 'billing' handled three with a state and keyed state; a run of the summing graph."""

    async def add(tx: MessageTx[int], value: int) -> None:
        tx.set_state(tx.state + value)
        tx.store.put("odd" if value % 2 else "even", value)

    async with opening() as ledger:
        async with open_scope(ledger.streams, scope="shop") as scope:
            stream = await scope.open_stream(
                ORDERS, node="intake", groups=("billing", "audit"), resumable=True
            )
            for i in range(1, 6):
                stream.writer().send_nowait(i)  # no checkpoint: the five leave in one append
            await handle_messages(
                stream.reader("billing"), add, initial_state=0, limit=3, keyed=KeyedState(str, int)
            )
        await ledger.run(summing(), {N: 4}, run_id="sum-4")


def shown(target: str, *extra: str) -> Any:
    done = cli("inspect", target, "--json", *extra)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for stream in report["streams"] if isinstance(report, dict) else []:
        for group in stream["groups"]:
            group.pop("active_at")  # a clock's time
    return report


def test_inspect_on_a_url_reports_what_inspect_on_a_path_reports(postgres_url: str, tmp_path: Path) -> None:
    anyio.run(fill, lambda: open_ledger(tmp_path / "ledger"))
    anyio.run(fill, lambda: open_postgres(postgres_url))
    on_lmdb, on_postgres = shown(str(tmp_path / "ledger")), shown(postgres_url)
    assert on_postgres["streams"] and on_postgres["runs"]
    key = lambda s: (s["scope"], s["node"], s["key"])  # noqa: E731
    assert without_times(sorted(on_postgres["streams"], key=key)) == without_times(
        sorted(on_lmdb["streams"], key=key)
    )
    assert timeless(on_postgres["runs"]) == timeless(on_lmdb["runs"])
    assert all(run["created_at"] and run["updated_at"] for run in (*on_postgres["runs"], *on_lmdb["runs"]))
    assert "postgres" in on_postgres["path"] and "password" not in on_postgres["path"]
    table = cli("inspect", postgres_url, "--groups").stdout.splitlines()
    assert [line.split()[:5] for line in table[1:]] == [
        ["add", "sum-4/numbers/numbers", "4", "4", "0"],
        ["audit", "shop/intake/orders", "0", "5", "5"],
        ["billing", "shop/intake/orders", "3", "5", "2"],
    ]


def test_check_on_a_url_finds_a_sound_ledger_then_each_damage(postgres_url: str) -> None:
    anyio.run(fill, lambda: open_postgres(postgres_url))
    sound = cli("check", postgres_url)
    assert sound.returncode == 0 and sound.stdout.strip().endswith("records checked, sound"), sound.stdout
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE streamledger_groups SET frontier = '\\x00c1'::bytea WHERE name = 'audit'")
        conn.execute(
            "DELETE FROM streamledger_messages WHERE first_seq = 1 AND stream_id ="
            " (SELECT id FROM streamledger_streams WHERE key = 'orders')"
        )
    damaged = cli("check", postgres_url, "--json")
    assert damaged.returncode == 4
    problems = json.loads(damaged.stdout)["problems"]
    assert any("the frontier of group 'audit'" in p and "does not decode" in p for p in problems), problems
    assert any("shop/intake/orders: messages 1 to 5 are missing" in p for p in problems), problems


def test_a_url_without_a_ledger_or_a_server_is_one_line(postgres_url: str, tmp_path: Path) -> None:
    empty = cli("inspect", postgres_url)
    assert empty.returncode == 2 and "holds no ledger" in empty.stderr and len(empty.stderr.splitlines()) == 1
    missing = cli("check", f"postgresql:///nothing?host={tmp_path}&user=postgres")
    assert missing.returncode == 1 and "cannot be reached" in missing.stderr, missing.stderr
    assert len(missing.stderr.splitlines()) == 1
