"""The demo pipeline behind ``python -m ledger demo``: orders, billing, invoices, audit.

A source appends ``messages`` orders (amounts 1..N) to ``orders``, promising
continuation from its ``send_at`` position. Group ``billing`` handles every
order with explicit state (a running total and count) and sends one invoice
per order to ``invoices``; group ``audit`` handles every invoice keeping its
own count. Every message is one confirmed transaction, so the demo can be
killed at any instant and started again on the same path: it resumes where
the ledger says and ends with the same figures as an uninterrupted run.

A finished demo started again changes nothing: :func:`run_demo` reads the
ledger before opening any stream (opening raises generations, which is a
change) and returns the figures it finds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

import anyio
import anyio.lowlevel
import msgspec

from streams import Key, ManagedStream, MessageTx, Stream, StreamHooks, handle_messages, open_scope
from streams.store import single_error

from ._errors import LedgerError
from ._inspect import inspect_ledger
from ._ledger import Ledger, open_ledger

__all__ = [
    "AUDIT",
    "BILLING",
    "DEMO_SCOPE",
    "INVOICES",
    "ORDERS",
    "AuditState",
    "BillingState",
    "DemoMismatchError",
    "DemoProgress",
    "DemoSummary",
    "Invoice",
    "Order",
    "run_demo",
    "run_demo_pipeline",
]


class Order(msgspec.Struct, frozen=True, gc=False):
    """One order of the demo; order ``i`` has amount ``i``."""

    id: int
    amount: int


class Invoice(msgspec.Struct, frozen=True, gc=False):
    """The invoice billing sends for one order."""

    order: int
    amount: int


class BillingState(msgspec.Struct, frozen=True, gc=False):
    """Billing's explicit state: what it has billed so far."""

    total: int = 0
    count: int = 0


class AuditState(msgspec.Struct, frozen=True, gc=False):
    """Audit's explicit state: how many invoices it has seen."""

    count: int = 0


ORDERS: Final = Key("orders", Stream[Order])
INVOICES: Final = Key("invoices", Stream[Invoice])
DEMO_SCOPE: Final = "demo"
BILLING: Final = "billing"
AUDIT: Final = "audit"
#: The writer node of each demo stream.
_NODES: Final = {ORDERS.name: "source", INVOICES.name: BILLING}
_CAPACITY: Final = 4096


class DemoMismatchError(LedgerError, ValueError):
    """The ledger holds a demo that cannot continue with the requested number of messages."""


class DemoProgress(msgspec.Struct, frozen=True):
    """Where a running demo stands, read from its endpoints' snapshots."""

    messages: int
    orders: int
    billed: int
    invoices: int
    audited: int
    elapsed: float
    #: Orders billed per second since this run started.
    rate: float


class DemoSummary(msgspec.Struct, frozen=True):
    """The figures of a finished demo."""

    orders: int
    billing_total: int
    invoices: int
    audit_count: int
    #: Orders billed by this run (0 when the demo had already finished).
    handled: int
    elapsed: float
    #: True when the ledger already held a finished demo and nothing was done.
    already_finished: bool = False
    #: True when this run continued a demo an earlier run had started.
    resumed: bool = False

    @property
    def rate(self) -> float:
        """Orders billed per second by this run."""
        return self.handled / self.elapsed if self.elapsed > 0 else 0.0


ProgressCallback = Callable[[DemoProgress], None]


async def run_demo(
    path: str | os.PathLike[str],
    messages: int = 100_000,
    *,
    progress: ProgressCallback | None = None,
    progress_interval: float = 0.25,
    sync: bool = True,
    max_map_size: int = 1 << 40,
) -> DemoSummary:
    """Run (or resume) the demo pipeline on the ledger at ``path`` and return its figures.

    ``progress`` is called with a :class:`DemoProgress` once when the streams
    are open, then every ``progress_interval`` seconds, and once at the end;
    it reads endpoint snapshots and never touches the messages. If the ledger
    holds a finished demo, nothing is opened or written and the summary has
    ``already_finished=True``. ``max_map_size`` is the ledger's map limit
    (:func:`~ledger.open_ledger`): a message whose write does not fit stops
    the run with a :class:`~streams.CheckpointError` caused by
    :class:`~ledger.MapFullError`, and the same call with a larger limit resumes.

    Raises :class:`DemoMismatchError` if the ledger holds a demo that already
    went past ``messages`` orders, and the ledger's own errors
    (:class:`~ledger.NotALedgerError`, :class:`~ledger.LedgerLockedError`, …)
    for a path that cannot be opened.
    """
    if messages < 1:
        raise ValueError("the demo needs at least one message")
    if progress_interval <= 0:
        raise ValueError("progress_interval must be positive")
    async with open_ledger(path, sync=sync, max_map_size=max_map_size) as ledger:
        return await _run_on(ledger, path, messages, progress, progress_interval)


async def _run_on(
    ledger: Ledger,
    path: str | os.PathLike[str],
    messages: int,
    progress: ProgressCallback | None,
    progress_interval: float,
) -> DemoSummary:
    found = _read_demo(inspect_ledger(ledger.env))
    if found.finished:
        return DemoSummary(
            orders=found.orders,
            billing_total=found.billing_total,
            invoices=found.invoices,
            audit_count=found.audit_count,
            handled=0,
            elapsed=0.0,
            already_finished=True,
            resumed=True,
        )
    if found.orders > messages or (found.orders_finished and found.orders != messages):
        wanted = f"{found.orders}" if found.orders_finished else f"{found.orders} or more"
        raise DemoMismatchError(
            f"ledger {path} holds an unfinished demo of {found.orders} orders, "
            f"not {messages}; run it again with --messages {wanted}, or use a new path"
        )
    return await run_demo_pipeline(
        ledger.streams, messages, progress=progress, progress_interval=progress_interval
    )


