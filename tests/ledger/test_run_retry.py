"""Retry of a run that failed for good or was cancelled, and a node's history; on LMDB and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import (
    InvalidRunIdError,
    LmdbBackend,
    RunFinishedError,
    RunNotEndedError,
    UnknownRunError,
)
from streams import ConfirmedFailureError, ExecutionCancelledError, Graph, Key, NodeContext, Retry

from ..ledger_command import ledger_command
from .conftest import Opener

ROOT = Path(__file__).resolve().parents[2]
N = Key("n", int)
FETCHED = Key("fetched", int)
PRICED = Key("priced", int)


class Flaky:
    """A two-node graph whose second node fails while ``broken`` is set; it counts every node run."""

    def __init__(self) -> None:
        self.broken = True
        self.runs: list[str] = []
        self.graph = Graph("pricing", version="1", inputs=[N])

        @self.graph.node(requires=[N], provides=[FETCHED])
        async def fetch(ctx: NodeContext) -> None:
            self.runs.append("fetch")
            ctx.set(FETCHED, ctx[N] + 1)

        @self.graph.node(requires=[FETCHED], provides=[PRICED], aspects=[Retry(2)])
        async def price(ctx: NodeContext) -> None:
            self.runs.append("price")
            if self.broken:
                raise LookupError(f"no price for item {ctx[FETCHED]}\nthe catalogue is down")
            ctx.set(PRICED, ctx[FETCHED] * 10)


def _target(ledger: Any) -> str:
    backend = ledger.backend
    return str(backend.env.path) if isinstance(backend, LmdbBackend) else str(backend.url)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return ledger_command(*args)


async def test_a_run_failed_for_good_is_retried_from_its_start_with_whole_budgets(open_any: Opener) -> None:
    flaky = Flaky()
    async with open_any() as ledger:
        with pytest.raises(LookupError, match="no price for item 4"):
            await ledger.start(flaky.graph, {N: 3}, run_id="order-7")
        assert flaky.runs == ["fetch", "price", "price"]  # the Retry's two attempts
        with pytest.raises(ConfirmedFailureError, match="retry it"):
            await ledger.resume("order-7", flaky.graph)
    async with open_any() as ledger:  # another process lifetime
        [failed] = await ledger.runs()
        assert (failed.status, failed.error, failed.attempt) == ("failed", "LookupError", 0)
        record = await ledger.retry("order-7", reason="the catalogue is back", by="ops")
        assert (record.status, record.attempt, record.error) == ("running", 1, None)
        [retry] = record.retries
        assert (retry.by, retry.reason, retry.ended, retry.error) == (
            "ops",
            "the catalogue is back",
            "failed",
            "LookupError",
        )
        assert await ledger.runs() == [record]
        flaky.broken = False
        result = await ledger.start(flaky.graph, {N: 3}, run_id="order-7")
        assert result.resumed and result.result[PRICED] == 40
        # a new root attempt borrows nothing: fetch ran again, and price had both attempts again
        assert flaky.runs == ["fetch", "price", "price", "fetch", "price"]
        [done] = await ledger.runs()
        assert (done.status, done.attempt, done.retries) == ("completed", 1, record.retries)
        again = await ledger.start(flaky.graph, {N: 3}, run_id="order-7")
        assert again.already_finished and again.result[PRICED] == 40
        with pytest.raises(RunFinishedError, match="completed: there is nothing to retry"):
            await ledger.retry("order-7", reason="once more")
        with pytest.raises(UnknownRunError):
            await ledger.retry("order-8", reason="typo")
        with pytest.raises(ValueError, match="a retry says why"):
            await ledger.retry("order-7", reason="")
        assert await ledger.runs() == [done]  # the refusals wrote nothing
    assert flaky.runs == ["fetch", "price", "price", "fetch", "price"]


async def test_a_retried_run_that_fails_again_spends_only_its_own_attempt(open_any: Opener) -> None:
    flaky = Flaky()
    async with open_any() as ledger:
        with pytest.raises(LookupError):
            await ledger.start(flaky.graph, {N: 1}, run_id="r")
        await ledger.retry("r", reason="try again", by="ops")
        with pytest.raises(LookupError):
            await ledger.resume("r", flaky.graph)
        [record] = await ledger.runs()
        assert (record.status, record.attempt, len(record.retries)) == ("failed", 1, 1)
        with pytest.raises(ConfirmedFailureError):  # its retry failed for good too: no budget refilled
            await ledger.resume("r", flaky.graph)
        second = await ledger.retry("r", reason="and again", by="ops")
        assert second.attempt == 2 and [r.reason for r in second.retries] == ["try again", "and again"]
        flaky.broken = False
        assert (await ledger.resume("r", flaky.graph)).result[PRICED] == 20
    assert flaky.runs == ["fetch", "price", "price"] * 2 + ["fetch", "price"]


def holding(entered: anyio.Event, ran: list[int]) -> Graph:
    g = Graph("holding", version="1", inputs=[N])

    @g.node(requires=[N], provides=[FETCHED])
    async def hold(ctx: NodeContext) -> None:
        ran.append(ctx[N])
        if len(ran) == 1:
            entered.set()
            await anyio.sleep_forever()
        ctx.set(FETCHED, ctx[N])

    return g


async def test_a_cancelled_run_is_retried_and_a_running_one_is_refused(open_any: Opener) -> None:
    entered, ran = anyio.Event(), list[int]()
    graph = holding(entered, ran)
    async with open_any() as ledger:
        stopped: list[BaseException] = []

        async def run() -> None:
            try:
                await ledger.start(graph, {N: 3}, run_id="c")
            except ExecutionCancelledError as exc:
                stopped.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await entered.wait()
            with pytest.raises(RunNotEndedError, match=r"run 'c' is running: .* cancel it first"):
                await ledger.retry("c", reason="too soon")
            await ledger.cancel("c", reason="stuck", by="ops")
        assert len(stopped) == 1
        record = await ledger.retry("c", reason="unstuck", by="ops")
        assert (record.status, record.cancelled, record.retries[0].ended) == ("running", None, "cancelled")
        assert (await ledger.resume("c", graph)).result[FETCHED] == 3
        await ledger.submit(graph, {N: 4}, run_id="queued")  # recorded, not running here: still running
        with pytest.raises(RunNotEndedError):
            await ledger.retry("queued", reason="no")
    assert ran == [3, 3]


async def test_a_new_run_id_cannot_take_the_form_of_a_retry(open_any: Opener) -> None:
    flaky = Flaky()
    async with open_any() as ledger:
        for run_id in ("x/retry.1", "retry.2/retry.10"):
            with pytest.raises(InvalidRunIdError, match=r"/retry\.N"):
                await ledger.start(flaky.graph, {N: 1}, run_id=run_id)
            with pytest.raises(InvalidRunIdError):
                await ledger.submit(flaky.graph, {N: 1}, run_id=run_id)
        assert await ledger.runs() == []
        flaky.broken = False
        await ledger.start(flaky.graph, {N: 1}, run_id="x/retry")  # not of the form: a run id like any
        await ledger.start(flaky.graph, {N: 1}, run_id="x/other")


async def test_runs_show_and_retry_on_the_command_line_give_each_failure_and_who_retried(
    open_any: Opener,
) -> None:
    flaky = Flaky()
    async with open_any() as ledger:
        target = _target(ledger)
        with pytest.raises(LookupError):
            await ledger.start(flaky.graph, {N: 3}, run_id="order-7")
        flaky.broken = False
        await ledger.start(flaky.graph, {N: 5}, run_id="order-7/x")  # a run whose id starts like it
    shown = await anyio.to_thread.run_sync(_cli, "runs", "show", target, "order-7", "--json")
    assert shown.returncode == 0, shown.stderr
    run = json.loads(shown.stdout)
    assert (run["status"], run["attempt"], run["retries"]) == ("failed", 0, [])
    nodes = {(n["path"], n["boundary"]): n for n in run["nodes"]}
    assert set(nodes) == {("fetch", "node"), ("price", "node"), ("price", "retry at 1")}  # not order-7/x's
    fetch = nodes["fetch", "node"]
    assert fetch["status"] == "completed" and fetch["failed"] == []
    assert fetch["started_at"] <= fetch["ended_at"] and fetch["seconds"] >= 0
    retried = nodes["price", "retry at 1"]
    assert [(f["attempt"], f["error_type"], f["message"]) for f in retried["failed"]] == [
        (1, "LookupError", "no price for item 4\nthe catalogue is down"),
        (2, "LookupError", "no price for item 4\nthe catalogue is down"),
    ]
    assert all(f["started_at"] <= f["failed_at"] and f["seconds"] >= 0 for f in retried["failed"])
    [whole] = nodes["price", "node"]["failed"]  # the node's complete chain failed once, for good
    assert (whole["attempt"], whole["error_type"], nodes["price", "node"]["status"]) == (
        1,
        "LookupError",
        "failed",
    )
    text = await anyio.to_thread.run_sync(_cli, "runs", "show", target, "order-7")
    assert "attempt 2 failed" in text.stdout and "LookupError: no price for item 4 [...]" in text.stdout

    retried_cli = await anyio.to_thread.run_sync(
        _cli, "runs", "retry", target, "order-7", "--reason", "catalogue back", "--by", "ops"
    )
    assert retried_cli.returncode == 0, retried_cli.stderr
    assert retried_cli.stdout == (
        "retried run 'order-7' by ops (catalogue back): root attempt 2, after it failed with LookupError; "
        "resume it to run it\n"
    )
    again = await anyio.to_thread.run_sync(_cli, "runs", "retry", target, "order-7", "--reason", "twice")
    assert again.returncode == 2 and "run 'order-7' is running" in again.stderr, again.stderr
    after = json.loads(
        (await anyio.to_thread.run_sync(_cli, "runs", "show", target, "order-7", "--json")).stdout
    )
    # the new attempt's nodes; nothing runs it until it is resumed: on LMDB no process owns the ledger
    # (interrupted), on PostgreSQL it is due for a worker
    waiting = "running" if "postgresql" in target else "interrupted"
    assert (after["status"], after["attempt"], after["nodes"]) == (waiting, 1, [])
    assert [(r["by"], r["reason"], r["ended"], r["error"]) for r in after["retries"]] == [
        ("ops", "catalogue back", "failed", "LookupError")
    ]
    async with open_any() as ledger:
        assert (await ledger.resume("order-7", flaky.graph)).result[PRICED] == 40
    done = json.loads(
        (await anyio.to_thread.run_sync(_cli, "runs", "show", target, "order-7", "--json")).stdout
    )
    assert done["status"] == "completed"
    assert {n["path"]: n["status"] for n in done["nodes"] if n["boundary"] == "node"} == {
        "fetch": "completed",
        "price": "completed",
    }
