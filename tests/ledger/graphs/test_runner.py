# mypy: disable-error-code="type-arg"

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_graph import Graph, GraphBuilder, StepContext

from ledger import open_ledger

from .conftest import Opening
from .graphs import Boom, Calls, Log, durable, enter, events, fail_then_retry, run_spans, three_steps


async def test_a_run_returns_the_graphs_output_and_state(opening: Opening) -> None:
    async with opening() as ledger:
        calls = Calls()
        result = await durable(three_steps(), ledger).run("r", state=Log(), inputs=5, deps=calls)
    assert (result.output, result.state.steps) == (9, ["one", "two", "three"])
    assert calls.ran == ["one", "two", "three"]
    assert (result.attempt, result.resumed_from, result.already_finished) == (1, None, False)


async def test_a_retry_resumes_after_the_last_completed_step(opening: Opening) -> None:
    async with opening() as ledger:
        calls = Calls(fail_at={"three"})
        graph = durable(three_steps(), ledger)
        with pytest.raises(Boom):
            await graph.run("r", state=Log(), inputs=5, deps=calls)
        result = await graph.run("r", state=Log(), inputs=5, deps=calls)
    assert calls.ran == ["one", "two", "three", "three"]
    assert result.output == 9
    assert result.state.steps == ["one", "two", "three"]
    assert (result.attempt, result.resumed_from) == (2, 2)


async def test_progress_is_recorded_with_every_checkpoint(opening: Opening) -> None:
    async with opening() as ledger:
        graph = durable(three_steps(), ledger)
        assert await graph.status("r") is None
        with pytest.raises(Boom):
            await graph.run("r", state=Log(), inputs=5, deps=Calls(fail_at={"two"}))
        status = await graph.status("r")
        assert status is not None
        assert (status.attempt, status.checkpoints, status.last_step, status.next_node, status.finished) == (
            1,
            1,
            "one",
            "two",
            False,
        )
        await graph.run("r", state=Log(), inputs=5, deps=Calls())
        status = await graph.status("r")
        assert status is not None
        assert (status.attempt, status.checkpoints, status.next_node, status.finished) == (2, 4, None, True)


async def test_a_finished_run_whose_result_was_not_recorded_does_not_run_again(opening: Opening) -> None:
    async with opening() as ledger:
        await durable(three_steps(), ledger).run("r", state=Log(), inputs=5, deps=Calls())
    # The caller died before recording the result; a new process runs the same run id.
    async with opening() as ledger:
        calls = Calls()
        result = await durable(three_steps(), ledger).run("r", state=Log(), inputs=5, deps=calls)
    assert calls.ran == []
    assert (result.output, result.state.steps, result.already_finished) == (9, ["one", "two", "three"], True)


async def test_running_a_finished_run_again_counts_no_attempt(opening: Opening) -> None:
    async with opening() as ledger:
        graph = durable(three_steps(), ledger)
        first = await graph.run("r", state=Log(), inputs=5, deps=Calls())
        again = [await graph.run("r", state=Log(), inputs=5, deps=Calls()) for _ in range(3)]
        status = await graph.status("r")
    assert first.attempt == 1 and not first.already_finished
    assert [(r.attempt, r.already_finished, r.output) for r in again] == [(1, True, 9)] * 3
    assert status is not None and (status.attempt, status.finished, status.error) == (1, True, None)


async def test_a_failed_attempt_records_its_exception_type_until_the_next_attempt(opening: Opening) -> None:
    async with opening() as ledger:
        graph = durable(three_steps(), ledger)
        with pytest.raises(Boom):
            await graph.run("r", state=Log(), inputs=5, deps=Calls(fail_at={"two"}))
        failed = await graph.status("r")
        await graph.run("r", state=Log(), inputs=5, deps=Calls())
        finished = await graph.status("r")
    assert failed is not None and (failed.attempt, failed.error, failed.next_node) == (1, "Boom", "two")
    assert finished is not None and (finished.attempt, finished.error, finished.finished) == (2, None, True)


async def test_forget_deletes_a_runs_records(opening: Opening) -> None:
    async with opening() as ledger:
        graph = durable(three_steps(), ledger)
        await graph.run("r", state=Log(), inputs=5, deps=Calls())
        await graph.forget("r")
        assert await graph.status("r") is None
        calls = Calls()
        assert (await graph.run("r", state=Log(), inputs=5, deps=calls)).output == 9
        assert calls.ran == ["one", "two", "three"]


async def test_each_step_runs_in_an_execute_step_span_under_the_runs_span(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await durable(three_steps(), ledger, tracer_provider=provider).run(
            "r", state=Log(), inputs=5, deps=Calls()
        )
    (run,) = run_spans(exporter)
    assert run.name == "invoke_graph three"
    steps = [s for s in exporter.get_finished_spans() if s.name.startswith("execute_step")]
    assert [s.name for s in steps] == ["execute_step one", "execute_step two", "execute_step three"]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in steps)
    saved = events([run], "streamledger.checkpoint.saved")
    assert [e["streamledger.checkpoint.next_node"] for e in saved] == ["two", "three", "__end__", ""]


def start_edge_transform() -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def one(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "one", ctx.inputs + 1)

    @g.step
    async def two(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "two", ctx.inputs * 2)

    g.add(
        g.edge_from(g.start_node).transform(lambda ctx: ctx.inputs * 10).to(one),
        g.edge_from(one).to(two),
        g.edge_from(two).to(g.end_node),
    )
    return g.build()


async def test_a_resumed_run_is_given_the_original_graph_inputs(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # A fresh Graph.iter runs the start node's edges (and their transforms) again before the
    # saved task replaces their result, so they must see the inputs the run started with.
    trail = await fail_then_retry(
        tmp_path, start_edge_transform(), "two", inputs=4, provider=provider, exporter=exporter
    )
    assert trail.retry == ["two"]
    assert trail.result.output == 82


async def test_a_runs_record_and_checkpoint_are_read_together_from_one_snapshot(opening: Opening) -> None:
    """Resuming reads the record and the checkpoint in one read: on PostgreSQL one statement, so
    another worker's write can never fall between them."""
    async with opening() as ledger:
        graph = durable(three_steps(), ledger)
        with pytest.raises(Boom):
            await graph.run("r", state=Log(), inputs=5, deps=Calls(fail_at={"two"}))
        record, saved = await ledger.graph_runs.read("r")
        assert record is not None and record.run_id == "r"
        assert saved is not None and not isinstance(saved, str)
        assert await ledger.graph_runs.read("never") == (None, None)
        backend = ledger.backend
        if hasattr(backend, "connection"):  # PostgreSQL: count the statements a status takes
            reads = 0
            read = backend.connection.read

            async def counted(op: object) -> object:
                nonlocal reads
                reads += 1
                return await read(op)

            backend.connection.read = counted
            assert await graph.status("r") is not None
            assert reads == 1
