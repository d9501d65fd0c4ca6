"""Start-or-continue by run id, and refusals that name what differs; on LMDB and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import (
    RunCancelledError,
    RunFinishedError,
    RunInputsMismatchError,
    RunMismatchError,
    UnknownRunError,
)
from ledger.postgres import PgBackend, open_postgres, work
from streams import (
    Execution,
    ExecutionCancelledError,
    Graph,
    Key,
    MessageTx,
    NodeContext,
    NoValue,
    SourceNotResumableError,
    Stream,
)

from .conftest import Opener

ROOT = Path(__file__).resolve().parents[2]

N = Key("n", int)
NOTE = Key("note", str)
DOUBLED = Key("doubled", int)


def doubling(*, extra: bool = False, note_type: type = str) -> Graph:
    g = Graph("doubling", version="1", inputs=[N, Key("note", note_type)])

    @g.node(requires=[N], provides=[DOUBLED])
    async def double(ctx: NodeContext) -> None:
        ctx.set(DOUBLED, ctx[N] * 2)

    if extra:

        @g.node(requires=[DOUBLED])
        async def audit(ctx: NodeContext) -> None:
            pass

    return g


async def test_start_runs_a_new_id_and_continues_a_known_one(open_any: Opener) -> None:
    started = anyio.Event()
    hold = Graph("held", version="1", inputs=[N])
    runs: list[int] = []

    @hold.node(requires=[N], provides=[DOUBLED])
    async def slow(ctx: NodeContext) -> None:
        runs.append(ctx[N])
        if len(runs) == 1:  # the first process dies here
            started.set()
            await anyio.sleep_forever()
        ctx.set(DOUBLED, ctx[N] * 2)

    async with open_any() as ledger, anyio.create_task_group() as tg:
        tg.start_soon(lambda: ledger.start(hold, {N: 4}, run_id="r"))
        await started.wait()
        tg.cancel_scope.cancel()
    async with open_any() as ledger:  # another process lifetime: the same call continues the run
        result = await ledger.start(hold, {N: 4}, run_id="r")
        assert result.resumed and not result.already_finished and result.result[DOUBLED] == 8
        again = await ledger.start(hold, {N: 4}, run_id="r")
        assert again.already_finished and again.result[DOUBLED] == 8
        fresh = await ledger.start(hold, {N: 5}, run_id="s")
        assert not fresh.resumed and fresh.result[DOUBLED] == 10
        assert [(r.run_id, r.status, r.starts) for r in await ledger.runs()] == [
            ("r", "completed", 2),
            ("s", "completed", 1),
        ]
    assert runs == [4, 4, 5]


async def test_start_with_other_inputs_names_them_and_changes_nothing(open_any: Opener) -> None:
    async with open_any() as ledger:
        await ledger.start(doubling(), {N: 21, NOTE: "a"}, run_id="a")
        before = await ledger.runs()
        with pytest.raises(RunInputsMismatchError, match=r"other inputs \(input 'n' has another value\)"):
            await ledger.start(doubling(), {N: 22, NOTE: "a"}, run_id="a")
        with pytest.raises(RunInputsMismatchError, match="input 'note' was ready, is skipped"):
            await ledger.start(doubling(), {N: 21, NOTE: NoValue}, run_id="a")
        assert await ledger.runs() == before


async def test_another_topology_is_refused_naming_the_node_port_or_type_that_differs(
    open_any: Opener,
) -> None:
    async with open_any() as ledger:
        await ledger.start(doubling(), {N: 1, NOTE: "a"}, run_id="a")
        before = await ledger.runs()
        with pytest.raises(RunMismatchError, match=r"another topology \(node 'audit' is new\)"):
            await ledger.start(doubling(extra=True), {N: 1, NOTE: "a"}, run_id="a")
        with pytest.raises(RunMismatchError, match=r"another topology \(input 'note' was str, is int\)"):
            await ledger.resume("a", doubling(note_type=int))
        assert await ledger.runs() == before


ORDERS = Key("orders", Stream[int])
INVOICES = Key("invoices", Stream[int])
BILLED = Key("billed", int)


def shop(entered: anyio.Event, *, billing_resumable: bool = False) -> Graph:
    """``orders`` (resumable) -> ``billing``, which reads orders and writes invoices -> ``audit``."""
    g = Graph("shop", version="1", inputs=[N])

    @g.node(requires=[N], provides=[ORDERS], resumable=True)
    async def orders(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        for order in range((writer.position or 0) + 1, ctx[N] + 1):
            await writer.send(order, send_at=order)

    async def billing(ctx: NodeContext) -> None:
        invoices = ctx.writer(INVOICES)

        async def bill(tx: MessageTx[int], order: int) -> None:
            if order == 5:
                await invoices.flush()
                entered.set()
                await anyio.sleep_forever()  # the process dies here, its invoices begun
            tx.send(invoices, order * 10)
            tx.set_state(tx.state + order)

        await ctx.handle_messages(ORDERS, bill, initial_state=0)

    g.add_node("billing", billing, requires=[ORDERS], provides=[INVOICES], resumable=billing_resumable)

    @g.node(requires=[INVOICES], provides=[BILLED])
    async def audit(ctx: NodeContext) -> None:
        async def count(tx: MessageTx[int], invoice: int) -> None:
            tx.set_state(tx.state + 1)
            tx.set(BILLED, tx.state)

        await ctx.handle_messages(INVOICES, count, initial_state=0)

    return g


async def _everything(ledger: Any) -> bytes:
    """The whole ledger's content, to compare byte for byte."""
    if isinstance(ledger.backend, PgBackend):

        def dump(view: Any) -> bytes:
            tables = view.connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
            ).fetchall()
            rows = [
                (table, view.connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall())
                for (table,) in tables
                if table != "streamledger_leases"  # held and renewed by whoever runs a run
            ]
            return repr(rows).encode()

        result: bytes = await ledger.backend.connection.call(dump, buffered=False)
        return result
    path: Path = ledger.backend.env.path
    return (path / "data.mdb").read_bytes()


