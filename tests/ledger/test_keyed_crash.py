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
import sys
from hashlib import blake2b
from pathlib import Path

import anyio
import msgspec
import pytest

from ledger import UnfinishedLedgerError, open_ledger
from ledger.lmdb import TOOLS
from streams import KeyedState, StreamRef

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


def _baskets_confirmed_exactly(path: Path) -> None:
    """The baskets live at the last acknowledged order's time are exactly those its orders make."""
    if not (path / "data.mdb").exists():
        return
    try:
        inspected = TOOLS.inspect(str(path), False)
    except UnfinishedLedgerError:
        return
    [stream] = [s for s in inspected["streams"] if s["key"] == "orders"] or [None]
    if stream is None:
        return
    acked = stream["groups"][0]["acked_through"]
    now = expiry_child.time_of(acked)
    ref = StreamRef("shop", "checkout", "orders")

    async def listed() -> dict[str, int]:
        at_the_time = KeyedState(str, int, clock=lambda: now)
        async with open_ledger(path) as ledger:
            return dict(await at_the_time.items(ledger.streams, ref, "baskets", limit=CUSTOMERS + 1))

    assert anyio.run(listed) == _live_baskets(_basket_orders(EXPIRING_ORDERS)[:acked], now), acked


def test_expiring_baskets_killed_at_random_moments_hold_exactly_what_the_acknowledged_orders_make(
    tmp_path: Path,
) -> None:
    """After every SIGKILL, a basket is what its confirmed orders make it, and one past its ttl at
    the last confirmed order's time is gone (the spells between orders expire every basket)."""
    final = expiry_child.time_of(EXPIRING_ORDERS)
    expected = json.dumps(_live_baskets(_basket_orders(EXPIRING_ORDERS), final), sort_keys=True)
    assert expected != "{}"
    killed_until_landed(
        tmp_path,
        lambda path: [
            sys.executable,
            str(Path(__file__).with_name("expiry_child.py")),
            str(path),
            str(EXPIRING_ORDERS),
            str(CUSTOMERS),
        ],
        expected=expected,
        env=dict(os.environ),
        max_delay=1.6,  # past the interpreter's start and the ledger's open: the kills land in the run
        kills=3,
        after_kill=_baskets_confirmed_exactly,
    )
