"""Deleting a run that ended: its record, every attempt's records and its streams; LMDB and PostgreSQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import LmdbBackend, RunNotEndedError, UnknownRunError
from streams import ExecutionCancelledError, Graph, Key, KeyedState, MessageTx, NodeContext, Stream

from ..ledger_command import ledger_command
from .conftest import Opener

ROOT = Path(__file__).resolve().parents[2]
N = Key("n", int)
ORDERS = Key("orders", Stream[int])
TOTAL = Key("total", int)
AUDITED = Key("audited", int)


class Shop:
    """A writer, a keyed reader and a Sub: streams, keyed state and a child scope; counts node runs."""

    def __init__(self) -> None:
        self.broken = False
        self.runs: list[str] = []
        totals = KeyedState(str, int)
        self.graph = g = Graph("shop", version="1", inputs=[N])

        @g.node(requires=[N], provides=[ORDERS])
        async def orders(ctx: NodeContext) -> None:
            self.runs.append("orders")
            for i in range(1, ctx[N] + 1):
                await ctx.writer(ORDERS).send(i)

        @g.node(requires=[ORDERS], provides=[TOTAL])
        async def billing(ctx: NodeContext) -> None:
            self.runs.append("billing")

            async def bill(tx: MessageTx[int], order: int) -> None:
                store = totals.of(tx)
                store.put("all", (await store.get("all") or 0) + order)
                tx.set_state(tx.state + order)
                tx.set(TOTAL, tx.state)

            await ctx.handle_messages(ORDERS, bill, keyed=totals, initial_state=0)
            if self.broken:
                raise ConnectionError("the till is offline")

        audit = Graph("audit", version="1", inputs=[TOTAL])

        @audit.node(requires=[TOTAL], provides=[AUDITED])
        async def check(ctx: NodeContext) -> None:
            self.runs.append("check")
            ctx.set(AUDITED, ctx[TOTAL])

        g.sub("audit", audit, inlets={TOTAL: TOTAL}, outlets={AUDITED: AUDITED})


def _target(ledger: Any) -> str:
    backend = ledger.backend
    return str(backend.env.path) if isinstance(backend, LmdbBackend) else str(backend.url)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return ledger_command(*args)


def _report(target: str) -> dict[str, Any]:
    """``inspect --json``, from another process (as an operator reads the ledger beside its owner)."""
    done = _cli("inspect", target, "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _check(target: str) -> list[str]:
    done = _cli("check", target, "--json")
    problems: list[str] = json.loads(done.stdout)["problems"]
    assert done.returncode == (4 if problems else 0), done.stderr
    return problems


def _streams_of(report: dict[str, Any]) -> set[str]:
    return {f"{stream['scope']}/{stream['node']}/{stream['key']}" for stream in report["streams"]}


async def test_a_run_and_every_attempt_of_it_are_deleted_and_its_id_runs_again_anew(open_any: Opener) -> None:
    shop = Shop()
    async with open_any() as ledger:
        target = _target(ledger)
        shop.broken = True
        with pytest.raises(ConnectionError):
            await ledger.start(shop.graph, {N: 3}, run_id="shop")
        await ledger.retry("shop", reason="till back", by="ops")
        shop.broken = False
        assert (await ledger.resume("shop", shop.graph)).result[AUDITED] == 6
        await ledger.start(shop.graph, {N: 2}, run_id="shop/x")  # ids that start alike are other runs
        await ledger.start(shop.graph, {N: 1}, run_id="shopping")
        before = await anyio.to_thread.run_sync(_report, target)
        doomed = {"shop/orders/orders", "shop/retry.1/orders/orders"}  # the first attempt's and the retry's
        assert doomed < _streams_of(before)
        kept = _streams_of(before) - doomed
        gone = await ledger.delete("shop")
        held = sum(
            s["appended"] - s["compacted_through"]
            for s in before["streams"]
            if f"{s['scope']}/{s['node']}/{s['key']}" in doomed
        )
        assert (gone.run_id, gone.streams, gone.messages) == ("shop", 2, held)
        assert gone.records >= 8  # each attempt's boundaries, scopes and node records
        assert [r.run_id for r in await ledger.runs()] == ["shop/x", "shopping"]
        after = await anyio.to_thread.run_sync(_report, target)
        assert _streams_of(after) == kept
        assert [r["run_id"] for r in after["runs"]] == ["shop/x", "shopping"]
        assert {r["run_id"]: len(r["nodes"]) for r in after["runs"]} == {
            r["run_id"]: len(r["nodes"]) for r in before["runs"] if r["run_id"] != "shop"
        }
        assert await anyio.to_thread.run_sync(_check, target) == []
        shop.runs.clear()  # the same process, the same open ledger: the id is a new run's
        result = await ledger.start(shop.graph, {N: 4}, run_id="shop")
        assert not result.resumed and result.result[AUDITED] == 10
        assert sorted(shop.runs) == ["billing", "check", "orders"]
        with pytest.raises(UnknownRunError):
            await ledger.delete("nope")
    async with open_any() as ledger:  # another process lifetime: all of it as confirmed
        assert (await ledger.start(shop.graph, {N: 4}, run_id="shop")).already_finished
        assert await anyio.to_thread.run_sync(_check, target) == []


async def test_a_running_run_is_not_deleted(open_any: Opener) -> None:
    entered = anyio.Event()
    g = Graph("held", version="1", inputs=[N])

    @g.node(requires=[N], provides=[TOTAL])
    async def hold(ctx: NodeContext) -> None:
        entered.set()
        await anyio.sleep_forever()

    async with open_any() as ledger:
        target = _target(ledger)
        stopped: list[BaseException] = []

        async def run() -> None:
            try:
                await ledger.start(g, {N: 1}, run_id="held")
            except ExecutionCancelledError as exc:
                stopped.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await entered.wait()
            with pytest.raises(RunNotEndedError, match=r"run 'held' is running: .* cancel it first"):
                await ledger.delete("held")
            tg.cancel_scope.cancel()
        await ledger.submit(g, {N: 2}, run_id="queued")  # for a worker: running, though nothing runs it
        before = await anyio.to_thread.run_sync(_report, target)
        for run_id in ("held", "queued"):
            with pytest.raises(RunNotEndedError):
                await ledger.delete(run_id)
        assert await anyio.to_thread.run_sync(_report, target) == before  # nothing changed
        await ledger.cancel("queued", reason="not wanted", by="ops")
        assert (await ledger.delete("queued")).streams == 0


async def test_runs_delete_on_the_command_line(open_any: Opener) -> None:
    shop = Shop()
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.start(shop.graph, {N: 3}, run_id="shop")

    done = await anyio.to_thread.run_sync(_cli, "runs", "delete", target, "shop")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(  # every message was acknowledged, and compacted away: the stream held none
        r"deleted run 'shop': \d+ node record\(s\), 1 stream\(s\) holding 0 message\(s\)\n", done.stdout
    )
    again = await anyio.to_thread.run_sync(_cli, "runs", "delete", target, "shop")
    assert again.returncode == 2 and "has no run 'shop'" in again.stderr
    assert (await anyio.to_thread.run_sync(_report, target))["streams"] == []
