"""The demo pipeline, timed and verified: through the graph, and as bare streams.

A source appends N orders (amounts 1..N) to ``orders`` (resumable, ``send_at=i``);
group ``billing`` keeps a running total and count as explicit state and sends
one invoice per order to ``invoices``; group ``audit`` counts invoices.
:func:`run_graph_pipeline` runs it as the demo does, the demo's graph in
checkpoint mode (each node's record, the streams ending with their nodes);
:func:`run_pipeline` runs the same three handlers as tasks on bare streams,
the baseline for what the graph costs. The clock runs from the start until
all three are done. A run whose result is not exactly the expected one
raises :class:`BenchError`, so it never reports a figure.
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from ledger import LedgerEnv, inspect_ledger, open_ledger
from ledger._demo import AUDITED, BILLED, MESSAGES, demo_graph
from streams import (
    ExecCheckpoint,
    Execution,
    HandleResult,
    MemoryStore,
    MessageTx,
    StreamHooks,
    StreamRef,
    handle_messages,
    open_scope,
)
from streams.store import (
    AppendBatch,
    CheckpointHooks,
    MessageAttempt,
    MessageCommit,
    MessageFail,
    MessageOpen,
    StreamDescriptor,
    StreamFinish,
    StreamOpen,
    StreamOpened,
)
from streams.testing import PassThroughHooks, PassThroughNodeHooks

from ._lateness import lateness_probe
from ._shape import INVOICES, ORDERS, BenchError, Invoice, Order, Totals, expected_total

__all__ = [
    "NullHooks",
    "PipelineRun",
    "run_engine_only",
    "run_graph_pipeline",
    "run_memory",
    "run_pipeline",
    "run_streamledger",
]

#: The handler window the demo uses (``handle_messages``' default).
WINDOW = 1024
CAPACITY = 4096


@dataclass
class HookCounts:
    """How the engine called the store: calls and the messages they carried."""

    appends: int = 0
    appended: int = 0
    commits: int = 0
    committed: int = 0
    other: int = 0
    commit_sizes: list[int] = field(default_factory=list)


class CountingHooks(PassThroughHooks):
    """A :class:`~streams.StreamHooks` that counts calls and passes them on."""

    def __init__(self, inner: StreamHooks) -> None:
        super().__init__(inner)
        self.counts = HookCounts()

    async def open(self, request: StreamOpen) -> StreamOpened:
        self.counts.other += 1
        return await super().open(request)

    async def append(self, batch: AppendBatch) -> None:
        self.counts.appends += 1
        self.counts.appended += len(batch.payloads)
        await super().append(batch)

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        self.counts.other += 1
        return await super().open_message(request)

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        self.counts.other += 1
        return await super().fail_message(request)

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        messages = sum(c.count for c in commits)  # a commit may confirm a run of messages
        self.counts.commits += 1
        self.counts.committed += messages
        self.counts.commit_sizes.append(messages)
        await super().commit(commits)

    async def finish(self, request: StreamFinish) -> None:
        self.counts.other += 1
        await super().finish(request)


class NullHooks:
    """A store that confirms everything and keeps nothing: what the engine costs by itself.

    A measuring device only: it makes the pipeline's figure the engine's
    event-loop work alone, with no store logic, no thread and no I/O.
    """

    async def open(self, request: StreamOpen) -> StreamOpened:
        return StreamOpened.empty(request.ref, request.groups)

    async def append(self, batch: AppendBatch) -> None:
        pass

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        return MessageAttempt(index=0, exhausted=False, state=None)

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        index = request.index + 1
        return MessageAttempt(index=index, exhausted=index >= request.limit, state=None)

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        pass

    async def finish(self, request: StreamFinish) -> None:
        pass

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        return None  # it keeps nothing


@dataclass
class PipelineRun:
    """One timed, verified run of the pipeline."""

    store: str  # "lmdb" or "memory"
    sync: bool
    messages: int
    seconds: float
    hooks: HookCounts
    txns: int = 0  # LMDB write transactions (commit batches) the ledger made
    txn_writes: int = 0  # hook calls those transactions carried
    loop_cpu: float | None = None  # CPU seconds of the event-loop thread during the run
    writer_cpu: float | None = None  # CPU seconds of the writer thread, first to last batch
    #: How late each wake-up of a probe task of the same loop was, in seconds (``probe=True`` runs).
    lateness: list[float] = field(default_factory=list)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    def stats(self) -> dict[str, float]:
        """Batch sizes seen: per hook call and per LMDB transaction."""
        h = self.hooks
        out: dict[str, float] = {
            "append_calls": h.appends,
            "orders_per_append": h.appended / max(h.appends, 1),
            "commit_calls": h.commits,
            "messages_per_commit_call": h.committed / max(h.commits, 1),
        }
        if self.txns:
            out["ledger_txns"] = self.txns
            out["hook_calls_per_txn"] = self.txn_writes / self.txns
            out["orders_per_txn"] = self.messages / self.txns
        if self.loop_cpu is not None and self.writer_cpu is not None:
            # Both threads run Python under one GIL: their CPU adds up, it does not overlap.
            out["loop_cpu_us_per_order"] = self.loop_cpu / self.messages * 1e6
            out["writer_cpu_us_per_order"] = self.writer_cpu / self.messages * 1e6
            out["wall_us_per_order"] = self.seconds / self.messages * 1e6
        return out


async def run_pipeline(hooks: StreamHooks, n: int, *, window: int = WINDOW) -> float:
    """Run the pipeline on ``hooks``; return its seconds after checking its result."""
    async with open_scope(hooks, scope="bench") as scope:
        orders = await scope.open_stream(
            ORDERS, node="source", groups=("billing",), capacity=CAPACITY, resumable=True
        )
        invoices = await scope.open_stream(
            INVOICES, node="billing", groups=("audit",), capacity=CAPACITY, resumable=True
        )
        if orders.snapshot().appended or invoices.snapshot().appended:
            raise BenchError("the bench ledger is not fresh")
        orders_out = orders.writer()
        invoices_out = invoices.writer()
        results: dict[str, HandleResult[Totals] | HandleResult[int]] = {}

        async def source() -> None:
            for i in range(1, n + 1):
                try:
                    orders_out.send_nowait(Order(i, i), send_at=i)  # as the demo's source: yield when full
                except anyio.WouldBlock:
                    await orders_out.send(Order(i, i), send_at=i)
            await orders_out.finish()

        async def bill(tx: MessageTx[Totals], order: Order) -> None:
            tx.set_state(Totals(tx.state.total + order.amount, tx.state.count + 1))
            tx.send(invoices_out, Invoice(order.id, order.amount))

        async def billing() -> None:
            results["billing"] = await handle_messages(
                orders.reader("billing"), bill, initial_state=Totals(), window=window
            )
            await invoices_out.finish()

        async def count(tx: MessageTx[int], invoice: Invoice) -> None:
            tx.set_state(tx.state + 1)

        async def audit() -> None:
            results["audit"] = await handle_messages(
                invoices.reader("audit"), count, initial_state=0, window=window
            )

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(source)
            tg.start_soon(billing)
            tg.start_soon(audit)
        seconds = time.perf_counter() - started

    billed, audited = results["billing"], results["audit"]
    want = Totals(expected_total(n), n)
    if billed.state != want or billed.handled != n:
        raise BenchError(f"billing ended with {billed.state!r} after {billed.handled}; want {want!r}")
    if audited.state != n or audited.handled != n:
        raise BenchError(f"audit counted {audited.state!r} invoices; want {n}")
    for snap in (orders.snapshot(), invoices.snapshot()):
        if snap.appended != n or not snap.finished or any(g.acked_through != n for g in snap.groups):
            raise BenchError(f"stream {snap.key} ended unfinished or unacknowledged: {snap!r}")
    return seconds


class _CountedStreams(PassThroughNodeHooks):
    """A store's node hooks, with stream hooks that count their calls."""

    def __init__(self, nodes: CheckpointHooks, streams: StreamHooks) -> None:
        super().__init__(nodes)
        self._streams = streams

    @property
    def streams(self) -> StreamHooks:
        return self._streams


