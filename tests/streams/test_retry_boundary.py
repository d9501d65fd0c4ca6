"""A user's own aspect as a retry boundary (``ctx.retry_boundary``): what ``Retry`` gets, it gets.

Checkpoint mode on MemoryStore and on the LMDB ledger, then ordinary mode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import open_ledger
from streams import (
    ExecCheckpoint,
    Execution,
    ExecutionResult,
    Graph,
    Key,
    MemoryStore,
    NodeContext,
    Proceed,
    RetryBoundary,
    run_graph,
)

N = Key("n", int)
OUT = Key("out", int)
NOTE = Key("note", str)


def retry_on(*errors: type[Exception], limit: int = 3) -> Any:
    """An aspect of the user's own: retries only ``errors``, ``limit`` attempts in all."""

    async def retry_some(ctx: NodeContext, proceed: Proceed) -> None:
        boundary = await ctx.retry_boundary(limit)
        while True:
            try:
                await boundary.run(proceed)
                return
            except errors as error:
                if not await boundary.fail(error):
                    raise

    return retry_some


class Script:
    """A node's calls, a step each: "fail" raises ConnectionError, "bad" ValueError, "hold" waits to be
    cancelled (``entered`` set), "ok" sets OUT; every call sets NOTE first and records where it ran."""

    def __init__(self, *steps: str) -> None:
        self.steps = list(steps)
        self.seen: list[tuple[tuple[int, ...], str]] = []
        self.entered: anyio.Event | None = None

    async def __call__(self, ctx: NodeContext) -> None:
        self.seen.append((ctx.attempts, ctx.idempotency_key))
        ctx.set(NOTE, f"try {len(self.seen)}")  # a failed attempt's is dropped, or the next could not
        step = self.steps.pop(0)
        if step == "hold":
            assert self.entered is not None
            self.entered.set()
            await anyio.sleep_forever()
        if step == "fail":
            raise ConnectionError("the service is down")
        if step == "bad":
            raise ValueError("a bad request")
        ctx.set(OUT, ctx[N])


def graph(script: Script, aspect: Any) -> Graph:
    g = Graph("boundary", version="1", inputs=[N])
    g.add_node("call", script, requires=[N], provides=[OUT, NOTE], aspects=[aspect])
    return g


class Session:
    """Run and resume one run id, on a MemoryStore or on an LMDB ledger opened for each call."""

    def __init__(self, opened: Callable[[], AbstractAsyncContextManager[Any]], memory: MemoryStore | None):
        self.opened, self.memory = opened, memory

    async def run(self, g: Graph) -> ExecutionResult:
        return await self._go(g, resume=False)

    async def resume(self, g: Graph) -> ExecutionResult:
        return await self._go(g, resume=True)

    async def _go(self, g: Graph, *, resume: bool) -> ExecutionResult:
        if self.memory is not None:
            execution = Execution(g, {N: 7}, checkpoint=ExecCheckpoint("run-1", self.memory))
            if resume:
                execution.restore_nodes(await self.memory.node_records("run-1"))
            async with execution:
                return await execution.wait()
        async with self.opened() as ledger:
            if resume:
                outcome = await ledger.resume("run-1", g)
            else:
                outcome = await ledger.run(g, {N: 7}, run_id="run-1")
            result: ExecutionResult = outcome.result
            return result


@pytest.fixture(params=["memory", "lmdb"])
def session(request: pytest.FixtureRequest, tmp_path: Path) -> Session:
    @asynccontextmanager
    async def on_lmdb() -> AsyncIterator[Any]:
        async with open_ledger(tmp_path / "ledger") as ledger:
            yield ledger

    return Session(on_lmdb, MemoryStore() if request.param == "memory" else None)


async def crashed(start: Callable[[], Coroutine[Any, Any, object]], script: Script) -> None:
    script.entered = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await script.entered.wait()
        tg.cancel_scope.cancel()


