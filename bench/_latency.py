"""Latency from send to downstream delivery: the demo's pipeline with a paced source.

A source sends orders at a fixed rate (or as fast as it can: ``rate=None``)
to ``orders``; group ``billing`` keeps ``Totals`` as explicit state and sends
one invoice per order to ``invoices``; group ``audit`` notes, for each
invoice it is handed, the time since its order was sent. Each order so
crosses two confirmations before audit sees it (its append, billing's
commit) and a third behind it (audit's commit). The first ``warmup``
seconds of orders are left out of the percentiles.

Beside the pipeline the same run measures what a commit costs with nothing
around it: a raw py-lmdb write transaction of one put (the physical floor of
one step) and a bare ``await ledger.backend.env.write(...)`` of the same put (the
ledger's round trip through its writer thread), one after another.

Every LMDB transaction the ledger commits during the pipeline is timed on
the writer thread: its wall time, and the share of the run the writer was
inside one (``writer_busy``). From those times and the moment billing's
handler is called, each order's latency is cut into :data:`STAGES`, for all
orders and for the slowest hundredth: where the slow percentile's time goes.
The garbage collector's pauses during the run are counted beside.

The latency figures are taken with nothing else on the loop. The loop's
lateness comes from a twin run with a probe task beside the pipeline
(:mod:`bench._lateness`), whose latency is reported too: the probe's timer,
due every millisecond, is what a pipeline beside other timed work meets
(a lone commit stays off the loop's thread when a timer is due before it
would end). A run whose result is not exactly the expected one raises
:class:`BenchError`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import os
import statistics
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lmdb

from ledger import open_ledger
from ledger.lmdb._env import write_mode
from streams import HandleResult, MessageTx, StreamHooks, handle_messages, open_scope

from ._lateness import lateness_probe, p99_us
from ._shape import INVOICES, ORDERS, BenchError, Invoice, Order, Totals, expected_total
from ._streams import CAPACITY, WINDOW, verify_ledger

__all__ = [
    "LatencyRun",
    "Percentiles",
    "PgTarget",
    "percentiles",
    "postgres_target",
    "run_latency",
    "run_latency_lmdb",
    "time_ledger_writes",
    "time_raw_commits",
    "time_round_trip_pairs",
]

#: The percentiles every latency figure reports.
QUANTILES = (50.0, 90.0, 99.0, 99.9)

#: An order's latency cut in stages, in order: its send to the committer's batch holding its append
#: (the first handed after the send), that batch's wait for its transaction to begin (the writer
#: thread's wake-up; none on the loop's thread), the append's transaction, its landing to billing's
#: handler, the handler to billing's batch, its wait, billing's transaction, its landing to audit's
#: handler. Each transaction is found by time, the first handed after its cause: a profile, not a proof.
STAGES = (
    "send_to_batch",
    "append_wait",
    "append_txn",
    "append_to_billing",
    "billing_to_batch",
    "billing_wait",
    "billing_txn",
    "billing_to_audit",
)

Percentiles = dict[str, float]


def percentiles(samples: Sequence[float]) -> Percentiles:
    """``p50``, ``p90``, ``p99`` and ``p99.9`` of ``samples`` (seconds) in µs, nearest rank."""
    ordered = sorted(samples)
    if not ordered:
        raise BenchError("no latency samples were taken")
    out: Percentiles = {}
    for q in QUANTILES:
        rank = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
        out[f"p{q:g}"] = ordered[rank] * 1e6
    out["mean"] = statistics.fmean(ordered) * 1e6
    return out


@dataclass
class TxnClock:
    """Every transaction of one ledger, timed on its writer thread."""

    began: list[float] = field(default_factory=list)
    committed: list[float] = field(default_factory=list)
    handed: list[float] = field(default_factory=list)

    def attach(self, env: Any) -> Callable[[], None]:
        """Start timing the batches of ``env`` (a ``LedgerEnv``, a ``PgConnection``); returns how to stop.

        Uses the ledger's ``batch_timer`` where it has one; on a build
        without it (a baseline), the top-level ``begin_write`` and the batch
        observer that follows its commit.
        """
        if hasattr(env, "batch_timer"):

            def timed(handed: float, began: float, committed: float) -> None:
                self.handed.append(handed)
                self.began.append(began)
                self.committed.append(committed)

            env.batch_timer = timed

            def detach() -> None:
                env.batch_timer = None

            return detach
        begin = env.begin_write

        def begin_write(parent: Any = None) -> Any:
            if parent is None:
                self.began.append(time.perf_counter())
            return begin(parent)

        def observe(_writes: int, _ok: int) -> None:
            self.committed.append(time.perf_counter())

        env.begin_write = begin_write
        env.batch_observer = observe

        def restore() -> None:
            del env.begin_write
            env.batch_observer = None

        return restore

    def within(self, start: float, end: float) -> tuple[list[float], float]:
        """The wall times of the transactions that began in ``[start, end]``, and the busy share."""
        walls = [c - b for b, c in zip(self.began, self.committed, strict=False) if start <= b <= end]
        return walls, sum(walls) / (end - start) if end > start else 0.0


@dataclass
class LatencyRun:
    """One paced, verified run of the pipeline."""

    store: str
    sync: bool
    rate: float | None  # orders a second asked for; None: as fast as the source can send
    orders: int
    seconds: float  # from the first send to the last delivery
    latency: Percentiles
    sent_rate: float  # orders a second the source actually sent
    txn_us: Percentiles | None = None
    txns: int = 0
    writer_busy: float | None = None
    #: Per order, the transactions that committed between its send and its delivery: the one in
    #: flight when it was sent, its append's, billing's commit (2 to 3 at best). Unlike a time,
    #: a count the machine's load hardly moves.
    txns_crossed: Percentiles | None = None
    #: How late a task beside the pipeline woke up (:mod:`bench._lateness`), after the warm-up: the
    #: time the loop spent elsewhere, beside the orders' latency it may explain.
    lateness_us: Percentiles | None = None
    #: Per stage of :data:`STAGES`, the median over the measured orders and the mean over their
    #: slowest hundredth (µs).
    stages_us: dict[str, float] | None = None
    slow_stages_us: dict[str, float] | None = None
    #: The garbage collector during the run: how many collections, their total and longest pause.
    gc_collections: int = 0
    gc_pause_ms: float = 0.0
    gc_max_pause_us: float = 0.0

    @property
    def sustained(self) -> bool:
        """Whether the source kept the rate asked for (within 10%) and the pipeline kept up with it."""
        if self.rate is None:
            return True
        return self.sent_rate >= 0.9 * self.rate and self.orders / self.seconds >= 0.9 * self.rate

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "store": self.store,
            "sync": self.sync,
            "rate": self.rate,
            "orders": self.orders,
            "seconds": self.seconds,
            "sent_per_s": self.sent_rate,
            "delivered_per_s": self.orders / self.seconds,
            "sustained": self.sustained,
            "latency_us": self.latency,
        }
        if self.txn_us is not None:
            out["txn_us"] = self.txn_us
            out["txns"] = self.txns
            out["orders_per_txn"] = self.orders / max(self.txns, 1)
            out["writer_busy"] = self.writer_busy
        if self.txns_crossed is not None:
            out["txns_crossed"] = self.txns_crossed
        if self.lateness_us is not None:
            out["loop_lateness_us"] = self.lateness_us
        if self.stages_us is not None:
            out["stages_us"] = self.stages_us
            out["slowest_hundredth_stages_us"] = self.slow_stages_us
        out["gc"] = {
            "collections": self.gc_collections,
            "pause_ms": self.gc_pause_ms,
            "max_pause_us": self.gc_max_pause_us,
        }
        return out


class GcPauses:
    """The garbage collector's pauses while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0

    def __call__(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._started)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self)


