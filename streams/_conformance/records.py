"""The records and keys of the conformance tests: orders in, invoices out, a running total as state."""

from __future__ import annotations

from typing import Final

import msgspec

from streams import Key, Stream

__all__ = ["INVOICES", "NUMBERS", "ORDERS", "TOTAL", "Invoice", "Order", "Totals"]


class Order(msgspec.Struct, frozen=True):
    id: int
    amount: int


class Invoice(msgspec.Struct, frozen=True):
    order: int
    amount: int


class Totals(msgspec.Struct, frozen=True):
    """A handler's explicit state: what it has billed so far."""

    total: int = 0
    count: int = 0


ORDERS: Final = Key("orders", Stream[Order])
INVOICES: Final = Key("invoices", Stream[Invoice])
NUMBERS: Final = Key("numbers", Stream[int])
TOTAL: Final = Key("total", int)
