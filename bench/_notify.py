"""How soon an idle group member on PostgreSQL handles a message another process appended.

A writer process opens a stream of one partition and appends one message
a line of its standard input, each holding the wall-clock time
(``time.time_ns()``) at which it was sent; this process runs one member of
the stream's group (``ledger.postgres.consume``), whose handler notes when
it starts. Between samples the member is idle (it handled everything,
and waits), so each sample is the path of a notification: the writer's
commit, the server's notification, the member's listener waking its
follower, the follower's read, and the handler's start. The member keeps the default
poll, which bounds its waits only while its listener is away: no sample is
a poll's.

Then the member stays idle for ``idle_seconds``, and the
transactions it commits meanwhile are counted: its renewals, a third of a
lease apart, and nothing else while its listener listens.

Beside it, the writer's own figure: from its send to its flush's return
(the append's commit, confirmed).

Run as a module, it is the writer: ``python -m bench._notify URL``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.to_thread
import msgspec

from ledger.postgres import consume, open_postgres
from ledger.postgres._store import PgConnection
from streams import Key, MessageTx, Stream, open_scope

from ._shape import BenchError

__all__ = ["NotifyRun", "run_notify_delivery"]

SCOPE: Final = "notify"
NODE: Final = "writer"
STAMPS = Key("stamps", Stream[int])
#: How long the member stays idle before each sample (seconds): it waits on its listener then.
IDLE_SECONDS: Final = 0.02
#: How long after the last sample the idle member's count starts (seconds): its ack is committed.
SETTLE_SECONDS: Final = 0.2
#: How long a sample waits for the member's handler at most (seconds).
SAMPLE_SECONDS: Final = 15.0


class NotifyRun(msgspec.Struct, frozen=True):
    """Each sample's delays (microseconds): to the member's handler, and to the writer's confirmation.

    With the transactions a second of the idle member afterwards.
    """

    delivery_us: list[float]
    append_us: list[float]
    idle_txns_per_s: float


def run_notify_delivery(
    url: str, samples: int, *, idle_seconds: float = 3.0, backend: str = "asyncio"
) -> NotifyRun:
    """``samples`` delays from a send in another process to the idle member's handler (and its commit).

    A first message, handled once the member follows its partition, is left out.
    """
    return anyio.run(_measure, url, samples, idle_seconds, backend=backend)


async def _measure(url: str, samples: int, idle_seconds: float) -> NotifyRun:
    delays: list[float] = []
    handled = anyio.Event()

    async def handler(tx: MessageTx[None], sent_ns: int) -> None:
        nonlocal handled
        delays.append((time.time_ns() - sent_ns) / 1000)
        handled.set()

    command = [sys.executable, "-m", "bench._notify", url]
    async with await anyio.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as writer:
        assert writer.stdin is not None and writer.stdout is not None
        if (await writer.stdout.receive()).strip() != b"ready":  # its stream is open
            raise BenchError("the notification bench's writer did not start")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_member, url, handler)
            for _ in range(samples + 1):  # the first, to a member starting, is left out
                await anyio.sleep(IDLE_SECONDS)  # the member is idle, waiting on its listener
                await writer.stdin.send(b"send\n")
                with anyio.fail_after(SAMPLE_SECONDS):
                    await handled.wait()
                handled = anyio.Event()
            await anyio.sleep(SETTLE_SECONDS)  # the last sample's ack commits, uncounted
            before = PgConnection.committed_in_process
            await anyio.sleep(idle_seconds)
            idle = (PgConnection.committed_in_process - before) / idle_seconds
            await writer.stdin.send(b"finish\n")  # the member returns once it read the end
        appended = b""
        async for chunk in writer.stdout:
            appended += chunk
        if await writer.wait() != 0:
            raise BenchError("the notification bench's writer failed")
    if len(delays) != samples + 1:
        raise BenchError(f"the member handled {len(delays)} of {samples + 1} messages")
    return NotifyRun(delays[1:], msgspec.json.decode(appended, type=list[float])[1:], idle)


async def _member(url: str, handler: Callable[[MessageTx[None], int], Awaitable[None]]) -> None:
    await consume(
        url,
        STAMPS,
        handler,
        scope=SCOPE,
        node=NODE,
        partitions=1,
        group="member",
        owner="bench",
        report=lambda partition, event: None,
    )


def _one_key(stamp: int) -> int:
    return 0


async def _write(url: str) -> None:
    async with open_postgres(url) as ledger, open_scope(ledger.streams, scope=SCOPE) as scope:
        stream = await scope.open_partitioned(
            STAMPS, node=NODE, partitions=1, partition_key=_one_key, groups=("member",)
        )
        writer = stream.writer()
        print("ready", flush=True)
        appended: list[float] = []
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            if line.strip() != "send":
                break
            started = time.perf_counter()
            await writer.send(time.time_ns())
            await writer.flush()
            appended.append((time.perf_counter() - started) * 1e6)
        await writer.finish()
    print(msgspec.json.encode(appended).decode(), flush=True)


if __name__ == "__main__":
    anyio.run(_write, sys.argv[1])
