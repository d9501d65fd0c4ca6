"""``python -m ledger runs list|show|follow`` in a subprocess, its JSON checked, on both backends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import psycopg
import pytest

import ledger._runs as run_records
from ledger import LmdbBackend
from ledger.console import Watcher
from streams import Graph, Key, MessageTx, NodeContext, Retry, Stream

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


#: A run recorded by a clock set to this moment reads as 2001-09-09T01:46:40Z: long before it is read.
LONG_AGO = 1_000_000_000.0


@contextmanager
def runs_recorded_at(at: float) -> Iterator[None]:
    """Runs recorded, started and ended in the block carry ``at`` as their record's times."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_records, "time", SimpleNamespace(time=lambda: at))
        yield


async def test_runs_follow_stamps_each_event_with_when_it_happened_not_when_it_was_read(
    open_any: Opener,
) -> None:
    async with open_any() as ledger:
        target = _target(ledger)
        with runs_recorded_at(LONG_AGO):
            await ledger.start(doubling("double"), {N: 21}, run_id="old")
            with pytest.raises(ValueError, match="cannot double today"):
                await ledger.start(doubling("broken", fail=True), {N: 1}, run_id="failed")
    shown = runs(target, "show", "failed")
    text = _cli("runs", "follow", target, "old")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[-1] == "2001-09-09T01:46:40Z run old: completed"
    done = _cli("runs", "follow", target, "failed", "--json")
    assert done.returncode == 1  # it failed for good
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1] == {
        "at": "2001-09-09T01:46:40Z",
        "run_id": "failed",
        "event": "run",
        "status": "failed",
        "starts": 1,
        "error": "ValueError",
        "cancelled": None,
    }
    retry = next(n for n in shown["nodes"] if n["boundary"] != "node")
    failures = [e for e in events if e["event"] == "attempt_failed"]
    assert [(e["boundary"], e["attempt"], e["at"]) for e in failures] == [
        ("retry at 1", f["attempt"], f["failed_at"]) for f in retry["failed"]
    ]  # each attempt once, at the time it failed: the node's own failure is its Retry's last
    before = [e["at"] for e in events[:-1]]
    assert before == sorted(before)  # in the order they happened, the run's end last


async def test_runs_follow_stopped_by_sigterm_says_the_run_goes_on(open_any: Opener) -> None:
    gate, entered = anyio.Event(), anyio.Event()
    async with open_any() as ledger:
        target = _target(ledger)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.start(gated("gated", gate, entered), {N: 4}, run_id="g"))
            await entered.wait()
            follower = _following(target, "g")
            assert follower.stdout is not None
            first = await anyio.to_thread.run_sync(follower.stdout.readline)  # it follows, signals handled
            follower.send_signal(signal.SIGTERM)
            out, err = await anyio.to_thread.run_sync(follower.communicate)
            gate.set()
    assert first.endswith(" run g: running, started 1 time(s)\n") and out == ""
    assert follower.returncode == 143
    assert err == "terminated; stopped following run 'g'; the run goes on\n"


async def test_runs_show_says_a_failure_once_and_a_retried_nodes_attempts_as_they_ran(
    open_any: Opener,
) -> None:
    async with open_any() as ledger:
        target = _target(ledger)
        with pytest.raises(ValueError, match="cannot double today"):
            await ledger.start(doubling("broken", fail=True), {N: 1}, run_id="failed")
    done = _cli("runs", "show", target, "failed")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "run failed: graph broken version 1, failed with ValueError"
    nodes = lines[lines.index("  nodes:") + 1 :]
    assert [line.split(" failed 20")[0] for line in nodes] == [
        "    double: failed",  # one node attempt, whose Retry ran two
        "      retry at 1: 2 of 2 attempt(s) failed, exhausted",
        "        attempt 1",
        "        attempt 2",
    ]


async def test_runs_show_gives_a_running_nodes_progress_from_its_groups_frontiers(open_any: Opener) -> None:
    hold = anyio.Event()
    async with open_any() as ledger:
        target = _target(ledger)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.start(noting(hold), {N: 5}, run_id="held"))
            await hold.wait()  # two of five notes handled, confirmed
            shown = await anyio.to_thread.run_sync(runs, target, "show", "held")
            text = await anyio.to_thread.run_sync(_cli, "runs", "show", target, "held")
            tg.cancel_scope.cancel()
    # count has no attempt confirmed or failed yet: its progress comes from its group's frontier
    assert [(n["path"], n["status"]) for n in shown["nodes"]] == [("write", "completed")]
    assert shown["progress"] == [
        {
            "path": "count",
            "reads": [
                {"stream": "held/write/notes", "group": "count", "handled": 2, "appended": 5, "lag": 3}
            ],
            "writes": [],
        },
        {
            "path": "write",
            "reads": [],
            "writes": [{"stream": "held/write/notes", "appended": 5, "finished": True}],
        },
    ]
    assert "    count: running\n      reads held/write/notes: 2 of 5 handled, lag 3\n" in text.stdout
    assert "      writes held/write/notes: 5 appended, finished\n" in text.stdout


