"""The demo behind ``python -m ledger demo``: a graph whose nodes pass streams, run as ledger run ``demo``.

Node ``source`` appends ``messages`` orders (amounts 1..N) to stream
``orders``, promising continuation from its ``send_at`` position. Node
``billing`` handles every order in its group with explicit state (a running
total and count) and sends one invoice per order to ``invoices``; node
``audit`` handles every invoice keeping its own count. Every message is one
confirmed transaction and every node's outputs one record with its streams'
ends, so the demo can be killed at any instant and started again on the
same path: it resumes where the ledger says and ends with the same figures
as an uninterrupted run.

A finished demo started again changes nothing: :func:`run_demo` reads the
ledger before opening any stream (opening raises generations, which is a
change) and returns the figures it finds, or raises
:class:`~ledger.DemoMismatchError` if it was asked for another number of
messages than the demo has."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import msgspec

from streams import (
    ExecCheckpoint,
    Execution,
    ExecutionEvent,
    ExecutionResult,
    Finished,
    Graph,
    Key,
    ManagedStream,
    MessageTx,
    NodeContext,
    Running,
    Stream,
)
from streams.store import CheckpointHooks, single_error

from ._errors import DemoMismatchError
from ._ledger import Ledger
from ._runs import RunRecord, decode_inputs

__all__ = [
    "AUDIT",
    "AUDITED",
    "BILLED",
    "BILLING",
    "DEMO_SCOPE",
    "INVOICES",
    "MESSAGES",
    "ORDERS",
    "AuditState",
    "BillingState",
    "DemoProgress",
    "DemoSummary",
    "Invoice",
    "Order",
    "demo_graph",
    "of_runs",
    "run_demo_on",
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
MESSAGES: Final = Key("messages", int)
BILLED: Final = Key("billed", BillingState)
AUDITED: Final = Key("audited", AuditState)
#: The demo's run id (``demo --run-id`` names another), which is also its root scope.
DEMO_SCOPE: Final = "demo"
#: The graph of every demo run.
_DEMO_GRAPH: Final = "demo"
#: A root scope of a run's streams past its first attempt's: a retry of it (``runs retry``).
_RETRY_SCOPE: Final = re.compile(r"/retry\.[0-9]+")
BILLING: Final = "billing"
AUDIT: Final = "audit"
#: The writer node of each demo stream.
_NODES: Final = {ORDERS.name: "source", INVOICES.name: BILLING}
_CAPACITY: Final = 4096


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


def of_runs(scope: str, run_ids: set[str]) -> bool:
    """Whether a stream's ``scope`` is a root scope of one of ``run_ids`` (a first attempt's or a retry's)."""
    root, slash, retry = scope.partition("/")
    return root in run_ids and (not slash or _RETRY_SCOPE.fullmatch(slash + retry) is not None)


def _refuse_other_contents(report: dict[str, Any], path: str | os.PathLike[str], run_id: str) -> None:
    """The demo runs only in a new ledger or its own: never beside an application's records.

    Its own are the runs of its graph (under any ``--run-id``) and their streams.
    """
    demos = {r["run_id"] for r in report["runs"] if r["graph"] == _DEMO_GRAPH} | {run_id}
    others = [
        *(
            f"stream {s['scope']}/{s['node']}/{s['key']}"
            for s in report["streams"]
            if not of_runs(s["scope"], demos)
        ),
        *(f"run {r['run_id']!r}" for r in report["runs"] if r["graph"] != _DEMO_GRAPH),
        *(f"graph run {r['run_id']!r}" for r in report["graph_runs"]),
    ]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise DemoMismatchError(
            f"ledger {path} holds more than the demo ({shown}); the demo writes only into a new "
            "directory or its own ledger: choose another path"
        )


