"""Run/Resume: graph runs in checkpoint mode, killed with SIGKILL and resumed; on LMDB and PostgreSQL."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ledger import (
    RunActiveError,
    RunAspectsMismatchError,
    RunExistsError,
    RunMismatchError,
    RunRecord,
    UnknownRunError,
    inspect_ledger,
    open_ledger,
)
from ledger.lmdb._layout import node_run_key
from ledger.lmdb._seal import seal
from ledger.postgres import PgBackend, open_postgres
from ledger.postgres import work as worker
from ledger.postgres._inspect import inspect_postgres
from streams import (
    Aspect,
    ConfirmedFailureError,
    Execution,
    Graph,
    GraphError,
    Key,
    NodeContext,
    Retry,
    Timeout,
)
from streams.store import CheckpointOutput

from ._kills import ROOT, assert_sound, killed_until_landed
from .conftest import Opener

EXAMPLE = ROOT / "examples" / "doc_pipeline.py"
ANSWER = "[en] a page about example | [en] a page about python"


def example(path: Path, run_id: str = "run-1") -> list[str]:
    return [sys.executable, str(EXAMPLE), str(path), run_id, "example.org", "python.org"]


def work(path: Path) -> Counter[str]:
    log = path / "work.log"
    return Counter(log.read_text().split()) if log.exists() else Counter()


def test_killed_after_extract_resume_restores_download_and_extract_and_restarts_summarize(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"
    paused = subprocess.Popen(
        example(path),
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PAUSE_IN": "summarize"},
    )
    assert paused.stdout is not None
    seen = [paused.stdout.readline(), paused.stdout.readline()]  # both mounts are inside summarize
    assert sorted(seen) == ["paused in first/summarize\n", "paused in second/summarize\n"]
    paused.send_signal(signal.SIGKILL)
    paused.wait()
    paused.stdout.close()
    assert_sound(path)
    before = work(path)
    assert before == Counter(
        {"first/download": 1, "first/extract": 1, "first/summarize": 1}
        | {"second/download": 1, "second/extract": 1, "second/summarize": 1}
    )

    resumed = subprocess.run(example(path), capture_output=True, text=True, check=True, timeout=60)
    assert resumed.stdout.strip() == f"{ANSWER} (resumed)"
    after = work(path) - before
    # download and extract restored, not run; summarize from its entry; combine once
    assert after == Counter({"first/summarize": 1, "second/summarize": 1, "combine": 1})

    again = subprocess.run(example(path), capture_output=True, text=True, check=True, timeout=60)
    assert again.stdout.strip() == f"{ANSWER} (already finished)"
    assert work(path) - before == after  # nothing ran
    assert_sound(path)


def test_killed_at_random_moments_the_run_ends_with_its_answer_on_a_sound_ledger(tmp_path: Path) -> None:
    def check(path: Path, landed: int) -> None:
        counts = work(path)
        mounts = {f"{m}/{n}" for m in ("first", "second") for n in ("download", "extract", "summarize")}
        assert set(counts) == mounts | {"combine"}
        assert max(counts.values()) <= landed + 1  # a node runs again only after a kill

    killed_until_landed(
        tmp_path,
        example,
        expected=f"{ANSWER} (already finished)",
        env={**os.environ, "NODE_DELAY": "0.1"},
        max_delay=1.0,
        check=check,
    )


N = Key("n", int)
DOUBLED = Key("doubled", int)


def doubling(version: str = "1", *, fail: bool = False) -> Graph:
    g = Graph("doubling", version=version, inputs=[N])

    @g.node(requires=[N], provides=[DOUBLED], aspects=[Retry(2)])
    async def double(ctx: NodeContext) -> None:
        if fail:
            raise ValueError("cannot double today")
        ctx.set(DOUBLED, ctx[N] * 2)

    return g


async def test_runs_are_listed_and_a_run_id_is_used_once(open_any: Opener) -> None:
    async with open_any() as ledger:
        outcome = await ledger.run(doubling(), {N: 21}, run_id="a")
        assert outcome.result[DOUBLED] == 42 and not outcome.resumed
        with pytest.raises(RunExistsError, match="run 'a' exists already: resume it"):
            await ledger.run(doubling(), {N: 1}, run_id="a")
        again = await ledger.resume("a", doubling())
        assert again.already_finished and again.result[DOUBLED] == 42
        with pytest.raises(UnknownRunError, match="has no run 'b'"):
            await ledger.resume("b", doubling())
        with pytest.raises(RunMismatchError, match="started with graph 'doubling' version '1'"):
            await ledger.resume("a", doubling("2"))
        [record] = await ledger.runs()
        assert (record.run_id, record.status, record.graph, record.starts) == (
            "a",
            "completed",
            "doubling",
            1,
        )


async def test_a_submitted_run_is_recorded_without_running_and_a_resume_runs_it(open_any: Opener) -> None:
    """The one Ledger submits on both backends: a record with no start, which resume runs once."""
    async with open_any() as ledger:
        record = await ledger.submit(doubling(), {N: 4}, run_id="s")
        assert (record.status, record.starts) == ("running", 0)
        with pytest.raises(RunExistsError):
            await ledger.submit(doubling(), {N: 4}, run_id="s")
        assert [(r.run_id, r.starts) for r in await ledger.runs()] == [("s", 0)]
        done = await ledger.resume("s", doubling())
        assert done.result[DOUBLED] == 8 and done.resumed and not done.already_finished
        [after] = await ledger.runs()
        assert (after.status, after.starts) == ("completed", 1)


async def test_a_confirmed_final_failure_stays_final_and_is_raised_before_anything_runs(
    open_any: Opener,
) -> None:
    async with open_any() as ledger:
        with pytest.raises(ValueError, match="cannot double today"):
            await ledger.run(doubling(fail=True), {N: 1}, run_id="f")
        [record] = await ledger.runs()
        assert (record.status, record.error) == ("failed", "ValueError")
    async with open_any() as ledger:  # another process lifetime
        with pytest.raises(ConfirmedFailureError, match="run 'f' failed for good \\(ValueError\\)"):
            await ledger.resume("f", doubling())  # even with a graph that would succeed now


async def test_a_graph_checkpoint_mode_cannot_run_is_refused_before_the_run_is_recorded(
    open_any: Opener,
) -> None:
    child = Graph("child", inputs=[N, DOUBLED])
    child.add_node("early", _noop, requires=[N], provides=[Key("early", int)])
    child.add_node("late", _noop, requires=[DOUBLED])
    g = Graph("fed_back", inputs=[N])  # ordinary mode runs it; a run would wait for ever
    g.sub("mount", child, inlets={N: N, DOUBLED: DOUBLED}, outlets={Key("early", int): Key("early", int)})
    g.add_node("again", _noop, requires=[Key("early", int)], provides=[DOUBLED])

    def stop(run: Execution) -> None:  # a run that started would wait for ever: let the test fail instead
        run.cancel()

    async with open_any() as ledger:
        with pytest.raises(GraphError, match="checkpoint mode cannot run the cycle early \\(Sub 'mount'"):
            await ledger.run(g, {N: 1}, run_id="r", on_start=stop)
        submit = getattr(ledger, "submit", None)  # PostgreSQL records runs for workers too
        if submit is not None:
            with pytest.raises(GraphError, match="'mount/late' waits for doubled"):
                await submit(g, {N: 1}, run_id="s")
        assert await ledger.runs() == []


async def _noop(ctx: NodeContext) -> None:
    pass


async def test_one_execution_at_a_time_runs_a_run_id(open_any: Opener) -> None:
    started = anyio.Event()
    g = Graph("slow", inputs=[N])

    @g.node(requires=[N], provides=[DOUBLED])
    async def wait(ctx: NodeContext) -> None:
        started.set()
        await anyio.sleep_forever()

    async with open_any() as ledger, anyio.create_task_group() as tg:
        tg.start_soon(lambda: ledger.run(g, {N: 1}, run_id="x"))
        await started.wait()
        with pytest.raises(RunActiveError, match="run 'x' is being run"):
            await ledger.resume("x", g)
        tg.cancel_scope.cancel()
    async with open_any() as ledger:
        [record] = await ledger.runs()
        assert record.status == "running"  # cancelled, not failed: it resumes


async def test_inspect_lists_runs_with_each_nodes_budget_and_conclusion_values_free(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    async with open_ledger(path) as ledger:
        await ledger.run(doubling(), {N: 21}, run_id="good")
        with pytest.raises(ValueError):
            await ledger.run(doubling(fail=True), {N: 1}, run_id="bad")
    table = (await anyio.run_process([sys.executable, "-m", "ledger", "inspect", str(path)])).stdout.decode()
    assert "  bad: graph doubling version 1, failed with ValueError, started 1 time(s)" in table
    assert "    double: failed, 1 of 1 attempt(s) failed" in table
    assert "    double, retry at 1: 2 of 2 attempt(s) failed, exhausted" in table
    assert "  good: graph doubling version 1, completed, started 1 time(s)" in table
    assert "42" not in table.replace(str(path), "")  # no values unless asked (the path may hold a 42)
    command = [sys.executable, "-m", "ledger", "inspect", str(path), "--values"]
    with_values = (await anyio.run_process(command)).stdout.decode()
    assert '    double: completed, 0 of 1 attempt(s) failed  {"doubled": 42}' in with_values


# -- a run's aspect chain ------------------------------------------------------------------------

HALF = Key("half", int)
RETRY_3 = "Retry(attempts=3, delay=0.0)"


def flaky(calls: list[str], steps: list[str], entered: anyio.Event) -> Graph:
    """``first`` completes; ``flaky`` does ``steps`` one call at a time: "fail", or "stop" (sets
    ``entered`` and waits to be cancelled); ``calls`` says which ran."""
    g = Graph("flaky", inputs=[N])

    @g.node(requires=[N], provides=[HALF])
    async def first(ctx: NodeContext) -> None:
        calls.append("first")
        ctx.set(HALF, ctx[N])

    @g.node(requires=[HALF], provides=[DOUBLED])
    async def flaky(ctx: NodeContext) -> None:
        calls.append("flaky")
        if steps.pop(0) == "stop":
            entered.set()
            await anyio.sleep_forever()
        raise ValueError("flaky today")

    return g


async def stopped_in_the_middle(
    ledger: Any, start: Callable[[], Coroutine[Any, Any, object]], entered: anyio.Event
) -> None:
    """Run ``start`` until ``flaky`` is inside an attempt, then stop it as a host would: nothing confirmed."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await entered.wait()
        tg.cancel_scope.cancel()