NOTES = Key("notes", Stream[str])
COUNT = Key("count", int)
ALL_SENT = Key("all_sent", int)


def noting(hold: anyio.Event) -> Graph:
    """A writer of N notes, and a counter that handles two of them (confirmed), then holds; the counter
    starts once the writer's completion is confirmed (it requires ALL_SENT), so a hold seen means both."""
    g = Graph("noting", version="1", inputs=[N])

    @g.node(requires=[N], provides=[NOTES, ALL_SENT])
    async def write(ctx: NodeContext) -> None:
        for i in range(ctx[N]):
            await ctx.writer(NOTES).send(f"note {i}")
        ctx.set(ALL_SENT, ctx[N])

    @g.node(requires=[NOTES, ALL_SENT], provides=[COUNT])
    async def count(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], note: str) -> None:
            tx.set_state(tx.state + 1)
            tx.set(COUNT, tx.state)

        await ctx.handle_messages(NOTES, one, initial_state=0, limit=2)
        hold.set()
        await anyio.sleep_forever()

    return g


async def test_runs_list_pages_with_a_cursor_and_ends_until_a_time(open_any: Opener) -> None:
    async with open_any() as ledger:
        target = _target(ledger)
        with runs_recorded_at(LONG_AGO):  # the same time for each: the cursor orders them by run id
            for run_id in ("a", "b", "c", "d", "e"):
                await ledger.start(doubling("double"), {N: 1}, run_id=run_id)
        await ledger.start(doubling("double"), {N: 1}, run_id="new")
    first = _cli("runs", "list", target, "--until", "2010-01-01T00:00:00Z", "--limit", "2", "--json")
    assert first.returncode == 0, first.stderr
    assert [r["run_id"] for r in json.loads(first.stdout)] == ["e", "d"]  # not "new": changed after
    cursor = first.stderr.removeprefix("more runs: continue with --after ").strip().strip("'")
    assert cursor == "2001-09-09T01:46:40Z/d"
    second = _cli(
        "runs", "list", target, "--until", "2010-01-01", "--limit", "2", "--after", cursor, "--json"
    )
    assert [r["run_id"] for r in json.loads(second.stdout)] == ["c", "b"]
    cursor = second.stderr.removeprefix("more runs: continue with --after ").strip().strip("'")
    last = _cli("runs", "list", target, "--until", "2010-01-01", "--limit", "2", "--after", cursor, "--json")
    assert [r["run_id"] for r in json.loads(last.stdout)] == ["a"] and last.stderr == ""  # no more
    assert [r["run_id"] for r in runs(target, "list", "--limit", "1")] == ["new"]
    bad = _cli("runs", "list", target, "--after", "nowhere")
    assert bad.returncode == 2 and "is not a cursor of runs list" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stdout == ""


HOLDER = """
import sys, anyio
from ledger import connect
from streams import Graph, Key, NodeContext

N = Key("n", int)
g = Graph("held", version="1", inputs=[N])

@g.node(requires=[N], provides=[Key("doubled", int)])
async def double(ctx: NodeContext) -> None:
    print("held", flush=True)
    await anyio.sleep_forever()

async def main():
    async with connect(sys.argv[1]) as ledger:
        await ledger.start(g, {N: 1}, run_id="held")

anyio.run(main)
"""


def killed_holding(target: str) -> None:
    """A process that runs run ``held`` of ``target``, killed (SIGKILL) while its node runs."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, target], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    finally:
        holder.kill()
        holder.communicate()


def statuses(target: str) -> dict[str, str]:
    return {run["run_id"]: run["status"] for run in runs(target, "list")}


async def test_a_run_whose_owner_is_gone_is_shown_interrupted(open_any: Opener) -> None:
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.start(doubling("double"), {N: 21}, run_id="done")
    await anyio.to_thread.run_sync(killed_holding, target)
    if "postgresql" in target:  # its lease holds until it runs out: then nothing runs the run
        assert statuses(target) == {"held": "running", "done": "completed"}
        with psycopg.connect(target, autocommit=True) as conn:  # as its lease's end passing would
            conn.execute("UPDATE streamledger_leases SET expires_at = now() - interval '1 second'")
    assert statuses(target) == {"held": "interrupted", "done": "completed"}
    assert [r["run_id"] for r in runs(target, "list", "--status", "interrupted")] == ["held"]
    shown = _cli("runs", "show", target, "held")
    assert shown.stdout.startswith("run held: graph held version 1, interrupted\n")
    assert "nothing runs it any more (its owner is gone): resume it to continue" in shown.stdout
    inspected = json.loads(_cli("inspect", target, "--json").stdout)
    assert {r["run_id"]: r["status"] for r in inspected["runs"]} == {
        "held": "interrupted",
        "done": "completed",
    }
    watcher = Watcher(target)
    await anyio.to_thread.run_sync(watcher.read)
    assert watcher.overview()["error"] is None
    counts = watcher.overview()["runs"]
    assert counts == {"running": 0, "interrupted": 1, "completed": 1, "failed": 0, "cancelled": 0}
