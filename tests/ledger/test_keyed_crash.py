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

import msgspec
import pytest

from ledger import UnfinishedLedgerError
from ledger.lmdb import TOOLS
from streams import StreamRef

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


@pytest.mark.parametrize(
    ("example", "extra"), [("customer_totals.py", ()), ("customer_graph.py", ("2",))], ids=["stream", "graph"]
)
def test_keyed_totals_killed_at_random_moments_hold_exactly_the_acknowledged_orders(
    tmp_path: Path, example: str, extra: tuple[str, ...]
) -> None:
    expected = json.dumps(_totals(_orders()), sort_keys=True)
    killed_until_landed(
        tmp_path,
        lambda path: [
            sys.executable,
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