async def runs_report(ledger: Any) -> list[dict[str, Any]]:
    """The runs, each with every retry boundary's confirmed failures, as ``inspect`` reports them."""
    if isinstance(ledger.backend, PgBackend):
        report = await anyio.to_thread.run_sync(inspect_postgres, ledger.backend.url)
    else:
        report = inspect_ledger(ledger.backend.env)
    runs: list[dict[str, Any]] = report["runs"]
    return runs


def retry_failures(runs: list[dict[str, Any]], run_id: str) -> int:
    [run] = [run for run in runs if run["run_id"] == run_id]
    [retry] = [n for n in run["nodes"] if n["node"] == "flaky" and n["boundary"] == "retry at 1"]
    failures: int = retry["failures"]
    return failures


async def test_a_resume_with_another_aspect_chain_is_refused_before_anything_and_refills_no_budget(
    open_any: Opener,
) -> None:
    calls: list[str] = []
    entered = anyio.Event()
    g = flaky(calls, ["fail", "fail", "stop", "fail", "fail", "fail"], entered)
    async with open_any() as ledger:
        await stopped_in_the_middle(
            ledger, lambda: ledger.run(g, {N: 1}, run_id="r", aspects=[Retry(3)]), entered
        )
        assert calls == ["first", "flaky", "flaky", "flaky"]  # two failures confirmed, stopped in the third
        [record] = await ledger.runs()
        assert (record.status, record.starts, record.aspects) == ("running", 1, (RETRY_3,))
    async with open_any() as ledger:  # another process lifetime
        before = (await ledger.runs(), await ledger.nodes.node_records("r"), await runs_report(ledger))
        assert retry_failures(before[2], "r") == 2
        with pytest.raises(
            RunAspectsMismatchError,
            match=re.escape(
                f"run 'r' started with aspects [{RETRY_3}]; resume was given [Timeout(5.0), {RETRY_3}]"
            ),
        ):
            await ledger.resume("r", g, aspects=[Timeout(5.0), Retry(3)])
        assert calls == ["first", "flaky", "flaky", "flaky"]  # nothing ran
        after = (await ledger.runs(), await ledger.nodes.node_records("r"), await runs_report(ledger))
        assert after == before
        assert [n.node for n in await ledger.nodes.node_records("r")] == ["first"]  # the history is there

        with pytest.raises(ValueError, match="flaky today"):  # the chain it started with: one attempt left
            await ledger.resume("r", g, aspects=[Retry(3)])
        assert calls[4:] == ["flaky"]  # first restored, flaky's third attempt reclaimed and failed
        assert retry_failures(await runs_report(ledger), "r") == 3
        [record] = await ledger.runs()
        assert (record.status, record.starts) == ("failed", 2)


