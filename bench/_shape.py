"""The demo pipeline's records and keys, shared by every bench, plus small helpers."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import msgspec

from streams import Key, Stream

__all__ = [
    "INVOICES",
    "ORDERS",
    "BenchError",
    "Invoice",
    "Order",
    "Totals",
    "expected_total",
    "median",
]


class BenchError(Exception):
    """A bench run did not produce the result it must; no figure is reported for it."""


class Order(msgspec.Struct, frozen=True):
    id: int
    amount: int


class Invoice(msgspec.Struct, frozen=True):
    order: int
    amount: int


class Totals(msgspec.Struct, frozen=True):
    """The billing group's explicit state."""

    total: int = 0
    count: int = 0


ORDERS = Key("orders", Stream[Order])
INVOICES = Key("invoices", Stream[Invoice])


def expected_total(n: int) -> int:
    """The billing total after orders with amounts ``1..n``."""
    return n * (n + 1) // 2


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))
