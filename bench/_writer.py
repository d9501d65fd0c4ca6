"""The ledger writer's commit rate alone and next to a CPU-busy event loop.

DESIGN.md's GIL trap: a thread committing LMDB transactions beside an event
loop that keeps the GIL busy may get a small fraction of its solo rate. This
bench appends orders, then confirms them through ``ledger.streams.commit`` in
batches like a handler's (each message: its ack, a new billing state and one
invoice), awaiting one batch at a time: first with nothing else running, then
with a task spinning on the loop in pure Python in slices, idling briefly
between them.

The idle moment matters. CPython hands the GIL to a waiting thread only when
its holder blocks or has held it for a whole switch interval with no other
switch; a loop that spins and only yields (each yield polls for I/O, a
release and re-take of the GIL) can starve the writer thread for seconds.
Keep CPU-heavy work off the event loop (``anyio.to_thread``), as for any
async program that shares its process with threads.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.lowlevel
import msgspec

from ledger import Ledger, LmdbBackend, open_ledger
from streams import ManagedStream, open_scope
from streams.store import MessageCommit, MessageRef, OutputBatch

from ._shape import INVOICES, ORDERS, BenchError, Invoice, Order, Totals

__all__ = ["WriterPhase", "WriterRun", "run_writer"]

_encode = msgspec.msgpack.encode


@dataclass(frozen=True)
class WriterPhase:
    name: str
    batches: int
    messages: int
    seconds: float
    spins: int  # busy slices the loop completed meanwhile

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds


@dataclass(frozen=True)
class WriterRun:
    batch: int
    slice_ms: float
    switch_interval: float
    sync: bool
    phases: list[WriterPhase]


class _Committer:
    """Builds and commits the next batch of handler-shaped commits."""

    def __init__(
        self, ledger: Ledger[LmdbBackend], orders: ManagedStream[Order], invoices: ManagedStream[Invoice]
    ):
        self.ledger = ledger
        self.orders = orders
        self.invoices = invoices
        self.next_seq = 1
        self.totals = Totals()

    def build(self, size: int) -> list[MessageCommit]:
        commits: list[MessageCommit] = []
        for _ in range(size):
            seq = self.next_seq
            self.next_seq += 1
            self.totals = Totals(self.totals.total + seq, self.totals.count + 1)
            commits.append(
                MessageCommit(
                    message=MessageRef(
                        ref=self.orders.ref,
                        group="billing",
                        generation=self.orders.generation,
                        seq=seq,
                    ),
                    node="billing",
                    state=_encode(self.totals),
                    outputs=(
                        OutputBatch(
                            ref=self.invoices.ref,
                            generation=self.invoices.generation,
                            first_seq=seq,
                            payloads=(_encode(Invoice(seq, seq)),),
                        ),
                    ),
                )
            )
        return commits


#: How long the busy task idles between slices (a loop that never blocks starves every thread).
IDLE_S = 0.0005


async def _phase(
    name: str, committer: _Committer, *, batch: int, batches: int, seconds: float, busy: bool, slice_s: float
) -> WriterPhase:
    stop = anyio.Event()
    spins = 0

    async def spin() -> None:
        nonlocal spins
        while not stop.is_set():
            deadline = time.perf_counter() + slice_s
            x = 0
            while time.perf_counter() < deadline:
                x += 1
            spins += 1
            await anyio.sleep(IDLE_S)

    done = 0
    async with anyio.create_task_group() as tg:
        if busy:
            tg.start_soon(spin)
            await anyio.lowlevel.checkpoint()
        started = time.perf_counter()
        while done < batches and time.perf_counter() - started < seconds:
            await committer.ledger.streams.commit(committer.build(batch))
            done += 1
        elapsed = time.perf_counter() - started
        stop.set()
    return WriterPhase(name, done, done * batch, elapsed, spins)


async def _run(
    path: Path,
    *,
    batch: int,
    batches: int,
    seconds: float,
    slice_s: float,
    switch_interval: float,
    sync: bool,
) -> list[WriterPhase]:
    total = 2 * batch * batches
    async with open_ledger(path, sync=sync) as ledger, open_scope(ledger.streams, scope="bench") as scope:
        orders = await scope.open_stream(ORDERS, node="source", groups=("billing",), capacity=total)
        invoices = await scope.open_stream(INVOICES, node="billing", groups=("audit",), capacity=total)
        writer = orders.writer()
        for i in range(1, total + 1):
            await writer.send(Order(i, i))
        await writer.flush()
        committer = _Committer(ledger, orders, invoices)
        phases = [
            await _phase(
                "solo", committer, batch=batch, batches=batches, seconds=seconds, busy=False, slice_s=slice_s
            )
        ]
        previous = sys.getswitchinterval()
        sys.setswitchinterval(switch_interval)
        try:
            phases.append(
                await _phase(
                    "busy_loop",
                    committer,
                    batch=batch,
                    batches=batches,
                    seconds=seconds,
                    busy=True,
                    slice_s=slice_s,
                )
            )
        finally:
            sys.setswitchinterval(previous)
        committed = committer.next_seq - 1
    if sum(p.messages for p in phases) != committed or committed == 0:
        raise BenchError("the writer bench lost count of its commits")
    return phases


def run_writer(
    *,
    batch: int = 256,
    batches: int = 100,
    seconds: float = 3.0,
    slice_ms: float = 2.0,
    switch_interval: float | None = None,
    sync: bool = True,
    backend: str = "asyncio",
    workdir: Path | None = None,
) -> WriterRun:
    """Time ``batches`` commit batches (or ``seconds``, whichever ends first) solo, then busy."""
    interval = sys.getswitchinterval() if switch_interval is None else switch_interval
    with tempfile.TemporaryDirectory(prefix="writer-bench-", dir=workdir) as tmp:

        async def main() -> list[WriterPhase]:
            return await _run(
                Path(tmp) / "ledger",
                batch=batch,
                batches=batches,
                seconds=seconds,
                slice_s=slice_ms / 1000,
                switch_interval=interval,
                sync=sync,
            )

        phases = anyio.run(main, backend=backend)
    return WriterRun(batch, slice_ms, interval, sync, phases)