async def test_a_writer_resumed_without_its_promise_is_refused_naming_it_and_nothing_is_written(
    open_any: Opener,
) -> None:
    entered = anyio.Event()
    async with open_any() as ledger, anyio.create_task_group() as tg:
        tg.start_soon(lambda: ledger.start(shop(entered), {N: 1000}, run_id="r"))
        await entered.wait()
        tg.cancel_scope.cancel()
    async with open_any() as ledger:
        before = await _everything(ledger)
        with pytest.raises(
            SourceNotResumableError, match=r"node 'billing' of graph 'shop' had begun writing"
        ) as caught:
            await ledger.start(shop(anyio.Event()), {N: 1000}, run_id="r")
        assert "resumable=True" in str(caught.value) and "nothing was written" in str(caught.value)
        assert await _everything(ledger) == before  # not even the run's record: byte for byte
        done = await ledger.start(shop(anyio.Event(), billing_resumable=True), {N: 4}, run_id="r2")
        assert done.result[BILLED] == 4


def holding_graph(entered: anyio.Event, ran: list[int]) -> Graph:
    g = Graph("holding", version="1", inputs=[N])

    @g.node(requires=[N], provides=[DOUBLED])
    async def slow(ctx: NodeContext) -> None:
        ran.append(ctx[N])
        entered.set()
        await anyio.sleep_forever()

    return g


