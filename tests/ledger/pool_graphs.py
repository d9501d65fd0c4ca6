"""The graphs the worker tests run: a chain of nodes that take a while, and write a stream on the way."""

from __future__ import annotations

import os

import anyio

from streams import Graph, Key, MessageTx, NodeContext, Stream

N = Key("n", int)
NUMBERS = Key("numbers", Stream[int])
TOTAL = Key("total", int)
ANSWER = Key("answer", int)
#: Seconds each node takes: long enough for a kill or a pause to land inside a run.
STEP = 0.15
#: A file named in a worker's environment under this name holds every run's last node there while
#: it exists: a pause then lands inside a run, however fast the run is (the test removes the file).
HOLD_WHILE = "POOL_HOLD_WHILE"


async def _held() -> None:
    """Wait while the file ``HOLD_WHILE`` names exists (never, without one)."""
    hold = os.environ.get(HOLD_WHILE)
    # another process's file: nothing to wait on but its presence, looked at every 50 ms
    while hold and await anyio.Path(hold).exists():  # noqa: ASYNC110
        await anyio.sleep(0.05)


def answer(n: int) -> int:
    """What a run with input ``n`` ends with, however often it was interrupted."""
    return (n * (n + 1) // 2) * 2 + 1


def summing(version: str = "1") -> Graph:
    g = Graph("summing", version=version, inputs=[N])

    @g.node(requires=[N], provides=[NUMBERS], resumable=True)
    async def numbers(ctx: NodeContext) -> None:
        writer = ctx.writer(NUMBERS)
        for i in range((writer.position or 0) + 1, ctx[N] + 1):  # after a takeover: from its position
            await writer.send(i, send_at=i)
        await anyio.sleep(STEP)

    @g.node(requires=[NUMBERS], provides=[TOTAL])
    async def add(ctx: NodeContext) -> None:
        async def add_one(tx: MessageTx[int], value: int) -> None:
            tx.set_state(tx.state + value)
            tx.set(TOTAL, tx.state)

        await ctx.handle_messages(NUMBERS, add_one, initial_state=0)
        await anyio.sleep(STEP)

    @g.node(requires=[TOTAL], provides=[ANSWER])
    async def finish(ctx: NodeContext) -> None:
        await _held()
        await anyio.sleep(STEP)
        ctx.set(ANSWER, ctx[TOTAL] * 2 + 1)

    return g


GRAPHS = {"summing": summing()}