async def run_demo_on(
    ledger: Ledger[Any],
    report: dict[str, Any],
    path: str | os.PathLike[str],
    messages: int,
    progress: ProgressCallback | None,
    progress_interval: float,
    *,
    run_id: str = DEMO_SCOPE,
    fresh: bool = False,
) -> DemoSummary:
    """Run (or resume) the demo as run ``run_id`` on an open ``ledger``, whose ``inspect`` is ``report``.

    ``fresh`` first deletes run ``run_id`` (cancelled first if it was left
    running) with its records and streams, so a new one starts in its place.
    """
    _refuse_other_contents(report, path, run_id)
    run = next((r for r in await ledger.runs() if r.run_id == run_id), None)
    if fresh and run is not None:
        if run.status == "running":  # an interrupted demo: nothing runs it now
            await ledger.cancel(run_id, reason="demo --fresh")
        await ledger.delete(run_id)
        run = None
        report = {**report, "streams": [s for s in report["streams"] if not of_runs(s["scope"], {run_id})]}
    scope = run_id if run is None else run.scope  # a retried run's streams are its attempt's
    found = _read_demo(report, scope)
    again = _again(path, run_id)
    if run is not None and run.status == "cancelled":
        raise DemoMismatchError(
            f"the demo in {path} was cancelled; `python -m ledger runs retry {path} {run_id}` runs it "
            f"again from its first order, {again}"
        )
    if found.finished and (run is None or run.status == "completed"):
        if found.orders != messages:
            raise DemoMismatchError(
                f"ledger {path} holds a finished demo of {found.orders} orders, not {messages}; "
                f"run it again with --messages {found.orders} to see its figures, {again}"
            )
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
            f"not {messages}; run it again with --messages {wanted}, {again}"
        )
    stored = _stored_messages(run)
    if stored is not None and stored != messages:
        raise DemoMismatchError(
            f"ledger {path} holds an unfinished demo of {stored} orders, not {messages}; "
            f"run it again with --messages {stored}, {again}"
        )
    demo = _Demo(messages, progress, progress_interval, billed_before=found.billed, scope=scope)
    if run is None:
        start = ledger.run(
            demo.graph,
            {MESSAGES: messages},
            run_id=run_id,
            on_start=demo.started,
            on_event=demo.observe,
            stream_capacity=_CAPACITY,
        )
    else:
        start = ledger.resume(
            run_id, demo.graph, on_start=demo.started, on_event=demo.observe, stream_capacity=_CAPACITY
        )
    return await demo.run(start, resumed=run is not None)


def _again(path: str | os.PathLike[str], run_id: str) -> str:
    """The ways to run the demo anew, said by a demo that will not run as asked."""
    return (
        f"`python -m ledger demo {path} --fresh` deletes it and starts a new one"
        + ("" if run_id == DEMO_SCOPE else f" (with --run-id {run_id})")
        + ", or --run-id ID runs another beside it"
    )


def _stored_messages(run: RunRecord | None) -> int | None:
    """How many messages the demo run was started with (its stored input)."""
    if run is None or run.graph != _DEMO_GRAPH:
        return None
    value = decode_inputs(demo_graph(), run).get(MESSAGES)
    return value if isinstance(value, int) else None


class _Found(msgspec.Struct, frozen=True):
    """What the ledger says about an earlier demo, read without opening any stream."""

    finished: bool = False
    orders_finished: bool = False
    orders: int = 0
    billed: int = 0
    billing_total: int = 0
    invoices: int = 0
    audit_count: int = 0


def _read_demo(report: dict[str, Any], scope: str) -> _Found:
    """The demo's figures in the streams of root scope ``scope`` (its run's latest attempt)."""
    streams = {
        s["key"]: s for s in report["streams"] if s["scope"] == scope and _NODES.get(s["key"]) == s["node"]
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
        billed=billing["acked_through"] if billing is not None else 0,
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
    store: CheckpointHooks,
    messages: int,
    *,
    progress: ProgressCallback | None = None,
    progress_interval: float = 0.25,
) -> DemoSummary:
    """Run (or resume) the demo graph in checkpoint mode on any store, e.g. :class:`~streams.MemoryStore`.

    ``store`` has the node hooks and ``node_records(scope)`` (to resume from
    its confirmed nodes). :func:`run_demo` is this on the ledger at a path,
    as a ledger run, plus the check for a finished demo.
    """
    demo = _Demo(messages, progress, progress_interval, billed_before=0)
    records = await store.node_records(DEMO_SCOPE)  # type: ignore[attr-defined]
    execution = Execution(
        demo.graph,
        {MESSAGES: messages},
        checkpoint=ExecCheckpoint(DEMO_SCOPE, store),
        stream_capacity=_CAPACITY,
        on_event=demo.observe,
    )
    execution.restore_nodes(records)

    async def start() -> ExecutionResult:
        async with execution:
            demo.started(execution)
            return await execution.wait()

    return await demo.run(start(), resumed=bool(records) or demo.billed_before > 0)