async def run_graph_pipeline(
    nodes: CheckpointHooks, streams: StreamHooks, n: int, *, window: int = WINDOW
) -> float:
    """Run the demo's graph in checkpoint mode (``streams`` in place of the store's own stream hooks)."""
    hooks = _CountedStreams(nodes, streams)
    graph = demo_graph(window=window)
    execution = Execution(
        graph, {MESSAGES: n}, checkpoint=ExecCheckpoint("bench", hooks), stream_capacity=CAPACITY
    )
    started = time.perf_counter()
    async with execution:
        result = await execution.wait()
    seconds = time.perf_counter() - started
    want = Totals(expected_total(n), n)
    if result[BILLED] != want or result[AUDITED].count != n:
        raise BenchError(
            f"the graph billed {result[BILLED]!r} and audited {result[AUDITED]!r}; want {want!r}, {n}"
        )
    for stream in execution.streams().values():
        snap = stream.snapshot()
        if snap.appended != n or not snap.finished or any(g.acked_through != n for g in snap.groups):
            raise BenchError(f"stream {snap.key} ended unfinished or unacknowledged: {snap!r}")
    return seconds


def run_streamledger(
    n: int,
    *,
    sync: bool,
    window: int = WINDOW,
    backend: str = "asyncio",
    workdir: Path | None = None,
    graph: bool = True,
    probe: bool = False,
) -> PipelineRun:
    """One pipeline run on a fresh LMDB ledger in a temporary directory: the demo's graph, or bare streams.

    Besides the time it records the CPU time of the event-loop thread and of
    the ledger's writer thread (read at the end of each commit batch, on that
    thread), and the size of every commit batch. With ``probe`` a task of the
    same loop records how late each of its wake-ups, one a millisecond, came
    (:mod:`bench._lateness`).
    """
    batches: list[int] = []
    writer_cpu: dict[int, list[float]] = {}
    loop_cpu: list[float] = []
    counting: list[CountingHooks] = []
    lateness: list[float] = []

    def observe(writes: int, _ok: int) -> None:
        batches.append(writes)
        now = time.thread_time()
        writer_cpu.setdefault(threading.get_ident(), [now, now])[1] = now

    with tempfile.TemporaryDirectory(prefix="streamledger-bench-", dir=workdir) as tmp:

        async def main() -> float:
            async with open_ledger(Path(tmp) / "ledger", sync=sync) as ledger:
                hooks = CountingHooks(ledger.streams)
                counting.append(hooks)

                async def pipeline() -> float:
                    if graph:
                        return await run_graph_pipeline(ledger.nodes, hooks, n, window=window)
                    return await run_pipeline(hooks, n, window=window)

                ledger.backend.env.batch_observer = observe
                started = time.thread_time()
                try:
                    if not probe:
                        return await pipeline()
                    async with lateness_probe() as samples:
                        seconds = await pipeline()
                    lateness.extend(samples)
                    return seconds
                finally:
                    loop_cpu.append(time.thread_time() - started)
                    ledger.backend.env.batch_observer = None

        seconds = anyio.run(main, backend=backend)
        verify_ledger(Path(tmp) / "ledger", n)
    return PipelineRun(
        "lmdb",
        sync,
        n,
        seconds,
        counting[0].counts,
        txns=len(batches),
        txn_writes=sum(batches),
        loop_cpu=loop_cpu[0],
        writer_cpu=sum(last - first for first, last in writer_cpu.values()),
        lateness=lateness,
    )