async def test_a_worker_given_another_chain_than_a_submitted_runs_runs_nothing_of_it(
    postgres_url: str,
) -> None:
    calls: list[str] = []
    g = flaky(calls, ["fail", "fail", "fail", "fail"], anyio.Event())
    async with open_postgres(postgres_url) as ledger:
        submitted = await ledger.submit(g, {N: 1}, run_id="s", aspects=[Retry(3)])
        assert (submitted.starts, submitted.aspects) == (0, (RETRY_3,))
        before = (await ledger.runs(), await runs_report(ledger))
    reports: list[tuple[str, str]] = []

    async with anyio.create_task_group() as tg:

        def report(run_id: str, outcome: str) -> None:
            reports.append((run_id, outcome))
            if outcome != "claimed":
                tg.cancel_scope.cancel()

        other: list[Aspect] = [Timeout(5.0), Retry(3)]
        tg.start_soon(
            partial(worker, postgres_url, {"flaky": g}, aspects=other, poll_seconds=0.05, report=report)
        )
    assert reports == [("s", "claimed"), ("s", "error (RunAspectsMismatchError)")]
    assert calls == []
    async with open_postgres(postgres_url) as ledger:
        after = await runs_report(ledger)
        # the worker keeps the lease of a run it gave up until the lease runs out: shown as held
        holders = {run["run_id"]: run.pop("holder") for run in after}
        assert holders["s"]["owner"] == f"{socket.gethostname()}:{os.getpid()}"
        unheld = [{k: v for k, v in run.items() if k != "holder"} for run in before[1]]
        assert (await ledger.runs(), after) == (before[0], unheld)
        await ledger.backend.connection.call(  # the run is tried again once its lease runs out: now
            lambda view: view.connection.execute(
                "UPDATE streamledger_leases SET expires_at = now() - interval '1s'"
            )
        )
    reports.clear()
    ended = await worker(
        postgres_url,
        {"flaky": g},
        aspects=[Retry(3)],
        poll_seconds=0.05,
        until_idle=True,
        report=lambda run_id, outcome: reports.append((run_id, outcome)),
    )
    assert (ended, reports) == (1, [("s", "claimed"), ("s", "failed")])
    assert calls == ["first", "flaky", "flaky", "flaky"]  # its whole budget, once
    async with open_postgres(postgres_url) as ledger:
        assert retry_failures(await runs_report(ledger), "s") == 3


