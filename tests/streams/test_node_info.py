"""What a node knows of where it runs: its run id, its Retry attempts and an idempotency key.

Checkpoint mode on MemoryStore and on the LMDB ledger (``ledger.run`` and
``ledger.resume``, the ledger closed and opened again after a crash), then
ordinary mode.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import anyio
import pytest

from ledger import open_ledger
from streams import (
    Aspect,
    ExecCheckpoint,
    Execution,
    ExecutionResult,
    Graph,
    Key,
    MemoryStore,
    NodeContext,
    Retry,
    run_graph,
)

ROOT = Path(__file__).resolve().parents[2]
N = Key("n", int)
OUT = Key("out", int)
#: What a key looks like: hex digits only, whatever the run id and the node are called.
KEY = re.compile(r"[0-9a-f]{32}")


class Seen(NamedTuple):
    run_id: str | None
    attempts: tuple[int, ...]
    attempt: int
    key: str


class Script:
    """A node's calls, a step each: "fail" raises, "hold" sets ``entered`` and waits to be cancelled,
    "ok" sets OUT; ``seen`` is what each call read of where it ran."""

    def __init__(self, *steps: str) -> None:
        self.steps = list(steps)
        self.seen: list[Seen] = []
        self.entered: anyio.Event | None = None

    async def __call__(self, ctx: NodeContext) -> None:
        key = ctx.idempotency_key
        assert KEY.fullmatch(key), key
        assert ctx.idempotency_key == key  # the same each time the attempt asks
        self.seen.append(Seen(ctx.run_id, ctx.attempts, ctx.attempt, key))
        step = self.steps.pop(0)
        if step == "hold":
            assert self.entered is not None
            self.entered.set()
            await anyio.sleep_forever()
        if step == "fail":
            raise ValueError("the payment service is down")
        ctx.set(OUT, ctx[N])


def retried(script: Script, *, attempts: int = 3) -> Graph:
    """One node, ``charge``, under a Retry of its own."""
    g = Graph("charging", version="1", inputs=[N])
    g.add_node("charge", script, requires=[N], provides=[OUT], aspects=[Retry(attempts)])
    return g


def mounted(script: Script, *, attempts: int = 3) -> Graph:
    """``charge`` (no aspect of its own) inside the Sub mount ``pay``, which has a Retry."""
    child = Graph("payment", version="1", inputs=[N])
    child.add_node("charge", script, requires=[N], provides=[OUT])
    g = Graph("order", version="1", inputs=[N])
    g.sub("pay", child, inlets={N: N}, outlets={OUT: OUT}, aspects=[Retry(attempts)])
    return g


class Host(Protocol):
    async def run(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, aspects: Iterable[Aspect] = ()
    ) -> ExecutionResult: ...

    async def resume(
        self, run_id: str, graph: Graph, *, aspects: Iterable[Aspect] = ()
    ) -> ExecutionResult: ...


class MemoryHost:
    """Run/Resume by hand on a MemoryStore: ``ExecCheckpoint(run_id, store)``, then its records restored."""

    def __init__(self, store: MemoryStore, inputs: dict[str, Mapping[Key[Any], Any]]) -> None:
        self.store, self.inputs = store, inputs

    async def run(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, aspects: Iterable[Aspect] = ()
    ) -> ExecutionResult:
        self.inputs[run_id] = inputs
        return await self._execute(graph, run_id, aspects)

    async def resume(self, run_id: str, graph: Graph, *, aspects: Iterable[Aspect] = ()) -> ExecutionResult:
        return await self._execute(graph, run_id, aspects, restore=True)

    async def _execute(
        self, graph: Graph, run_id: str, aspects: Iterable[Aspect], *, restore: bool = False
    ) -> ExecutionResult:
        checkpoint = ExecCheckpoint(run_id, self.store)
        execution = Execution(graph, self.inputs[run_id], aspects=aspects, checkpoint=checkpoint)
        if restore:
            execution.restore_nodes(await self.store.node_records(run_id))
        async with execution:
            return await execution.wait()


class LedgerHost:
    """``ledger.run`` and ``ledger.resume`` on the LMDB ledger."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger

    async def run(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, aspects: Iterable[Aspect] = ()
    ) -> ExecutionResult:
        outcome = await self.ledger.run(graph, inputs, run_id=run_id, aspects=aspects)
        result: ExecutionResult = outcome.result
        return result

    async def resume(self, run_id: str, graph: Graph, *, aspects: Iterable[Aspect] = ()) -> ExecutionResult:
        outcome = await self.ledger.resume(run_id, graph, aspects=aspects)
        result: ExecutionResult = outcome.result
        return result