def verify_ledger(path: Path, n: int) -> None:
    """Reopen the closed ledger and check what it holds, not what the run said."""
    env = LedgerEnv.open(path, create=False)
    try:
        found = {s["key"]: s for s in inspect_ledger(env)["streams"]}
    finally:
        env.close()
    try:
        orders, invoices = found["orders"], found["invoices"]
        (billing,) = orders["groups"]
        (audit,) = invoices["groups"]
    except (KeyError, ValueError) as exc:
        raise BenchError(f"the ledger at {path} lacks the pipeline's streams ({exc!r})") from None
    want_billing = {"total": expected_total(n), "count": n}
    if (
        orders["appended"] != n
        or invoices["appended"] != n
        or not (orders["finished"] and invoices["finished"])
        or billing["acked_through"] != n
        or audit["acked_through"] != n
        or billing["state"] != want_billing
        or audit["state"] not in (n, {"count": n})  # bare streams count in an int, the graph in AuditState
    ):
        raise BenchError(f"the ledger at {path} holds the wrong result: {found!r}")


def run_memory(n: int, *, window: int = WINDOW, backend: str = "asyncio", probe: bool = False) -> PipelineRun:
    """One pipeline run on :class:`~streams.MemoryStore`: the engine's own CPU ceiling.

    With ``probe``, beside the lateness probe: what the loop's other tasks see with no ledger.
    """
    counting = CountingHooks(MemoryStore())
    lateness: list[float] = []

    async def main() -> float:
        if not probe:
            return await run_pipeline(counting, n, window=window)
        async with lateness_probe() as samples:
            seconds = await run_pipeline(counting, n, window=window)
        lateness.extend(samples)
        return seconds

    seconds = anyio.run(main, backend=backend)
    return PipelineRun("memory", False, n, seconds, counting.counts, lateness=lateness)


def run_engine_only(n: int, *, window: int = WINDOW, backend: str = "asyncio") -> PipelineRun:
    """One pipeline run on :class:`NullHooks`: the engine's event-loop work alone."""
    counting = CountingHooks(NullHooks())
    seconds = anyio.run(functools.partial(run_pipeline, counting, n, window=window), backend=backend)
    return PipelineRun("null", False, n, seconds, counting.counts)