class _Found(msgspec.Struct, frozen=True):
    """What the ledger says about an earlier demo, read without opening any stream."""

    finished: bool = False
    orders_finished: bool = False
    orders: int = 0
    billing_total: int = 0
    invoices: int = 0
    audit_count: int = 0


def _read_demo(report: dict[str, Any]) -> _Found:
    streams = {
        s["key"]: s
        for s in report["streams"]
        if s["scope"] == DEMO_SCOPE and _NODES.get(s["key"]) == s["node"]
    }
    orders, invoices = streams.get(ORDERS.name), streams.get(INVOICES.name)
    if orders is None:
        return _Found()
    for s in streams.values():
        if s["failed"]:
            raise DemoMismatchError(
                f"stream {s['key']!r} of the demo in {report['path']} failed; use a new path"
            )
    billing = _group(orders, BILLING)
    audit = _group(invoices, AUDIT) if invoices is not None else None
    finished = (
        invoices is not None
        and audit is not None
        and billing is not None
        and orders["finished"]
        and invoices["finished"]
        and billing["acked_through"] == orders["appended"]
        and audit["acked_through"] == invoices["appended"]
    )
    billing_state = billing["state"] if billing is not None else None
    audit_state = audit["state"] if audit is not None else None
    return _Found(
        finished=bool(finished),
        orders_finished=orders["finished"],
        orders=orders["appended"],
        billing_total=_field(billing_state, "total"),
        invoices=invoices["appended"] if invoices is not None else 0,
        audit_count=_field(audit_state, "count"),
    )


def _group(stream: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    if stream is None:
        return None
    for group in stream["groups"]:
        if group["group"] == name:
            return dict(group)
    return None


def _field(state: Any, name: str) -> int:
    if isinstance(state, dict) and isinstance(state.get(name), int):
        return int(state[name])
    return 0


async def run_demo_pipeline(
    hooks: StreamHooks,
    messages: int,
    *,
    progress: ProgressCallback | None = None,
    progress_interval: float = 0.25,
) -> DemoSummary:
    """Run (or resume) the demo's streams on any store, e.g. :class:`~streams.MemoryStore`.

    :func:`run_demo` is this on the ledger at a path, plus the check for a
    finished demo. Opening the streams raises their generations.
    """
    started = anyio.current_time()
    async with open_scope(hooks, scope=DEMO_SCOPE) as scope:
        orders = await scope.open_stream(
            ORDERS, node=_NODES[ORDERS.name], groups=(BILLING,), capacity=_CAPACITY, resumable=True
        )
        invoices = await scope.open_stream(
            INVOICES, node=_NODES[INVOICES.name], groups=(AUDIT,), capacity=_CAPACITY, resumable=True
        )
        order_writer = orders.writer()
        invoice_writer = invoices.writer()
        billed_before = _acked(orders, BILLING)
        totals = BillingState()
        audited = AuditState()

        async def source() -> None:
            if order_writer.done:
                return
            for i in range((order_writer.position or 0) + 1, messages + 1):
                await order_writer.send(Order(id=i, amount=i), send_at=i)
            await order_writer.finish()

        async def bill(tx: MessageTx[BillingState], order: Order) -> None:
            state = tx.state
            tx.set_state(BillingState(total=state.total + order.amount, count=state.count + 1))
            tx.send(invoice_writer, Invoice(order=order.id, amount=order.amount))

        async def billing() -> None:
            nonlocal totals
            result = await handle_messages(orders.reader(BILLING), bill, initial_state=BillingState())
            totals = result.state
            await invoice_writer.finish()

        async def audit_invoice(tx: MessageTx[AuditState], invoice: Invoice) -> None:
            tx.set_state(AuditState(count=tx.state.count + 1))

        async def audit() -> None:
            nonlocal audited
            result = await handle_messages(invoices.reader(AUDIT), audit_invoice, initial_state=AuditState())
            audited = result.state

        def report() -> None:
            if progress is not None:
                progress(_progress(messages, orders, invoices, started, billed_before))

        async def reporter() -> None:
            while True:
                report()
                await anyio.sleep(progress_interval)

        with single_error():
            async with anyio.create_task_group() as pipeline:
                async with anyio.create_task_group() as workers:
                    workers.start_soon(source)
                    workers.start_soon(billing)
                    workers.start_soon(audit)
                    pipeline.start_soon(reporter)
                pipeline.cancel_scope.cancel()
        report()
        elapsed = anyio.current_time() - started
        return DemoSummary(
            orders=orders.snapshot().appended,
            billing_total=totals.total,
            invoices=invoices.snapshot().appended,
            audit_count=audited.count,
            handled=_acked(orders, BILLING) - billed_before,
            elapsed=elapsed,
            resumed=orders.generation > 1,
        )


def _acked(stream: ManagedStream[Any], group: str) -> int:
    for g in stream.snapshot().groups:
        if g.group == group:
            return g.acked_through
    return 0


def _progress(
    messages: int,
    orders: ManagedStream[Order],
    invoices: ManagedStream[Invoice],
    started: float,
    billed_before: int,
) -> DemoProgress:
    o, i = orders.snapshot(), invoices.snapshot()
    billed = next(g.acked_through for g in o.groups if g.group == BILLING)
    audited = next(g.acked_through for g in i.groups if g.group == AUDIT)
    elapsed = anyio.current_time() - started
    return DemoProgress(
        messages=messages,
        orders=o.appended,
        billed=billed,
        invoices=i.appended,
        audited=audited,
        elapsed=elapsed,
        rate=(billed - billed_before) / elapsed if elapsed > 0 else 0.0,
    )