async def test_a_cancelled_run_stops_is_recorded_with_who_and_why_and_is_not_resumed(
    open_any: Opener,
) -> None:
    entered, ran = anyio.Event(), list[int]()
    async with open_any() as ledger:
        stopped: list[BaseException] = []

        async def run() -> None:
            try:
                await ledger.start(holding_graph(entered, ran), {N: 3}, run_id="c")
            except ExecutionCancelledError as exc:
                stopped.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await entered.wait()
            record = await ledger.cancel("c", reason="the customer withdrew", by="ops@example.org")
        assert len(stopped) == 1  # the run stopped, as a host's cancel stops it
        assert (record.status, record.cancelled.by, record.cancelled.reason) == (
            "cancelled",
            "ops@example.org",
            "the customer withdrew",
        )
    async with open_any() as ledger:  # another process lifetime
        [kept] = await ledger.runs()
        assert kept == record
        with pytest.raises(RunCancelledError, match=r"run 'c' was cancelled by ops@example\.org"):
            await ledger.start(holding_graph(entered, ran), {N: 3}, run_id="c")
        with pytest.raises(RunFinishedError, match="run 'c' is cancelled: there is nothing to cancel"):
            await ledger.cancel("c", reason="again")
        with pytest.raises(UnknownRunError):
            await ledger.cancel("nope", reason="typo")
        with pytest.raises(ValueError, match="a cancel says why"):
            await ledger.cancel("c", reason=" ")
        assert await ledger.runs() == [record]
    assert ran == [3]  # the cancelled run never ran again


async def test_a_run_cancelled_while_it_is_being_resumed_stays_cancelled(
    open_any: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancellation lands after the resume read the run's record and before it wrote it again
    (its start count): the resume is refused, the record keeps the cancellation, nothing runs."""
    entered, ran = anyio.Event(), list[int]()
    async with open_any() as ledger, anyio.create_task_group() as tg:
        tg.start_soon(partial(ledger.start, holding_graph(entered, ran), {N: 3}, run_id="c"))
        await entered.wait()
        tg.cancel_scope.cancel()  # the host stops it: the run stays running, for a resume
    check_streams = Execution.check_streams

    async with open_any() as ledger:
        cancelled: list[object] = []

        async def cancel_first(execution: Execution) -> None:  # between the resume's read and its write
            cancelled.append(await ledger.cancel("c", reason="withdrawn meanwhile"))
            await check_streams(execution)

        monkeypatch.setattr(Execution, "check_streams", cancel_first)
        with pytest.raises(RunCancelledError, match="run 'c' was cancelled while it was being resumed"):
            with anyio.fail_after(60):  # a resume that went on would hold for ever
                await ledger.resume("c", holding_graph(entered, ran))
        [record] = await ledger.runs()
        assert [record] == cancelled and record.status == "cancelled"
    assert ran == [3]  # it never ran again


async def test_a_worker_stops_a_run_cancelled_from_the_command_line(postgres_url: str) -> None:
    entered, ran = anyio.Event(), list[int]()
    graph = holding_graph(entered, ran)
    async with open_postgres(postgres_url) as ledger:
        await ledger.submit(graph, {N: 5}, run_id="w")
    reports: list[tuple[str, str]] = []

    def report(run_id: str, outcome: str) -> None:
        reports.append((run_id, outcome))

    def cancel() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "ledger",
                "runs",
                "cancel",
                postgres_url,
                "w",
                "--reason",
                "stop",
                "--by",
                "ops",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            partial(
                work, postgres_url, {"holding": graph}, lease_seconds=1, poll_seconds=0.05, until_idle=True,
                report=report,
            )
        )  # fmt: skip
        await entered.wait()
        done = await anyio.to_thread.run_sync(cancel)
    assert done.returncode == 0 and done.stdout == "cancelled run 'w' by ops (stop)\n", done.stderr
    assert reports == [("w", "claimed"), ("w", "cancelled")]  # stopped at its next renewal; the worker ended
    async with open_postgres(postgres_url) as ledger:
        [record] = await ledger.runs()
        assert record.status == "cancelled" and record.cancelled is not None and record.cancelled.by == "ops"
        assert await ledger.backend.connection.call(
            lambda view: view.connection.execute("SELECT count(*) FROM streamledger_leases").fetchone()
        ) == (0,)  # its lease was given up
    assert ran == [5]