class RunRecordBefore(msgspec.Struct, frozen=True):
    """A run's record as releases before the aspect chain was recorded wrote it."""

    format_version: int
    run_id: str
    graph: str
    version: str
    fingerprint: str
    inputs: tuple[CheckpointOutput, ...]
    status: str = "running"
    starts: int = 1
    error: str | None = None


async def put_record_before(ledger: Any, record: RunRecord) -> None:
    """Replace the run's record by the one an older release would have written."""
    fields = {f: getattr(record, f) for f in RunRecordBefore.__struct_fields__}
    raw = msgspec.msgpack.encode(RunRecordBefore(**fields))
    assert b"aspects" not in raw
    if isinstance(ledger.backend, PgBackend):
        await ledger.backend.connection.call(
            lambda view: view.connection.execute(
                "UPDATE streamledger_runs SET record = %s WHERE run_id = %s", (raw, record.run_id)
            ),
            buffered=False,
        )
        return
    key = node_run_key(record.run_id)
    db = ledger.backend.env.db("nodes")
    await ledger.backend.env.write(lambda txn: txn.put(key, seal("nodes", key, raw), db=db))


async def test_a_record_from_before_chains_were_recorded_takes_the_chain_of_its_next_resume(
    open_any: Opener,
) -> None:
    calls: list[str] = []
    entered = anyio.Event()
    g = flaky(calls, ["fail", "stop"], entered)
    async with open_any() as ledger:
        await stopped_in_the_middle(
            ledger, lambda: ledger.run(g, {N: 1}, run_id="old", aspects=[Retry(3)]), entered
        )
        [record] = await ledger.runs()
        await put_record_before(ledger, record)
    async with open_any() as ledger:
        [old] = await ledger.runs()
        # it decodes; it knows no chain, shape or times
        assert old == msgspec.structs.replace(
            record, aspects=None, shape=None, created_at=None, updated_at=None
        )
        entered = anyio.Event()
        g = flaky(calls, ["stop", "fail"], entered)
        # accepted with the chain it is given (here the one it ran with), and that chain recorded
        await stopped_in_the_middle(ledger, lambda: ledger.resume("old", g, aspects=[Retry(3)]), entered)
        [resumed] = await ledger.runs()
        assert (resumed.starts, resumed.aspects) == (2, (RETRY_3,))
        assert resumed.shape == g.topology().shape  # the graph it resumed with, checked as the run's
        assert calls == ["first", "flaky", "flaky", "flaky"]
        with pytest.raises(RunAspectsMismatchError, match=re.escape("resume was given [Timeout(5.0)]")):
            await ledger.resume("old", g, aspects=[Timeout(5.0)])  # checked from then on
        assert await ledger.runs() == [resumed]
        assert retry_failures(await runs_report(ledger), "old") == 1
