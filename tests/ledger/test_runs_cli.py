"""``python -m ledger runs list|show``, through a subprocess with its JSON checked, on both backends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import LmdbBackend
from streams import Graph, Key, NodeContext, Retry

from ..ledger_command import ledger_command
from .conftest import Opener

ROOT = Path(__file__).resolve().parents[2]
N = Key("n", int)
DOUBLED = Key("doubled", int)


def doubling(name: str, *, fail: bool = False, hold: anyio.Event | None = None) -> Graph:
    g = Graph(name, version="1", inputs=[N])

    @g.node(requires=[N], provides=[DOUBLED], aspects=[Retry(2)])
    async def double(ctx: NodeContext) -> None:
        if hold is not None:
            hold.set()
            await anyio.sleep_forever()
        if fail:
            raise ValueError("cannot double today")
        ctx.set(DOUBLED, ctx[N] * 2)

    return g


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return ledger_command(*args)


def runs(target: str, action: str, *args: str) -> Any:
    """``runs ACTION TARGET ARGS --json``, decoded."""
    done = _cli("runs", action, target, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _target(ledger: Any) -> str:
    backend = ledger.backend
    return str(backend.env.path) if isinstance(backend, LmdbBackend) else str(backend.url)


async def test_runs_are_listed_filtered_and_shown_with_times_holders_and_nodes(open_any: Opener) -> None:
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.start(doubling("double"), {N: 21}, run_id="done")
        with pytest.raises(ValueError, match="cannot double today"):
            await ledger.start(doubling("broken", fail=True), {N: 1}, run_id="failed")
        held = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.start(doubling("double", hold=held), {N: 2}, run_id="held"))
            await held.wait()
            listed = await anyio.to_thread.run_sync(runs, target, "list")
            shown = await anyio.to_thread.run_sync(runs, target, "show", "held")
            tg.cancel_scope.cancel()
    assert [r["run_id"] for r in listed] == ["held", "failed", "done"]  # newest first
    by_id = {r["run_id"]: r for r in listed}
    assert (by_id["done"]["status"], by_id["failed"]["status"], by_id["held"]["status"]) == (
        "completed",
        "failed",
        "running",
    )
    assert by_id["failed"]["error"] == "ValueError" and by_id["done"]["seconds"] >= 0
    assert by_id["held"]["seconds"] is None and all(r["created_at"].endswith("Z") for r in listed)
    assert "nodes" not in by_id["done"]
    if "postgresql" in target:  # a run on a server is held under a lease, by its process
        assert shown["holder"] is not None and not shown["holder"]["expired"]
    else:  # one process owns a local ledger: no lease
        assert shown["holder"] is None
    assert shown["nodes"] == []  # a first attempt is written with its first failure or commit

    assert [r["run_id"] for r in runs(target, "list", "--status", "failed")] == ["failed"]
    assert [r["run_id"] for r in runs(target, "list", "--graph", "double")] == ["held", "done"]
    assert [r["run_id"] for r in runs(target, "list", "--limit", "1")] == ["held"]
    assert len(runs(target, "list", "--since", "1h")) == 3
    assert runs(target, "list", "--since", "2999-01-01T00:00:00Z") == []
    failed = runs(target, "show", "failed")
    retry = [n for n in failed["nodes"] if n["boundary"] != "node"]
    assert [(n["failures"], n["limit"], n["status"]) for n in retry] == [(2, 2, "failed")]

    unknown = _cli("runs", "show", target, "nope")
    assert unknown.returncode == 2 and unknown.stderr.endswith("has no run 'nope'\n")
    assert unknown.stderr.count("\n") == 1  # one line, no traceback


def _following(target: str, run_id: str) -> subprocess.Popen[str]:
    """``runs follow`` of ``run_id``, reading the ledger every 50 ms, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "ledger", "runs", "follow", target, run_id, "--interval", "0.05"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def gated(name: str, gate: anyio.Event, entered: anyio.Event) -> Graph:
    g = Graph(name, version="1", inputs=[N])

    @g.node(requires=[N], provides=[DOUBLED])
    async def double(ctx: NodeContext) -> None:
        entered.set()
        await gate.wait()
        ctx.set(DOUBLED, ctx[N] * 2)

    return g


async def test_runs_follow_prints_each_change_until_the_run_ends(open_any: Opener) -> None:
    gate, entered = anyio.Event(), anyio.Event()
    async with open_any() as ledger:
        target = _target(ledger)
        with pytest.raises(ValueError, match="cannot double today"):
            await ledger.start(doubling("broken", fail=True), {N: 1}, run_id="failed")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.start(gated("gated", gate, entered), {N: 4}, run_id="g"))
            await entered.wait()
            follower = _following(target, "g")
            assert follower.stdout is not None
            first = await anyio.to_thread.run_sync(follower.stdout.readline)  # it follows the run now
            gate.set()
        out, err = await anyio.to_thread.run_sync(follower.communicate)
    assert follower.returncode == 0, err
    lines = [line.split(" ", 1)[1] for line in (first + out).splitlines()]  # without the time
    assert lines[0] == "run g: running, started 1 time(s)"
    assert lines[-1] == "run g: completed"
    assert "node double: completed, 0 of 1 attempt(s) failed" in lines
    failed = _cli("runs", "follow", target, "failed")
    assert failed.returncode == 1  # it ended failed: the exit code says so
    assert failed.stdout.splitlines()[-1].endswith("run failed: failed (ValueError)")


def test_runs_help_says_which_actions_write() -> None:
    """list, show and follow write nothing; cancel, retry and delete write: the help says so, not that
    nothing is written."""
    done = ledger_command("runs", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "nothing is written" not in text
    assert "list, show and follow read it" in text and "cancel, retry and delete write" in text
