"""What the other tasks of a loop see while a run goes on: how late a periodic callback fires.

The probe is a task that sleeps until a time ``interval`` ahead, notes how
long after that time it was resumed, and sleeps again: the lateness of each
wake-up is the time the event loop spent on something else (its own steps,
or a thread holding the GIL) before it could run the probe. A loop that
blocked on LMDB for an fsync would show the fsync here.

Both event loops wait for timers with ``epoll``, whose timeout is in whole
milliseconds rounded up, so an idle loop can wake a probe up to a millisecond
late; a busy loop (a durable run) polls without a timeout and shows its own
steps. Compare figures of the same run shape, not figures of an idle loop
with a busy one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

import anyio

__all__ = ["INTERVAL", "lateness_probe", "p99_us"]

#: How often the probe asks to be woken (seconds).
INTERVAL: Final = 0.001


async def _probe(interval: float, samples: list[float]) -> None:
    while True:
        due = anyio.current_time() + interval
        await anyio.sleep_until(due)
        samples.append(anyio.current_time() - due)


@asynccontextmanager
async def lateness_probe(
    interval: float = INTERVAL, samples: list[float] | None = None
) -> AsyncIterator[list[float]]:
    """Probe the loop for the block's duration; the list (``samples``, or a new one) holds each
    wake-up's lateness (seconds)."""
    samples = [] if samples is None else samples
    async with anyio.create_task_group() as tg:
        tg.start_soon(_probe, interval, samples)
        try:
            yield samples
        finally:
            tg.cancel_scope.cancel()


def p99_us(samples: Sequence[float]) -> float | None:
    """The 99th percentile of ``samples`` (seconds) in µs, nearest rank; None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, round(0.99 * len(ordered) + 0.5) - 1))
    return ordered[rank] * 1e6