def stage_profile(
    sent: Sequence[float], billed: Sequence[float], seen: Sequence[float], clock: TxnClock, measured: range
) -> tuple[dict[str, float], dict[str, float]] | None:
    """:data:`STAGES` of ``measured`` orders: medians over all, means over the slowest hundredth (µs).

    None when the clock lacks the moments its batches were handed (a baseline's).
    """
    handed, began, committed = clock.handed, clock.began, clock.committed
    if not handed or len(handed) != len(committed):
        return None

    def txn(t: float) -> tuple[float, float, float] | None:
        k = bisect.bisect_left(handed, t)
        return None if k == len(handed) else (handed[k], began[k], committed[k])

    rows: list[tuple[float, ...]] = []
    for i in measured:
        first, second = txn(sent[i]), txn(billed[i])
        if first is None or second is None:
            continue
        rows.append(
            (
                first[0] - sent[i],
                first[1] - first[0],
                first[2] - first[1],
                billed[i] - first[2],
                second[0] - billed[i],
                second[1] - second[0],
                second[2] - second[1],
                seen[i] - second[2],
                seen[i] - sent[i],
            )
        )
    if not rows:
        return None
    slow = sorted(rows, key=lambda row: row[-1])[-max(1, len(rows) // 100) :]
    medians = {name: statistics.median(row[j] for row in rows) * 1e6 for j, name in enumerate(STAGES)}
    means = {name: statistics.fmean(row[j] for row in slow) * 1e6 for j, name in enumerate(STAGES)}
    return medians, means


async def run_latency(
    hooks: StreamHooks,
    *,
    rate: float | None,
    orders: int,
    warmup: int,
    window: int = WINDOW,
    clock: TxnClock | None = None,
    store: str = "lmdb",
    sync: bool = True,
    probe: bool = False,
) -> LatencyRun:
    """Run the paced pipeline on ``hooks``: ``orders`` orders at ``rate`` a second; check the result.

    With ``probe``, a lateness probe runs beside it (:mod:`bench._lateness`).
    """
    sent = array("d", bytes(8 * (orders + 1)))
    handled = array("d", bytes(8 * (orders + 1)))  # when billing's handler took the order
    seen = array("d", bytes(8 * (orders + 1)))
    async with open_scope(hooks, scope="latency") as scope:
        stream_in = await scope.open_stream(
            ORDERS, node="source", groups=("billing",), capacity=CAPACITY, resumable=True
        )
        stream_out = await scope.open_stream(
            INVOICES, node="billing", groups=("audit",), capacity=CAPACITY, resumable=True
        )
        if stream_in.snapshot().appended or stream_out.snapshot().appended:
            raise BenchError("the latency bench's store is not fresh")
        orders_out, invoices_out = stream_in.writer(), stream_out.writer()
        results: dict[str, HandleResult[Totals] | HandleResult[int]] = {}
        clock_ = time.perf_counter
        late: list[float] = []  # the probe's samples
        warmed = [0]  # how many of them the warm-up took

        async def source() -> None:
            start = clock_()
            i = 1
            while i <= orders:
                due = orders if rate is None else min(orders, int((clock_() - start) * rate) + 1)
                while i <= due:
                    if i == warmup + 1:
                        warmed[0] = len(late)
                    sent[i] = clock_()
                    try:
                        orders_out.send_nowait(Order(i, i), send_at=i)  # as the demo's source does
                    except anyio.WouldBlock:
                        await orders_out.send(Order(i, i), send_at=i)
                    i += 1
                if rate is None:
                    await anyio.lowlevel.checkpoint()
                elif i <= orders:
                    await anyio.sleep(max(0.0, start + (i - 1) / rate - clock_()))
            await orders_out.finish()

        async def bill(tx: MessageTx[Totals], order: Order) -> None:
            handled[order.id] = clock_()
            tx.set_state(Totals(tx.state.total + order.amount, tx.state.count + 1))
            tx.send(invoices_out, Invoice(order.id, order.amount))

        async def billing() -> None:
            results["billing"] = await handle_messages(
                stream_in.reader("billing"), bill, initial_state=Totals(), window=window
            )
            await invoices_out.finish()

        async def audit_one(tx: MessageTx[int], invoice: Invoice) -> None:
            seen[invoice.order] = clock_()
            tx.set_state(tx.state + 1)

        async def audit() -> None:
            results["audit"] = await handle_messages(
                stream_out.reader("audit"), audit_one, initial_state=0, window=window
            )

        beside = lateness_probe(samples=late) if probe else contextlib.nullcontext(late)
        with GcPauses() as collected:
            async with beside, anyio.create_task_group() as tg:
                tg.start_soon(source)
                tg.start_soon(billing)
                tg.start_soon(audit)
        del late[: warmed[0]]

    billed, audited = results["billing"], results["audit"]
    want = Totals(expected_total(orders), orders)
    if billed.state != want or audited.state != orders:
        raise BenchError(f"billing ended with {billed.state!r}, audit with {audited.state!r}; want {want!r}")
    if any(seen[i] < sent[i] or not seen[i] for i in range(1, orders + 1)):
        raise BenchError("an invoice was delivered before its order was sent, or never")
    first, last = sent[1], max(seen)
    measured = range(min(warmup, orders - 1) + 1, orders + 1)
    run = LatencyRun(
        store=store,
        sync=sync,
        rate=rate,
        orders=orders,
        seconds=last - first,
        latency=percentiles([seen[i] - sent[i] for i in measured]),
        sent_rate=(orders - 1) / (sent[orders] - first) if orders > 1 and sent[orders] > first else 0.0,
        lateness_us=percentiles(late) if late else None,
        gc_collections=len(collected.pauses),
        gc_pause_ms=sum(collected.pauses) * 1e3,
        gc_max_pause_us=max(collected.pauses, default=0.0) * 1e6,
    )
    if clock is not None:
        walls, busy = clock.within(sent[measured.start], last)
        if walls:
            run.txn_us = percentiles(walls)
            run.txns = len(walls)
            run.writer_busy = busy
            committed = sorted(clock.committed)
            crossed = [
                bisect.bisect_left(committed, seen[i]) - bisect.bisect_right(committed, sent[i])
                for i in measured
            ]
            run.txns_crossed = {name: value / 1e6 for name, value in percentiles(crossed).items()}
        profile = stage_profile(sent, handled, seen, clock, measured)
        if profile is not None:
            run.stages_us, run.slow_stages_us = profile
    return run


def _orders_for(rate: float | None, seconds: float, saturation_orders: int) -> tuple[int, int]:
    """Orders to send and how many of them warm up (a tenth of the run, at least one)."""
    n = saturation_orders if rate is None else max(int(rate * seconds), 10)
    return n, max(1, n // 10)


def run_latency_lmdb(
    *,
    rate: float | None,
    seconds: float,
    sync: bool,
    saturation_orders: int = 100_000,
    backend: str = "asyncio",
    workdir: Path | None = None,
    window: int = WINDOW,
    probe: bool = False,
) -> LatencyRun:
    """One paced run on a fresh LMDB ledger in a temporary directory; the ledger is checked after."""
    n, warmup = _orders_for(rate, seconds, saturation_orders)
    with tempfile.TemporaryDirectory(prefix="streamledger-latency-", dir=workdir) as tmp:
        path = Path(tmp) / "ledger"

        async def main() -> LatencyRun:
            async with open_ledger(path, sync=sync) as ledger:
                clock = TxnClock()
                stop = clock.attach(ledger.backend.env)
                try:
                    return await run_latency(
                        ledger.streams,
                        rate=rate,
                        orders=n,
                        warmup=warmup,
                        window=window,
                        clock=clock,
                        sync=sync,
                        probe=probe,
                    )
                finally:
                    stop()

        run = anyio.run(main, backend=backend)
        verify_ledger(path, n)
    return run


def run_latency_postgres(
    url: str,
    *,
    rate: float | None,
    seconds: float,
    saturation_orders: int = 100_000,
    backend: str = "asyncio",
    probe: bool = False,
) -> LatencyRun:
    """One paced run on the PostgreSQL ledger at ``url`` (a fresh database)."""
    from ledger.postgres import open_postgres

    n, warmup = _orders_for(rate, seconds, saturation_orders)

    async def main() -> LatencyRun:
        async with open_postgres(url) as ledger:
            connection = ledger.backend.connection
            # a baseline whose committer times nothing runs without a clock
            clock = TxnClock() if hasattr(connection, "batch_timer") else None
            stop = clock.attach(connection) if clock is not None else None
            try:
                return await run_latency(
                    ledger.streams,
                    rate=rate,
                    orders=n,
                    warmup=warmup,
                    clock=clock,
                    store="postgres",
                    probe=probe,
                )
            finally:
                if stop is not None:
                    stop()

    return anyio.run(main, backend=backend)


#: What each commit of the round-trip figures writes: one put of a message-sized value.
_KEY = b"latency/round-trip"
_VALUE = bytes(100)


def time_raw_commits(count: int, *, sync: bool = True, workdir: Path | None = None) -> Percentiles:
    """``count`` py-lmdb write transactions of one put, one after another, opened as a ledger opens LMDB."""
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="streamledger-raw-commit-", dir=workdir) as tmp:
        env = lmdb.open(tmp, map_size=64 << 20, max_dbs=4, **write_mode(sync))
        try:
            db = env.open_db(b"messages")
            for i in range(count):
                started = time.perf_counter()
                with env.begin(write=True) as txn:
                    txn.put(_KEY + i.to_bytes(8, "big"), _VALUE, db=db)
                walls.append(time.perf_counter() - started)
        finally:
            env.close()
    return percentiles(walls)


def _put(txn: lmdb.Transaction, *, key: bytes, db: Any) -> bool:
    return bool(txn.put(key, _VALUE, db=db))


def time_ledger_writes(
    count: int,
    *,
    sync: bool = True,
    backend: str = "asyncio",
    workdir: Path | None = None,
    lateness: list[float] | None = None,
) -> Percentiles:
    """``count`` bare ``await ledger.backend.env.write(...)`` of the same put, one after another.

    With a ``lateness`` list, ``count`` more writes follow beside a probe task
    (:mod:`bench._lateness`), whose wake-ups' lateness goes to the list: what
    the round trips cost the loop's other tasks. The timed writes run without it.
    """
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="streamledger-round-trip-", dir=workdir) as tmp:

        async def main() -> None:
            async with open_ledger(Path(tmp) / "ledger", sync=sync) as ledger:
                db = ledger.backend.env.db("messages")
                for i in range(count):
                    key = _KEY + i.to_bytes(8, "big")
                    started = time.perf_counter()
                    await ledger.backend.env.write(functools.partial(_put, key=key, db=db))
                    walls.append(time.perf_counter() - started)
                if lateness is None:
                    return
                async with lateness_probe() as samples:
                    for i in range(count, 2 * count):
                        key = _KEY + i.to_bytes(8, "big")
                        await ledger.backend.env.write(functools.partial(_put, key=key, db=db))
                lateness.extend(samples)

        anyio.run(main, backend=backend)
    return percentiles(walls)


def time_round_trip_pairs(
    count: int, *, sync: bool = True, backend: str = "asyncio", workdir: Path | None = None
) -> tuple[Percentiles, Percentiles]:
    """``count`` raw commits and ``count`` ledger writes of the same put, taking turns one by one.

    The raw commit goes to an LMDB environment of its own in the same
    directory, opened as :func:`time_raw_commits` opens it; each pair meets
    the disk at the same moment, so their ratio does not swing with it.
    """
    raw_walls: list[float] = []
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="streamledger-pairs-", dir=workdir) as tmp:
        env = lmdb.open(str(Path(tmp) / "raw"), map_size=64 << 20, max_dbs=4, **write_mode(sync))

        async def main() -> None:
            raw_db = env.open_db(b"messages")
            async with open_ledger(Path(tmp) / "ledger", sync=sync) as ledger:
                db = ledger.backend.env.db("messages")
                for i in range(count):
                    key = _KEY + i.to_bytes(8, "big")
                    started = time.perf_counter()
                    with env.begin(write=True) as txn:
                        txn.put(key, _VALUE, db=raw_db)
                    raw_walls.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    await ledger.backend.env.write(functools.partial(_put, key=key, db=db))
                    walls.append(time.perf_counter() - started)

        try:
            anyio.run(main, backend=backend)
        finally:
            env.close()
    return percentiles(raw_walls), percentiles(walls)


