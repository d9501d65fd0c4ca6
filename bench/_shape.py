"""The demo pipeline's records and keys, shared by every bench, plus small helpers."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
from collections.abc import Iterable, Sequence

from ledger._demo import INVOICES, ORDERS, BillingState, Invoice, Order

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


#: The demo's records: the bench measures the demo's shape with its own types.
Totals = BillingState


def expected_total(n: int) -> int:
    """The billing total after orders with amounts ``1..n``."""
    return n * (n + 1) // 2


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def unimportable(modules: Iterable[str], install: str) -> str | None:
    """Why a peer cannot run here (the first of ``modules`` not importable, and ``install``), or None."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not importable ({install})"
    return None


def child_report(argv: list[str], what: str, timeout_s: float) -> tuple[float, int]:
    """Run a peer's child process ``argv``; the seconds and checkpoints of the report it printed last.

    ``what`` names the work in the :class:`BenchError` that a timeout, a failed exit or a missing
    report raises.
    """
    try:
        child = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} did not finish in {timeout_s} s") from None
    if child.returncode != 0:
        tail = "\n".join(child.stderr.strip().splitlines()[-5:])
        raise BenchError(f"{what} failed (exit {child.returncode}): {tail}")
    try:
        report = json.loads(child.stdout.strip().splitlines()[-1])
        return float(report["seconds"]), int(report["checkpoints"])
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise BenchError(f"{what} printed no report ({exc!r}): {child.stdout[-500:]!r}") from None