Session = Callable[[], AbstractAsyncContextManager[Host]]


@pytest.fixture(params=["memory", "lmdb"])
def session(request: pytest.FixtureRequest, tmp_path: Path) -> Session:
    """Opens the same store each time (an LMDB ledger is closed and opened again: another lifetime)."""
    if request.param == "memory":
        store, inputs = MemoryStore(), dict[str, Mapping[Key[Any], Any]]()

        @asynccontextmanager
        async def in_memory() -> AsyncIterator[Host]:
            yield MemoryHost(store, inputs)

        return in_memory

    @asynccontextmanager
    async def on_lmdb() -> AsyncIterator[Host]:
        async with open_ledger(tmp_path / "ledger") as ledger:
            yield LedgerHost(ledger)

    return on_lmdb


async def crashed(start: Callable[[], Coroutine[Any, Any, object]], script: Script) -> None:
    """Run ``start`` until the script holds inside an attempt, then stop it as a dying host would."""
    script.entered = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await script.entered.wait()
        tg.cancel_scope.cancel()


def keys(script: Script) -> list[str]:
    return [seen.key for seen in script.seen]


# -- checkpoint mode ---------------------------------------------------------------------------


async def test_a_node_under_retry_sees_each_attempt_and_a_key_of_its_own_and_the_run_id(
    session: Session,
) -> None:
    script = Script("fail", "fail", "ok")
    async with session() as host:
        result = await host.run(retried(script), {N: 7}, run_id="order-42")
    assert result[OUT] == 7
    assert [(s.run_id, s.attempts, s.attempt) for s in script.seen] == [
        ("order-42", (0,), 0),
        ("order-42", (1,), 1),
        ("order-42", (2,), 2),
    ]
    assert len(set(keys(script))) == 3
    assert not any("order-42" in key or "charge" in key for key in keys(script))


async def test_a_crash_inside_an_attempt_and_a_resume_see_the_same_attempt_and_the_same_key(
    session: Session,
) -> None:
    script = Script("fail", "fail", "hold", "ok")
    async with session() as host:
        await crashed(lambda: host.run(retried(script), {N: 7}, run_id="order-42"), script)
    before = list(script.seen)
    assert [s.attempt for s in before] == [0, 1, 2]  # stopped inside the third attempt

    async with session() as host:  # after the crash (for LMDB: the ledger opened again)
        result = await host.resume("order-42", retried(script))
    assert result[OUT] == 7
    [again] = script.seen[3:]
    assert again == before[2]  # run id, attempt and key: the attempt was reclaimed, not advanced
    assert len(set(keys(script))) == 3


async def test_another_run_id_gives_other_keys(session: Session) -> None:
    first, second = Script("fail", "ok"), Script("fail", "ok")
    async with session() as host:
        await host.run(retried(first), {N: 1}, run_id="order-42")
        await host.run(retried(second), {N: 1}, run_id="order-43")
    assert [s.attempt for s in first.seen] == [s.attempt for s in second.seen] == [0, 1]
    assert {s.run_id for s in second.seen} == {"order-43"}
    assert not set(keys(first)) & set(keys(second))


async def test_an_execution_retry_around_a_node_retry_gives_a_key_per_pair_of_attempts(
    session: Session,
) -> None:
    # the node's Retry(2) is used up under the execution's attempt 0, and gets a new budget under 1
    script = Script("fail", "fail", "hold", "fail", "ok")
    aspects = [Retry(2)]
    async with session() as host:
        await crashed(
            lambda: host.run(retried(script, attempts=2), {N: 3}, run_id="r", aspects=aspects), script
        )
    async with session() as host:
        result = await host.resume("r", retried(script, attempts=2), aspects=aspects)
    assert result[OUT] == 3
    assert [s.attempts for s in script.seen] == [(0, 0), (0, 1), (1, 0), (1, 0), (1, 1)]
    assert [s.attempt for s in script.seen] == [0, 1, 0, 0, 1]
    assert script.seen[3] == script.seen[2]  # the attempt the crash stopped, reclaimed
    assert len(set(keys(script))) == 4