# -- the command ---------------------------------------------------------------------------


def rate_label(rate: float | None) -> str:
    """``1k``, ``50k``, ``max`` (saturation): how a rate is named in the figures' keys."""
    if rate is None:
        return "max"
    return f"{rate / 1000:g}k" if rate >= 1000 else f"{rate:g}"


def parse_rates(text: str) -> list[float | None]:
    """``1000,50000,max`` as rates a second (``max``: as fast as the source can send)."""
    return [None if part.strip() == "max" else float(part) for part in text.split(",")]


def _percentile_keys(prefix: str, figures: Percentiles) -> dict[str, float]:
    return {f"{prefix}_{name.replace('.', '')}_us": value for name, value in figures.items()}


def _median_of(runs: Sequence[Percentiles]) -> Percentiles:
    return {name: statistics.median(r[name] for r in runs) for name in runs[0]}


def bench_latency(args: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    """The command ``python -m bench latency``: every store, rate and sync mode, medians of rounds."""
    rates: list[float | None] = args.rates
    configs: list[tuple[str, bool]] = [("lmdb", True), ("lmdb", False)]
    runs: dict[str, list[LatencyRun]] = {}
    probed: dict[str, list[LatencyRun]] = {}  # the twin runs, a lateness probe beside each
    raw: list[Percentiles] = []
    round_trips: list[Percentiles] = []
    pairs: list[tuple[Percentiles, Percentiles]] = []  # raw commits and ledger writes taking turns
    lateness: list[float] = []  # the probe's, beside the bare ledger writes
    pg_raw: list[Percentiles] = []  # one-row autocommit INSERTs on the same server
    pg_writes: list[Percentiles] = []  # lone appends on the PostgreSQL ledger
    pg, pg_skipped, stack = postgres_target(args, progress)
    if pg is not None:
        configs.append(("postgres", True))
    try:
        for k in range(args.repeat):
            progress(f"round {k + 1}/{args.repeat}")
            raw.append(time_raw_commits(args.commits, workdir=args.workdir))
            round_trips.append(
                time_ledger_writes(
                    args.commits, backend=args.backend, workdir=args.workdir, lateness=lateness
                )
            )
            pairs.append(time_round_trip_pairs(args.commits, backend=args.backend, workdir=args.workdir))
            progress(
                f"  raw py-lmdb commit p50 {raw[-1]['p50']:,.0f} µs; "
                f"ledger write round trip p50 {round_trips[-1]['p50']:,.0f} µs; taking turns "
                f"{pairs[-1][0]['p50']:,.0f} / {pairs[-1][1]['p50']:,.0f} µs"
            )
            if pg is not None:
                from ._pg_round_trip import time_pg_ledger_writes, time_pg_raw_commits
                from ._postgres import new_database

                raw_url, ledger_url = (new_database(pg.server_url, pg.make_url) for _ in range(2))
                pg_raw.append(percentiles(time_pg_raw_commits(raw_url, args.commits)))
                pg_writes.append(
                    percentiles(time_pg_ledger_writes(ledger_url, args.commits, backend=args.backend))
                )
                progress(
                    f"  raw PostgreSQL one-row commit p50 {pg_raw[-1]['p50']:,.0f} µs; "
                    f"PostgreSQL ledger write p50 {pg_writes[-1]['p50']:,.0f} µs"
                )
            for store, sync in configs:
                for rate in rates:
                    name = f"{'pg' if store == 'postgres' else store}{'' if sync else '_nondurable'}"
                    name += f"_{rate_label(rate)}"
                    for probe in (False, True):  # alone, then the twin run beside the probe
                        run = _one_run(args, pg, store=store, sync=sync, rate=rate, probe=probe)
                        (probed if probe else runs).setdefault(name, []).append(run)
                        progress(f"  {name}{' beside the probe' if probe else ''}: {_run_line(run)}")
    finally:
        stack.close()
    out: dict[str, Any] = {
        "bench": "latency",
        "repeat": args.repeat,
        "backend": args.backend,
        "seconds": args.seconds,
        "rates": [rate_label(r) for r in rates],
        "verified": True,
        "postgres_skipped": pg_skipped,
        "load_average_1m": os.getloadavg()[0],
    }
    out.update(_percentile_keys("raw_lmdb_commit", _median_of(raw)))
    out.update(_percentile_keys("ledger_write", _median_of(round_trips)))
    out.update(_percentile_keys("paired_raw_commit", _median_of([raw for raw, _ in pairs])))
    out.update(_percentile_keys("paired_ledger_write", _median_of([write for _, write in pairs])))
    out["loop_lateness_p99_us"] = p99_us(lateness)
    if pg_raw:
        out.update(_percentile_keys("pg_raw_commit", _median_of(pg_raw)))
        out.update(_percentile_keys("pg_write", _median_of(pg_writes)))
        out["pg_write_in_raw_commits"] = out["pg_write_p50_us"] / out["pg_raw_commit_p50_us"]
    for name, figs in runs.items():
        out.update(_percentile_keys(name, _median_of([f.latency for f in figs])))
        out[f"{name}_orders_per_s"] = statistics.median(f.orders / f.seconds for f in figs)
        out[f"{name}_sustained"] = all(f.sustained for f in figs)
        txns = [f.txn_us for f in figs if f.txn_us is not None]
        if txns:
            out.update(_percentile_keys(f"{name}_txn", _median_of(txns)))
            out[f"{name}_writer_busy"] = statistics.median(
                f.writer_busy for f in figs if f.writer_busy is not None
            )
            out[f"{name}_orders_per_txn"] = statistics.median(f.orders / max(f.txns, 1) for f in figs)
        twins = probed.get(name, [])
        if twins:
            out.update(_percentile_keys(f"{name}_beside_probe", _median_of([f.latency for f in twins])))
        late = [f.lateness_us for f in twins if f.lateness_us is not None]
        if late:
            out.update(_percentile_keys(f"{name}_loop_lateness", _median_of(late)))
        for key, stages in (
            ("stage", [f.stages_us for f in figs]),
            ("slow_stage", [f.slow_stages_us for f in figs]),
        ):
            known = [stage for stage in stages if stage is not None]
            for stage in STAGES if known else ():
                out[f"{name}_{key}_{stage}_us"] = statistics.median(k[stage] for k in known)
        out[f"{name}_gc_pause_ms"] = statistics.median(f.gc_pause_ms for f in figs)
        out[f"{name}_gc_max_pause_us"] = statistics.median(f.gc_max_pause_us for f in figs)
        crossed = [f.txns_crossed for f in figs if f.txns_crossed is not None]
        if crossed:
            out[f"{name}_txns_crossed_p50"] = statistics.median(c["p50"] for c in crossed)
            out[f"{name}_txns_crossed_mean"] = statistics.median(c["mean"] for c in crossed)
    sustained = [r for r in rates if r is not None and out.get(f"pg_{rate_label(r)}_sustained")]
    out["pg_highest_sustained_rate"] = max(sustained) if sustained else None
    out["runs"] = [run.summary() for figs in runs.values() for run in figs]
    out["runs_beside_probe"] = [run.summary() for figs in probed.values() for run in figs]
    raw_p50 = out["raw_lmdb_commit_p50_us"]
    goals: dict[str, bool] = {}
    if "lmdb_50k_p50_us" in out:
        goals["lmdb_50k_p50_at_most_1ms"] = out["lmdb_50k_p50_us"] <= 1000
        goals["lmdb_50k_p99_at_most_2ms"] = out["lmdb_50k_p99_us"] <= 2000
        goals["lmdb_50k_p999_at_most_5ms"] = out["lmdb_50k_p999_us"] <= 5000
    if "lmdb_1k_p50_us" in out:
        goals["lmdb_1k_p50_at_most_3_raw_commits"] = out["lmdb_1k_p50_us"] <= 3 * raw_p50
        goals["lmdb_1k_p50_at_most_0.6ms"] = out["lmdb_1k_p50_us"] <= 600
        out["lmdb_1k_p50_in_raw_commits"] = out["lmdb_1k_p50_us"] / raw_p50
    # a lone write's round trip against one raw fsynced commit made beside it, turn by turn
    out["ledger_write_in_raw_commits"] = statistics.median(write["p50"] / raw["p50"] for raw, write in pairs)
    goals["ledger_write_at_most_1.25_raw_commits"] = out["ledger_write_in_raw_commits"] <= 1.25
    out["goals_met"] = goals
    return out


def _one_run(
    args: Any, pg: PgTarget | None, *, store: str, sync: bool, rate: float | None, probe: bool
) -> LatencyRun:
    if store == "lmdb":
        return run_latency_lmdb(
            rate=rate,
            seconds=args.seconds,
            sync=sync,
            saturation_orders=args.saturation_orders,
            backend=args.backend,
            workdir=args.workdir,
            probe=probe,
        )
    assert pg is not None
    from ._postgres import new_database

    return run_latency_postgres(
        new_database(pg.server_url, pg.make_url),
        rate=rate,
        seconds=args.seconds,
        saturation_orders=args.saturation_orders,
        backend=args.backend,
        probe=probe,
    )


def _run_line(run: LatencyRun) -> str:
    lat = run.latency
    txn = "" if run.txn_us is None else f"; txn p50 {run.txn_us['p50']:,.0f} µs"
    busy = "" if run.writer_busy is None else f", writer busy {run.writer_busy:.0%}"
    return (
        f"p50 {lat['p50']:,.0f} p99 {lat['p99']:,.0f} µs, {run.orders / run.seconds:,.0f} orders/s{txn}{busy}"
        f"{'' if run.sustained else ' (rate NOT sustained)'}"
    )


@dataclass(frozen=True)
class PgTarget:
    """The PostgreSQL server a bench runs on: its URL, how to name another database of it, its data."""

    server_url: str
    make_url: Callable[[str], str]
    #: The data directory of a private server (None for ``--url``'s).
    data: Path | None = None


def postgres_target(args: Any, progress: Callable[[str], None]) -> tuple[PgTarget | None, str | None, Any]:
    """A PostgreSQL server for the run (``args.url``, or a private one), or why there is none; its stack."""
    from contextlib import ExitStack

    stack = ExitStack()
    if args.skip_postgres:
        return None, "--skip-postgres", stack
    try:
        from ledger.postgres.server import ServerUnavailableError, private_server
    except ImportError as exc:  # psycopg is an optional extra
        return None, f"ledger.postgres is not importable: {exc}", stack
    if args.url:
        from .__main__ import _database_url

        return PgTarget(args.url, _database_url(args.url)), None, stack
    try:
        server = stack.enter_context(private_server())
    except ServerUnavailableError as exc:
        progress(f"PostgreSQL skipped: {exc}")
        return None, str(exc), stack
    return PgTarget(server.url, server.url_for, server.data), None, stack


def _shown_float(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def show_latency(out: dict[str, Any]) -> str:
    """The figures as a table: one row per store, sync mode and rate."""

    def us(key: str) -> str:
        value = out.get(key)
        return "-" if value is None else f"{value:,.0f}"

    rows: list[tuple[str, ...]] = [
        (
            "µs, send to audit's delivery",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "orders/s",
            "txn p50",
            "writer busy",
            "txns crossed",
            "beside probe p50",
            "lateness p99",
        )
    ]
    for store in ("lmdb", "lmdb_nondurable", "pg"):
        for label in out["rates"]:
            name = f"{store}_{label}"
            if f"{name}_p50_us" not in out:
                continue
            busy = out.get(f"{name}_writer_busy")
            rows.append(
                (
                    f"{name}{'' if out[f'{name}_sustained'] else ' (rate not sustained)'}",
                    us(f"{name}_p50_us"),
                    us(f"{name}_p90_us"),
                    us(f"{name}_p99_us"),
                    us(f"{name}_p999_us"),
                    us(f"{name}_orders_per_s"),
                    us(f"{name}_txn_p50_us"),
                    "-" if busy is None else f"{busy:.0%}",
                    _shown_float(out.get(f"{name}_txns_crossed_mean")),
                    us(f"{name}_beside_probe_p50_us"),
                    us(f"{name}_loop_lateness_p99_us"),
                )
            )
    rows.append(
        (
            "raw py-lmdb commit, one put (durable)",
            us("raw_lmdb_commit_p50_us"),
            *("",) * 2,
            us("raw_lmdb_commit_p99_us"),
            *("",) * 6,
        )
    )
    rows.append(
        (
            "ledger.backend.env.write round trip, one put (durable)",
            us("ledger_write_p50_us"),
            *("",) * 2,
            us("ledger_write_p99_us"),
            *("",) * 6,
        )
    )
    rows.append(
        (
            "the two taking turns: raw commit / ledger write",
            f"{us('paired_raw_commit_p50_us')} / {us('paired_ledger_write_p50_us')}",
            *("",) * 2,
            f"{us('paired_raw_commit_p99_us')} / {us('paired_ledger_write_p99_us')}",
            *("",) * 6,
        )
    )
    if "pg_write_p50_us" in out:
        for label, key in (
            ("PostgreSQL: raw one-row autocommit INSERT", "pg_raw_commit"),
            ("PostgreSQL ledger: a lone append's round trip", "pg_write"),
        ):
            rows.append((label, us(f"{key}_p50_us"), *("",) * 2, us(f"{key}_p99_us"), *("",) * 6))
    lines = _aligned(rows)
    stage_rows: list[tuple[str, ...]] = [("µs: stage median / mean of the slowest 1%", *STAGES)]
    for store in ("lmdb", "lmdb_nondurable", "pg"):
        for label in out["rates"]:
            name = f"{store}_{label}"
            if f"{name}_stage_{STAGES[0]}_us" in out:
                cells = (f"{us(f'{name}_stage_{x}_us')} / {us(f'{name}_slow_stage_{x}_us')}" for x in STAGES)
                stage_rows.append((name, *cells))
    stage_lines = _aligned(stage_rows) if len(stage_rows) > 1 else []
    head = (
        f"latency: {out['seconds']:g} s per rate, median of {out['repeat']}, {out['backend']}, "
        f"result verified; load average {out['load_average_1m']:.1f}"
    )
    skipped = out.get("postgres_skipped")
    lateness = out.get("loop_lateness_p99_us")
    shown = "-" if lateness is None else f"{lateness:,.0f}"
    notes = [
        f"loop lateness p99 beside the round trips: {shown} µs; the paced runs' lateness and their "
        "latency beside the probe come from twin runs with a 1 ms timer task beside the pipeline"
    ]
    if skipped:
        notes.append(f"PostgreSQL skipped: {skipped}")
    if out.get("pg_highest_sustained_rate") is not None:
        notes.append(f"PostgreSQL sustained up to {out['pg_highest_sustained_rate']:,.0f} orders/s here")
    goals = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["goals_met"].items())
    return "\n".join([head, *lines, *notes, f"goals: {goals}", *stage_lines])


def _aligned(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)])
        for row in rows
    ]
