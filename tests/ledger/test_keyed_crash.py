"""Keyed totals on a partitioned stream survive SIGKILL: after every kill each total holds exactly the
acknowledged orders.

``examples/customer_totals.py`` keeps a total per customer in keyed state,
on a stream of four partitions by customer, each partition's handler
running at once; ``examples/customer_graph.py`` does the same in a durable
graph run, a writer node and a reader node of two members. Each is killed
at random moments; after each kill every partition's keyed state must
equal the totals of exactly the orders of that partition its group
acknowledged (nothing lost, nothing added twice), and the last run prints
every customer's total as an uninterrupted run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from hashlib import blake2b
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ledger import NotALedgerError, UnfinishedLedgerError, connect
from ledger._connect import is_url, tools_for
from ledger._testing import kill_until_done
from ledger.lmdb import TOOLS
from streams import KeyedState, StreamRef

from .. import pg_server
from . import expiry_child
from ._kills import ROOT, killed_until_landed

ORDERS = 100_000
CUSTOMERS = 300
PARTITIONS = 4


def _orders(partition: int | None = None) -> list[tuple[str, int]]:
    """The example's orders (customer, amount), in order: all, or those of one partition."""
    orders = [(f"customer-{i * 7919 % CUSTOMERS}", i % 100 + 1) for i in range(1, ORDERS + 1)]
    if partition is None:
        return orders
    return [o for o in orders if _digest(o[0]) % PARTITIONS == partition]


def _digest(key: str) -> int:
    """How the stream places a key: the first 8 bytes of its MessagePack's BLAKE2b digest."""
    return int.from_bytes(blake2b(msgspec.msgpack.encode(key), digest_size=8).digest(), "big")


