"""The command line on a partitioned stream, on an LMDB path and a PostgreSQL URL: groups per
partition, and group changes of every partition or of one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import connect
from streams import Key, KeyedState, MessageTx, Stream, handle_messages, open_scope

from .test_cli import cli

ORDERS = Key("orders", Stream[int])
STREAM = "shop/checkout/orders"


async def _fill(target: str) -> None:
    """20 orders on two partitions (by parity), group 'totals' handled through 5 of each."""

    async def add(tx: MessageTx[None], value: int) -> None:
        tx.store.put("sum", await tx.store.get("sum", 0) + value)

    async with connect(target) as ledger, open_scope(ledger.streams, scope="shop") as scope:
        orders = await scope.open_partitioned(
            ORDERS, node="checkout", partitions=2, partition_key=lambda v: v % 2, groups=("totals", "audit")
        )
        for i in range(1, 21):
            await orders.writer().send(i, send_at=i)
        await orders.writer().flush()
        await handle_messages(orders.reader("totals"), add, keyed=KeyedState(str, int), limit=5)


def _rows(target: str) -> list[dict[str, Any]]:
    done = cli("inspect", target, "--groups", "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return [r for r in rows if r["stream"].startswith(STREAM)]


def _acked(target: str, group: str) -> list[int]:
    return [r["acked_through"] for r in _rows(target) if r["group"] == group]


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    found = (
        str(tmp_path / "ledger") if request.param == "lmdb" else str(request.getfixturevalue("postgres_url"))
    )
    anyio.run(_fill, found)
    return found


def test_each_partition_is_a_row_of_the_groups_view_with_its_partition(target: str) -> None:
    rows = [(r["group"], r["stream"], r["acked_through"], r["lag"], r["partition"]) for r in _rows(target)]
    assert sorted(rows) == [
        ("audit", f"{STREAM}#0", 0, 10, "0/2"),
        ("audit", f"{STREAM}#1", 0, 10, "1/2"),
        ("totals", f"{STREAM}#0", 5, 5, "0/2"),
        ("totals", f"{STREAM}#1", 5, 5, "1/2"),
    ]
    table = cli("inspect", target, "--groups").stdout.splitlines()
    assert table[0].split()[-2:] == ["PARTITION", "OWNER"] and table[1].split()[-2:] in (
        ["0/2", "-"],
        ["1/2", "-"],
    )
    keys = cli("keys", target, f"{STREAM}#1", "totals").stdout.splitlines()
    assert [json.loads(line) for line in keys] == [{"key": "sum", "value": 1 + 3 + 5 + 7 + 9}]


def test_a_group_change_of_the_stream_changes_every_partition(target: str) -> None:
    done = cli("group", "move", target, STREAM, "totals", "--to", "earliest", "--keep-state")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"moved group 'totals' of 2 partitions of {STREAM}: next messages 1, 1, state kept"
    )
    assert _acked(target, "totals") == [0, 0]
    one = cli("group", "move", target, STREAM, "totals", "--partition", "1", "--to", "4", "--clear-state")
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == f"moved group 'totals' of {STREAM}#1: next message 4, state cleared"
    assert _acked(target, "totals") == [0, 3]
    assert cli("keys", target, f"{STREAM}#1", "totals").stdout == ""  # cleared with the state
    gone = cli("group", "remove", target, STREAM, "audit")
    assert gone.stdout.strip() == f"removed group 'audit' of 2 partitions of {STREAM}"
    assert _acked(target, "audit") == []


def test_a_change_no_partition_can_take_changes_none(target: str) -> None:
    before = _rows(target)
    for args in (
        ("group", "move", target, STREAM, "totals", "--to", "3", "--keep-state"),  # whose sequence 3?
        ("group", "move", target, STREAM, "totals", "--partition", "2", "--to", "1", "--keep-state"),
        ("group", "move", target, STREAM, "nobody", "--to", "latest", "--keep-state"),
        ("group", "remove", target, "shop/checkout/refunds", "totals", "--partition", "0"),
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert _rows(target) == before
