"""What steps see of their durable run, and what the runner refuses."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, StatusCode
from pydantic_graph import Graph, GraphBuilder, StepContext, reduce_list_append

from ledger import open_ledger
from ledger.graphs import (
    GraphInputTypeError,
    GraphRunActiveError,
    GraphStateTypeError,
    InvalidRunIdError,
    NotInGraphStepError,
    StepInfo,
    current_step,
)

from .graphs import Boom, Calls, Log, durable, enter, fail_then_retry, three_steps


class Opaque:
    """A type pydantic has no schema for."""


def keyed(seen: list[str] | None = None) -> Graph:
    """charge -> numbers -> keys (stream) -> map -> collect -> ship; each step notes what it read."""
    noted = seen if seen is not None else []

    def note() -> str:
        info = current_step()
        noted.append(f"{info.idempotency_key}/{info.node_id}/{info.attempt}/{info.run_id}")
        return noted[-1]

    g = GraphBuilder(name="keyed", state_type=Log, deps_type=Calls, input_type=int, output_type=list[str])

    @g.step
    async def charge(ctx: StepContext[Log, Calls, int]) -> int:
        note()
        return enter(ctx, "charge", ctx.inputs)

    @g.step
    async def numbers(ctx: StepContext[Log, Calls, int]) -> list[int]:
        note()
        return enter(ctx, "numbers", [ctx.inputs])

    async def keys(ctx: StepContext[Log, Calls, int]) -> AsyncIterator[str]:
        yield note()  # the stream's body runs later, in the task that reads it

    streamed = g.stream(keys, node_id="keys")
    collect = g.join(reduce_list_append, initial_factory=list[str])

    @g.step
    async def ship(ctx: StepContext[Log, Calls, list[str]]) -> list[str]:
        return enter(ctx, "ship", [*ctx.inputs, note()])

    g.add(
        g.edge_from(g.start_node).to(charge),
        g.edge_from(charge).to(numbers),
        g.edge_from(numbers).to(streamed),
        g.edge_from(streamed).map().to(collect),
        g.edge_from(collect).to(ship),
        g.edge_from(ship).to(g.end_node),
    )
    return g.build()


async def test_steps_read_the_runs_idempotency_key_the_same_in_every_attempt(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    seen: list[str] = []
    trail = await fail_then_retry(
        tmp_path, keyed(seen), "ship", inputs=1, provider=provider, exporter=exporter
    )
    assert trail.retry == ["ship"]  # keys ran again too (the boundary before it was the last saved)
    assert seen == [
        "r/charge/1/r",
        "r/numbers/1/r",
        "r/keys/1/r",
        "r/ship/1/r",
        "r/keys/2/r",
        "r/ship/2/r",
    ]
    assert trail.result.output == ["r/keys/2/r", "r/ship/2/r"]


async def test_steps_read_their_run_when_nothing_records_spans(tmp_path: Path) -> None:
    seen: list[str] = []
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(keyed(seen), ledger, tracer_provider=NoOpTracerProvider())
        with pytest.raises(Boom):
            await runner.run("r", state=Log(), inputs=1, deps=Calls(fail_at={"ship"}))
        result = await runner.run("r", state=Log(), inputs=1, deps=Calls())
    # the same as with a recording provider: steps and the stream step's body see their step
    assert seen == ["r/charge/1/r", "r/numbers/1/r", "r/keys/1/r", "r/ship/1/r", "r/keys/2/r", "r/ship/2/r"]
    assert result.output == ["r/keys/2/r", "r/ship/2/r"]


async def test_a_stream_steps_span_covers_its_stream(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await durable(keyed(), ledger, tracer_provider=provider).run("r", state=Log(), inputs=1, deps=Calls())
    (run,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_graph keyed"]
    names = [s.name for s in exporter.get_finished_spans() if s.name.startswith("execute_step")]
    assert sorted(names) == sorted(f"execute_step {n}" for n in ("charge", "numbers", "keys", "ship"))
    (stream,) = [s for s in exporter.get_finished_spans() if s.name == "execute_step keys"]
    assert stream.parent is not None and stream.parent.span_id == run.context.span_id
    assert stream.attributes is not None and stream.attributes["streamledger.graph.node_id"] == "keys"


def test_current_step_outside_a_step_is_an_error() -> None:
    with pytest.raises(NotInGraphStepError):
        current_step()
    assert StepInfo("r", "r", "n", 1).idempotency_key == "r"


async def test_a_failing_step_marks_its_span_and_the_runs_span_without_the_message(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(Boom):
            await durable(three_steps(), ledger, tracer_provider=provider).run(
                "r", state=Log(), inputs=5, deps=Calls(fail_at={"two"})
            )
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name in ("execute_step two", "invoke_graph three"):
        assert spans[name].status.status_code is StatusCode.ERROR
        assert spans[name].status.description == "Boom"
    assert spans["execute_step one"].status.status_code is StatusCode.UNSET


async def test_a_run_id_runs_once_at_a_time_in_a_process(tmp_path: Path) -> None:
    started, release = anyio.Event(), anyio.Event()
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def wait(ctx: StepContext[Log, Calls, int]) -> int:
        started.set()
        await release.wait()
        return enter(ctx, "wait", ctx.inputs)

    g.add(g.edge_from(g.start_node).to(wait), g.edge_from(wait).to(g.end_node))
    async with open_ledger(tmp_path / "l") as ledger:
        graph = durable(g.build(), ledger)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: graph.run("r", state=Log(), inputs=1, deps=Calls()))
            await started.wait()
            with pytest.raises(GraphRunActiveError, match="'r' is already running"):
                await graph.run("r", state=Log(), inputs=1, deps=Calls())
            assert (
                await durable(three_steps(), ledger).run("other", state=Log(), inputs=5, deps=Calls())
            ).output
            release.set()
        assert (await graph.run("r", state=Log(), inputs=1, deps=Calls())).already_finished


@pytest.mark.parametrize("run_id", ["", "x" * 401])
async def test_a_run_id_that_cannot_be_a_ledger_key_is_refused(tmp_path: Path, run_id: str) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(InvalidRunIdError):
            await durable(three_steps(), ledger).run(run_id, state=Log(), inputs=5, deps=Calls())


async def test_a_state_type_that_cannot_be_serialized_is_refused_at_registration(tmp_path: Path) -> None:
    g = GraphBuilder(name="orders", state_type=Opaque, input_type=int, output_type=int)

    @g.step
    async def only(ctx: StepContext[Opaque, None, int]) -> int:
        return 1

    g.add(g.edge_from(g.start_node).to(only), g.edge_from(only).to(g.end_node))
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(GraphStateTypeError, match="state type Opaque of orders has no pydantic schema"):
            durable(g.build(), ledger)


async def test_graph_input_and_output_types_that_cannot_be_serialized_are_refused(tmp_path: Path) -> None:
    for input_type, output_type in [(Opaque, int), (int, Opaque)]:
        g = GraphBuilder(name="g", input_type=input_type, output_type=output_type)

        @g.step
        async def only(ctx: StepContext[None, None, Opaque]) -> Opaque:
            return Opaque()

        g.add(g.edge_from(g.start_node).to(only), g.edge_from(only).to(g.end_node))
        async with open_ledger(tmp_path / f"l{input_type.__name__}") as ledger:
            with pytest.raises(GraphInputTypeError, match="Opaque"):
                durable(g.build(), ledger)