def _totals(orders: list[tuple[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for customer, amount in orders:
        totals[customer] = totals.get(customer, 0) + amount
    return totals


def _confirmed_exactly(path: Path) -> None:
    """Every partition's keyed totals are those of exactly the orders its group acknowledged."""
    if not (path / "data.mdb").exists():
        return
    try:
        inspected = TOOLS.inspect(str(path), False)
    except UnfinishedLedgerError:  # killed while the ledger was created: nothing confirmed yet
        return
    streams = {s["key"]: s for s in inspected["streams"]}
    for p in range(PARTITIONS):
        stream = streams.get(f"orders#{p}")
        if stream is None:
            continue
        [group] = stream["groups"]
        ref = StreamRef("shop", "checkout", f"orders#{p}")
        listed = TOOLS.keys(str(path), ref, "totals", b"", None, CUSTOMERS + 1)["keys"]
        assert {e["key"]: e["value"] for e in listed} == _totals(_orders(p)[: group["acked_through"]]), p


#: The stream's program merges its keyed logs every 40 keys or 400 entries (of about 75 keys a
#: partition), so kills land in merging commits too; the graph's keeps the usual thresholds.
SMALL_MERGES = (str(Path(__file__).with_name("small_merges_child.py")), "40", "400")


@pytest.mark.parametrize(
    ("example", "extra", "launcher"),
    [("customer_totals.py", (), SMALL_MERGES), ("customer_graph.py", ("2",), ())],
    ids=["stream", "graph"],
)
def test_keyed_totals_killed_at_random_moments_hold_exactly_the_acknowledged_orders(
    tmp_path: Path, example: str, extra: tuple[str, ...], launcher: tuple[str, ...]
) -> None:
    expected = json.dumps(_totals(_orders()), sort_keys=True)
    killed_until_landed(
        tmp_path,
        lambda path: [
            sys.executable,
            *launcher,
            str(ROOT / "examples" / example),
            str(path),
            str(ORDERS),
            str(CUSTOMERS),
            str(PARTITIONS),
            *extra,
        ],
        expected=expected,
        env=dict(os.environ),
        max_delay=0.8,
        after_kill=_confirmed_exactly,
    )


def _live_baskets(orders: list[tuple[str, int, float]], now: float) -> dict[str, int]:
    """The baskets of ``orders`` (customer, amount, time), each gone ``TTL`` after its last order."""
    baskets: dict[str, tuple[int, float]] = {}
    for customer, amount, at in orders:
        total, gone = baskets.get(customer, (0, at))
        baskets[customer] = ((total if gone > at else 0) + amount, at + expiry_child.TTL)
    return {customer: total for customer, (total, gone) in baskets.items() if gone > now}


def _basket_orders(n: int) -> list[tuple[str, int, float]]:
    return [(o.customer, o.amount, o.at) for o in (expiry_child.order(i, CUSTOMERS) for i in range(1, n + 1))]


EXPIRING_ORDERS = 11_900


def _baskets_confirmed_exactly(target: str) -> int:
    """The baskets live at the last acknowledged order's time are exactly those its orders make;
    returns how many orders were acknowledged."""
    if not is_url(target) and not (Path(target) / "data.mdb").exists():
        return 0
    try:
        inspected = tools_for(target).inspect(target, False)
    except (UnfinishedLedgerError, NotALedgerError):  # killed while the ledger was made: nothing confirmed
        return 0
    [stream] = [s for s in inspected["streams"] if s["key"] == "orders"] or [None]
    if stream is None:
        return 0
    acked = stream["groups"][0]["acked_through"]
    now = expiry_child.time_of(acked)
    ref = StreamRef("shop", "checkout", "orders")

    async def listed() -> dict[str, int]:
        at_the_time = KeyedState(str, int, clock=lambda: now)
        async with connect(target) as ledger:
            return dict(await at_the_time.items(ledger.streams, ref, "baskets", limit=CUSTOMERS + 1))

    assert anyio.run(listed) == _live_baskets(_basket_orders(EXPIRING_ORDERS)[:acked], now), acked
    return int(acked)


def _baskets_of_ledger_confirmed_exactly(path: Path) -> None:
    _baskets_confirmed_exactly(str(path))


def _expiry_command(target: str, backend: str = "asyncio") -> list[str]:
    child = str(Path(__file__).with_name("expiry_child.py"))
    return [sys.executable, child, target, str(EXPIRING_ORDERS), str(CUSTOMERS), backend]


def _expected_baskets() -> str:
    final = expiry_child.time_of(EXPIRING_ORDERS)
    expected = json.dumps(_live_baskets(_basket_orders(EXPIRING_ORDERS), final), sort_keys=True)
    assert expected != "{}"
    return expected


def test_expiring_baskets_killed_at_random_moments_hold_exactly_what_the_acknowledged_orders_make(
    tmp_path: Path,
) -> None:
    """After every SIGKILL, a basket is what its confirmed orders make it, and one past its ttl at
    the last confirmed order's time is gone (the spells between orders expire every basket)."""
    killed_until_landed(
        tmp_path,
        lambda path: _expiry_command(str(path)),
        expected=_expected_baskets(),
        env=dict(os.environ),
        max_delay=1.6,  # past the interpreter's start and the ledger's open: the kills land in the run
        kills=3,
        after_kill=_baskets_of_ledger_confirmed_exactly,
    )


@pytest.mark.postgres
def test_expiring_baskets_on_postgres_on_trio_killed_at_random_moments_hold_what_the_acknowledged_orders_make(
    postgres_server: Any,
) -> None:
    """The same program on a PostgreSQL ledger, on trio: each kill ends its session, whose open
    transaction the server rolls back; what was committed is exactly what the acknowledged orders make,
    checked after every kill, and at least two kills land while orders are handled."""
    expected = _expected_baskets()
    in_the_run: list[int] = []  # the orders acknowledged at each kill that landed once some were
    delay = 6.0  # start-up and the schema take seconds on a slow machine: the kills land up to the run's end
    for attempt in range(8):  # a fresh ledger until kills landed while the orders were handled
        url = pg_server.new_ledger_url()
        command = _expiry_command(url, "trio")
        early_late = [0, 0]  # kills before the first order was acknowledged, and after the last

        def observe(url: str = url, early_late: list[int] = early_late) -> None:
            acked = _baskets_confirmed_exactly(url)
            if 0 < acked < EXPIRING_ORDERS:
                in_the_run.append(acked)
            early_late[0] += acked == 0
            early_late[1] += acked == EXPIRING_ORDERS

        landed = kill_until_done(
            command,
            kills=3,
            max_delay=delay,
            seed=20261207 + attempt,
            after_kill=observe,
            cwd=ROOT,
            env=dict(os.environ),
        )
        assert _baskets_confirmed_exactly(url) == EXPIRING_ORDERS
        again = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
        assert again.stdout.strip() == expected
        if len(in_the_run) >= 2:
            break
        early, late = early_late[0], early_late[1] + 3 - landed  # and the runs that ended first
        delay = delay * 1.5 if early > late else delay / 2 if late else delay
    assert len(in_the_run) >= 2, in_the_run