async def test_a_users_boundary_retries_what_it_catches_and_drops_each_failed_attempts_outputs(
    session: Session,
) -> None:
    script = Script("fail", "fail", "ok")
    result = await session.run(graph(script, retry_on(ConnectionError)))
    assert result[OUT] == 7 and result[NOTE] == "try 3"
    assert [attempts for attempts, _ in script.seen] == [(0,), (1,), (2,)]
    assert len({key for _, key in script.seen}) == 3


async def test_a_users_boundary_lets_what_it_does_not_catch_fail_the_node_at_once(session: Session) -> None:
    script = Script("bad", "ok")
    with pytest.raises(ValueError, match="a bad request"):
        await session.run(graph(script, retry_on(ConnectionError)))
    assert [attempts for attempts, _ in script.seen] == [(0,)]


async def test_a_users_boundary_raises_the_last_failure_once_its_budget_is_used_up(session: Session) -> None:
    script = Script("fail", "fail", "ok")
    with pytest.raises(ConnectionError):
        await session.run(graph(script, retry_on(ConnectionError, limit=2)))
    assert [attempts for attempts, _ in script.seen] == [(0,), (1,)]


async def test_a_crash_inside_a_users_attempt_and_a_resume_see_the_same_attempt_and_key(
    session: Session,
) -> None:
    script = Script("fail", "hold", "ok")
    g = graph(script, retry_on(ConnectionError))
    await crashed(lambda: session.run(g), script)
    before = list(script.seen)
    assert [attempts for attempts, _ in before] == [(0,), (1,)]
    result = await session.resume(g)
    assert result[OUT] == 7
    assert script.seen[2] == before[1]  # reclaimed, not advanced: the failure before it was confirmed


async def test_a_boundary_tells_its_position_limit_index_and_scope() -> None:
    seen: list[tuple[int, int, int, str]] = []

    async def watch(ctx: NodeContext, proceed: Proceed) -> None:
        boundary = await ctx.retry_boundary(2)
        assert isinstance(boundary, RetryBoundary) and not boundary.exhausted
        while True:
            seen.append((boundary.position, boundary.limit, boundary.index, boundary.scope))
            try:
                await boundary.run(proceed)
                return
            except ConnectionError as error:
                if not await boundary.fail(error):
                    raise

    async def outer(ctx: NodeContext, proceed: Proceed) -> None:
        await proceed()

    script = Script("fail", "ok")
    g = Graph("boundary", version="1", inputs=[N])
    g.add_node("call", script, requires=[N], provides=[OUT, NOTE], aspects=[outer, watch])
    store = MemoryStore()
    async with Execution(g, {N: 7}, checkpoint=ExecCheckpoint("run-1", store)) as execution:
        assert (await execution.wait())[OUT] == 7
    assert [(position, limit, index) for position, limit, index, _ in seen] == [(2, 2, 0), (2, 2, 1)]
    assert len({scope for *_, scope in seen}) == 2


async def test_ordinary_mode_counts_a_users_attempts_here_with_a_key_for_each() -> None:
    seen: list[tuple[tuple[int, ...], str]] = []

    async def call(ctx: NodeContext) -> None:
        seen.append((ctx.attempts, ctx.idempotency_key))
        if len(seen) < 3:
            raise ConnectionError("the service is down")
        ctx.set(OUT, ctx[N])

    g = Graph("boundary", version="1", inputs=[N])
    g.add_node("call", call, requires=[N], provides=[OUT], aspects=[retry_on(ConnectionError)])
    result = await run_graph(g, {N: 7})
    assert result[OUT] == 7
    assert [attempts for attempts, _ in seen] == [(0,), (1,), (2,)]
    assert len({key for _, key in seen}) == 3


async def test_a_boundary_needs_at_least_one_attempt() -> None:
    async def none_at_all(ctx: NodeContext, proceed: Proceed) -> None:
        await ctx.retry_boundary(0)

    g = Graph("boundary", version="1", inputs=[N])
    g.add_node("call", Script("ok"), requires=[N], provides=[OUT, NOTE], aspects=[none_at_all])
    with pytest.raises(ValueError, match="at least one attempt"):
        await run_graph(g, {N: 7})