async def test_a_node_inside_a_retried_mount_gets_the_mounts_attempts_and_a_key_per_mount_attempt(
    session: Session,
) -> None:
    script = Script("fail", "hold", "fail", "ok")
    async with session() as host:
        await crashed(lambda: host.run(mounted(script), {N: 5}, run_id="order-42"), script)
    async with session() as host:
        result = await host.resume("order-42", mounted(script))
    assert result[OUT] == 5
    assert [(s.run_id, s.attempts, s.attempt) for s in script.seen] == [
        ("order-42", (0,), 0),
        ("order-42", (1,), 1),  # the mount's next attempt runs its child again
        ("order-42", (1,), 1),  # reclaimed after the crash
        ("order-42", (2,), 2),
    ]
    assert script.seen[2] == script.seen[1]
    assert len(set(keys(script))) == 3


async def test_the_same_graph_in_two_mounts_of_one_run_gives_each_node_its_own_key(
    session: Session,
) -> None:
    script = Script("ok", "ok")
    child = Graph("payment", version="1", inputs=[N])
    child.add_node("charge", script, requires=[N], provides=[OUT])
    g = Graph("order", version="1", inputs=[N])
    g.sub("first", child, inlets={N: N}, outlets={OUT: Key("left", int)})
    g.sub("second", child, inlets={N: N}, outlets={OUT: Key("right", int)})
    async with session() as host:
        await host.run(g, {N: 1}, run_id="order-42")
    assert [(s.run_id, s.attempts, s.attempt) for s in script.seen] == [("order-42", (), 0)] * 2
    assert len(set(keys(script))) == 2


RESUME_ELSEWHERE = """
import sys, anyio
from ledger import open_ledger
from tests.streams.test_node_info import N, Script, retried

async def main() -> None:
    script = Script("ok")
    async with open_ledger(sys.argv[1]) as ledger:
        await ledger.resume("order-42", retried(script))
    [seen] = script.seen
    print(seen.run_id, seen.attempt, seen.key)

anyio.run(main)
"""


def test_a_run_resumed_by_another_process_sees_the_attempt_and_the_key_it_crashed_in(tmp_path: Path) -> None:
    script = Script("fail", "hold")
    path = tmp_path / "ledger"

    async def crash() -> None:
        async with open_ledger(path) as ledger:
            await crashed(lambda: ledger.run(retried(script), {N: 7}, run_id="order-42"), script)

    anyio.run(crash)
    resumed = subprocess.run(
        [sys.executable, "-c", RESUME_ELSEWHERE, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "random"},
    )
    held = script.seen[1]
    assert resumed.stdout.split() == [held.run_id, str(held.attempt), held.key] == ["order-42", "1", held.key]


# -- ordinary mode -----------------------------------------------------------------------------


async def test_ordinary_mode_counts_attempts_gives_each_a_key_of_its_own_and_has_no_run_id() -> None:
    script = Script("fail", "fail", "ok")
    result = await run_graph(retried(script), {N: 7})
    assert result[OUT] == 7
    assert [(s.run_id, s.attempts, s.attempt) for s in script.seen] == [
        (None, (0,), 0),
        (None, (1,), 1),
        (None, (2,), 2),
    ]
    assert len(set(keys(script))) == 3

    again = Script("fail", "fail", "ok")  # nothing is durable: another execution, other keys
    await run_graph(retried(again), {N: 7})
    assert not set(keys(script)) & set(keys(again))


async def test_ordinary_mode_counts_nested_and_mounted_attempts_with_a_key_for_each() -> None:
    nested = Script("fail", "fail", "fail", "ok")
    await run_graph(retried(nested, attempts=2), {N: 1}, aspects=[Retry(2)])
    assert [s.attempts for s in nested.seen] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(set(keys(nested))) == 4

    inside = Script("fail", "fail", "ok")
    await run_graph(mounted(inside), {N: 1})
    assert [s.attempts for s in inside.seen] == [(0,), (1,), (2,)]
    assert len(set(keys(inside))) == 3  # each attempt of the mount runs its child anew
