"""Recovery cost: opening a ledger with a million acknowledged messages versus a thousand.

Each ledger is built through the normal API (``sync=False`` to build fast):
a resumable source appends ``acked + pending`` orders to ``orders`` while
``billing`` handles the first ``acked`` of them and then holds, so the
ledger closes with ``pending`` messages unacknowledged and the stream still
active. Timed, per repeat: ``open_ledger`` + ``open_stream`` + receiving every
message of the unacknowledged tail. Messages acknowledged by every group are
compacted by the store, so the two times should be about the same.
"""

from __future__ import annotations

import functools
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from ledger import LedgerEnv, inspect_ledger, open_ledger
from streams import MessageTx, handle_messages, open_scope

from ._shape import ORDERS, BenchError, Order, Totals, expected_total, median

__all__ = ["RecoveryRun", "build_ledger", "time_recovery"]

CAPACITY = 4096


@dataclass(frozen=True)
class RecoveryRun:
    acked: int
    pending: int
    build_seconds: float
    open_seconds: list[float]
    data_bytes: int

    @property
    def median_seconds(self) -> float:
        return median(self.open_seconds)


async def build_ledger(path: Path, *, acked: int, pending: int) -> None:
    """Append ``acked + pending`` orders; acknowledge exactly the first ``acked``."""
    n = acked + pending
    async with open_ledger(path, sync=False) as ledger, open_scope(ledger.streams, scope="bench") as scope:
        orders = await scope.open_stream(
            ORDERS, node="source", groups=("billing",), capacity=CAPACITY, resumable=True
        )
        writer = orders.writer()
        hold = anyio.Event()

        async def source() -> None:
            for i in range(1, n + 1):
                await writer.send(Order(i, i), send_at=i)
            await writer.flush()

        async def bill(tx: MessageTx[Totals], order: Order) -> None:
            if tx.seq > acked:
                await hold.wait()  # never set: the rest stays pending
            tx.set_state(Totals(tx.state.total + order.amount, tx.state.count + 1))

        async def billing() -> None:
            await handle_messages(orders.reader("billing"), bill, initial_state=Totals())

        async with anyio.create_task_group() as tg:
            tg.start_soon(billing)
            await source()
            # The handler holds at acked + 1; wait for the commits before it to land.
            # (There is no public event for a frontier moving, so poll the snapshot.)
            while orders.snapshot().groups[0].acked_through < acked:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        snap = orders.snapshot()
        if snap.appended != n or snap.groups[0].acked_through != acked:
            raise BenchError(f"building the recovery ledger ended at {snap!r}")


async def _open_once(path: Path, *, acked: int, pending: int) -> float:
    started = time.perf_counter()
    async with open_ledger(path, create=False) as ledger, open_scope(ledger.streams, scope="bench") as scope:
        orders = await scope.open_stream(
            ORDERS, node="source", groups=("billing",), capacity=CAPACITY, resumable=True
        )
        reader = orders.reader("billing")
        first = last = None
        for _ in range(pending):
            message = await reader.receive()
            first = message.seq if first is None else first
            last = message.seq
        seconds = time.perf_counter() - started
        snap = orders.snapshot()
    if (first, last) != ((acked + 1, acked + pending) if pending else (None, None)):
        raise BenchError(f"recovered tail runs {first}..{last}; want {acked + 1}..{acked + pending}")
    if snap.appended != acked + pending or snap.groups[0].acked_through != acked:
        raise BenchError(f"recovered stream is at {snap!r}")
    if orders.position != acked + pending:
        raise BenchError(f"recovered position {orders.position}; want {acked + pending}")
    return seconds


def _check_ledger(path: Path, *, acked: int, pending: int) -> None:
    """Read the built ledger back: appended, frontier and the billing state."""
    env = LedgerEnv.open(path, create=False)
    try:
        (orders,) = inspect_ledger(env)["streams"]
    finally:
        env.close()
    (billing,) = orders["groups"]
    want = {"total": expected_total(acked), "count": acked}
    if (
        orders["appended"] != acked + pending
        or billing["acked_through"] != acked
        or billing["pending"] != pending
        or billing["state"] != want
    ):
        raise BenchError(f"the recovery ledger holds {orders!r}")


def time_recovery(
    *, acked: int, pending: int, repeat: int = 5, backend: str = "asyncio", workdir: Path | None = None
) -> RecoveryRun:
    """Build a ledger, then time reopening it ``repeat`` times."""
    with tempfile.TemporaryDirectory(prefix="recovery-bench-", dir=workdir) as tmp:
        path = Path(tmp) / "ledger"
        started = time.perf_counter()
        build = functools.partial(build_ledger, path, acked=acked, pending=pending)
        anyio.run(build, backend=backend)
        build_seconds = time.perf_counter() - started
        _check_ledger(path, acked=acked, pending=pending)
        reopen = functools.partial(_open_once, path, acked=acked, pending=pending)
        times = [anyio.run(reopen, backend=backend) for _ in range(repeat)]
        data_bytes = (path / "data.mdb").stat().st_size
    return RecoveryRun(acked, pending, build_seconds, times, data_bytes)
