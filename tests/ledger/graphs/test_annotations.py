"""Graphs built inside functions under the future import are checkpointed, or refused in plain words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import open_ledger
from ledger.graphs import DurableGraph, GraphInputTypeError, GraphStateTypeError, UntypedNodeWarning

from .graphs import events, run_spans
from .local_graphs import counting, journal, shouting
from .test_inference import plain_int, step_then_decision


async def test_a_graph_of_builder_locals_under_the_future_import_saves_a_checkpoint_after_every_step(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph, counter, faults, tick = counting()
    async with open_ledger(tmp_path / "l") as ledger:
        durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(graph, ledger, tracer_provider=provider)
        assert durable.untyped == {}
        deps = faults(fail_at=7)
        with pytest.raises(RuntimeError, match="bump 7"):
            await durable.run("c", state=counter(), inputs=tick(0, 10), deps=deps)
        assert deps.ran == [1, 2, 3, 4, 5, 6, 7]
        status = await durable.status("c")
        assert status is not None and status.checkpoints == 6 and status.next_node == "more"

        deps.ran.clear()
        result = await durable.run("c", state=counter(), inputs=tick(0, 10), deps=deps)
    assert deps.ran == [7, 8, 9, 10]  # bumps 1 to 6 were checkpointed and did not run again
    assert result.output == 10
    assert [t.n for t in result.state.tallies] == list(range(1, 11))  # local Tally values read back
    assert result.resumed_from == 6
    assert events(run_spans(exporter), "streamledger.checkpoint.skipped") == []


async def test_a_state_naming_a_class_nothing_reaches_is_refused_at_registration(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(GraphStateTypeError) as refused:
            DurableGraph(journal(), ledger)
        message = str(refused.value)
        assert "the state type journal.<locals>.Journal of journal" in message
        assert "name 'Note' is not defined" in message
        assert "register the graph inside the function that defines them" in message


async def test_a_graph_registered_inside_its_builder_resolves_the_builders_locals(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        durable = journal(ledger)  # the builder registers it: its frame holds Note
        result = await durable.run("j", state=durable.graph.state_type(), inputs="x")
        status = await durable.status("j")
    assert result.output == 0
    assert status is not None and status.finished and status.checkpoints == 2  # before the end, and the end


async def test_a_step_annotation_that_does_not_resolve_is_refused_naming_the_step_and_the_fix(
    tmp_path: Path,
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(GraphInputTypeError) as refused:
            DurableGraph(shouting(), ledger)
        message = str(refused.value)
        assert "step 'shout': StepContext[None, None, Label] does not resolve" in message
        assert "name 'Label' is not defined" in message
        assert "input_types={step id: type}" in message

        durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(
            shouting(), ledger, input_types={"shout": str}
        )
        result = await durable.run("s", inputs="hi")
    assert result.output == "HI"


async def test_untyped_nodes_after_steps_warn_by_default_and_can_raise_or_be_accepted(tmp_path: Path) -> None:
    graph = step_then_decision(plain_int, transform=True)
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.warns(UntypedNodeWarning) as warned:
            durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(graph, ledger)
        assert len(warned) == 1
        assert warned[0].filename == __file__  # points at the registering line
        assert "'decide' (the edge from 'first' transforms its value)" in str(warned[0].message)
        assert "input_types={'decide': ...}" in str(warned[0].message)
        assert durable.untyped == {"decide": "the edge from 'first' transforms its value"}

        with pytest.raises(
            GraphInputTypeError, match="'decide' \\(the edge from 'first' transforms its value\\)"
        ):
            DurableGraph(graph, ledger, on_untyped="raise")
        quiet: DurableGraph[Any, Any, Any, Any] = DurableGraph(
            graph, ledger, on_untyped="ignore"
        )  # filterwarnings=error: no warning
        assert quiet.untyped == durable.untyped
        with pytest.raises(ValueError, match="on_untyped"):
            DurableGraph(graph, ledger, on_untyped="loud")  # type: ignore[arg-type]