class _Demo:
    """One run of the demo graph: its nodes, the progress reporter, and the summary."""

    def __init__(
        self,
        messages: int,
        progress: ProgressCallback | None,
        progress_interval: float,
        *,
        billed_before: int,
        scope: str = DEMO_SCOPE,
    ) -> None:
        self.messages = messages
        self.scope = scope
        self.progress = progress
        self.progress_interval = progress_interval
        self.billed_before = billed_before
        self.execution: Execution | None = None
        self.opened = anyio.Event()  # both streams are open
        self.began = anyio.current_time()
        self.graph = demo_graph()

    def started(self, execution: Execution) -> None:
        self.execution = execution

    def observe(self, event: ExecutionEvent) -> None:
        """Billing opens invoices before it runs (and reopens it when restored), after orders opened."""
        if isinstance(event, Running | Finished) and event.node == BILLING and not event.path:
            self.opened.set()

    def streams(self) -> tuple[ManagedStream[Order], ManagedStream[Invoice]] | None:
        """The orders and invoices endpoints, once both are open."""
        if self.execution is None:
            return None
        found = {
            ref.key: stream for ref, stream in self.execution.streams().items() if ref.scope == self.scope
        }
        if ORDERS.name in found and INVOICES.name in found:
            return found[ORDERS.name], found[INVOICES.name]
        return None

    def report(self) -> None:
        streams = self.streams()
        if self.progress is not None and streams is not None:
            self.progress(_progress(self.messages, *streams, self.began, self.billed_before))

    async def reporter(self) -> None:
        """Report as soon as the streams are open, then every ``progress_interval`` seconds."""
        await self.opened.wait()
        while True:
            self.report()
            await anyio.sleep(self.progress_interval)

    async def run(self, start: Awaitable[Any], *, resumed: bool) -> DemoSummary:
        outcome: Any = None

        async def main() -> None:
            nonlocal outcome
            outcome = await start

        with single_error():
            async with anyio.create_task_group() as pipeline:
                pipeline.start_soon(self.reporter)
                await main()
                pipeline.cancel_scope.cancel()
        self.report()
        result: ExecutionResult = outcome.result if hasattr(outcome, "result") else outcome
        streams = self.streams()
        assert streams is not None
        orders, invoices = streams
        return DemoSummary(
            orders=orders.snapshot().appended,
            billing_total=result[BILLED].total,
            invoices=invoices.snapshot().appended,
            audit_count=result[AUDITED].count,
            handled=_acked(orders, BILLING) - self.billed_before,
            elapsed=anyio.current_time() - self.began,
            resumed=resumed,
        )


def demo_graph(*, window: int = 1024) -> Graph:
    """The demo as a graph: ``source`` writes orders, ``billing`` bills them into invoices, ``audit`` counts.

    Run as ``demo``, its streams are ``demo/source/orders`` (read by group
    ``billing``) and ``demo/billing/invoices`` (group ``audit``): a reader's
    group is its node's name. ``window`` is the handlers' (the bench varies it).
    """
    demo = Graph("demo", version="1", inputs=[MESSAGES])

    @demo.node(requires=[MESSAGES], provides=[ORDERS], resumable=True)
    async def source(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        for i in range((writer.position or 0) + 1, ctx[MESSAGES] + 1):
            order = Order(id=i, amount=i)
            try:
                writer.send_nowait(order, send_at=i)  # no checkpoint while the stream has room
            except anyio.WouldBlock:
                await writer.send(order, send_at=i)  # full: wait for room, and yield

    add_billing_and_audit(demo, window=window)
    return demo


def add_billing_and_audit(graph: Graph, *, window: int = 1024) -> None:
    """The demo's ``billing`` and ``audit`` nodes, added to ``graph`` (which provides ``orders``)."""

    @graph.node(requires=[ORDERS], provides=[INVOICES, BILLED], resumable=True)
    async def billing(ctx: NodeContext) -> None:
        invoices = ctx.writer(INVOICES)

        async def bill(tx: MessageTx[BillingState], order: Order) -> None:
            state = tx.state
            tx.set_state(BillingState(total=state.total + order.amount, count=state.count + 1))
            tx.send(invoices, Invoice(order=order.id, amount=order.amount))

        result = await ctx.handle_messages(ORDERS, bill, initial_state=BillingState(), window=window)
        ctx.set(BILLED, result.state)

    @graph.node(requires=[INVOICES], provides=[AUDITED])
    async def audit(ctx: NodeContext) -> None:
        async def audit_invoice(tx: MessageTx[AuditState], invoice: Invoice) -> None:
            tx.set_state(AuditState(count=tx.state.count + 1))

        result = await ctx.handle_messages(INVOICES, audit_invoice, initial_state=AuditState(), window=window)
        ctx.set(AUDITED, result.state)


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
