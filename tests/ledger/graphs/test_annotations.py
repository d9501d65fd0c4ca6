"""Graphs built inside functions under the future import are checkpointed, or refused in plain words."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import open_ledger
from ledger.graphs import DurableGraph, GraphInputTypeError, GraphStateTypeError, UntypedNodeWarning

from .graphs import events, run_spans
from .local_graphs import choosing, counting, journal, shouting
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
    graph = journal(built=False).build()  # built here, where Note is not
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(GraphStateTypeError) as refused:
            DurableGraph(graph, ledger)
        message = str(refused.value)
        assert "the state type journal.<locals>.Journal of journal" in message
        assert "name 'Note' is not defined" in message
        assert "build (or register) the graph inside the function that defines them" in message


async def test_a_graph_registered_after_its_builder_returned_resolves_the_locals_it_was_built_with(
    tmp_path: Path,
) -> None:
    graph = journal()  # its state Journal names Note, a class local to the builder
    async with open_ledger(tmp_path / "l") as ledger:
        durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(graph, ledger)
        result = await durable.run("j", state=graph.state_type(), inputs="x")
    assert result.output == 0


async def test_a_step_returning_a_literal_local_to_its_builder_is_checkpointed_and_resumes(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph, faults = choosing()  # pick -> Choice, a Literal the builder defines: the decision is typed
    async with open_ledger(tmp_path / "l") as ledger:
        durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(graph, ledger, tracer_provider=provider)
        assert durable.untyped == {}  # no UntypedNodeWarning (filterwarnings=error)
        deps = faults(fail_small=True)
        with pytest.raises(RuntimeError, match="small fails once"):
            await durable.run("c", inputs=3, deps=deps)
        assert deps.ran == ["pick", "small"]
        status = await durable.status("c")
        assert status is not None and status.checkpoints == 1 and status.next_node == "route"

        deps.ran.clear()
        result = await durable.run("c", inputs=3, deps=deps)
        status = await durable.status("c")
    assert deps.ran == ["small"]  # pick was checkpointed and did not run again
    assert result.output == "a small order" and result.resumed_from == 1
    assert status is not None and status.finished and status.checkpoints == 3  # and before the end
    assert events(run_spans(exporter), "streamledger.checkpoint.skipped") == []


async def test_a_literal_local_to_another_function_than_the_one_that_built_the_graph_still_warns(
    tmp_path: Path,
) -> None:
    builder, _ = choosing(built=False)
    graph = builder.build()  # built here, where Choice is not: nothing can know it
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.warns(UntypedNodeWarning) as warned:
            durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(graph, ledger)
    assert durable.untyped == {
        "route": "the return annotation Choice of the step 'pick' before it does not resolve "
        "(name 'Choice' is not defined)"
    }
    assert len(warned) == 1 and "'route'" in str(warned[0].message)


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
            DurableGraph(shouting(built=False).build(), ledger)  # built here, where Label is not
        message = str(refused.value)
        assert "step 'shout': StepContext[None, None, Label] does not resolve" in message
        assert "name 'Label' is not defined" in message
        assert "input_types={step id: type}" in message

        durable: DurableGraph[Any, Any, Any, Any] = DurableGraph(
            shouting(built=False).build(), ledger, input_types={"shout": str}
        )
        result = await durable.run("s", inputs="hi")
        local: DurableGraph[Any, Any, Any, Any] = DurableGraph(shouting(), ledger)  # built in its builder
        assert (await local.run("t", inputs="ho")).output == "HO"
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


def test_build_keeps_its_callers_locals_beside_the_graph_until_the_graph_goes() -> None:
    from pydantic_graph import GraphBuilder

    from ledger.graphs._annotations import _BUILT_IN, builder_locals, remember_builder_locals

    wrapped = GraphBuilder.build
    remember_builder_locals()  # importing ledger.graphs did: once is enough
    assert GraphBuilder.build is wrapped
    graph, faults = choosing()
    assert builder_locals(graph)["Faults"] is faults and "Choice" in builder_locals(graph)
    builder, _ = choosing(built=False)
    built_here = builder.build()
    kept_here = builder_locals(built_here)  # this test's locals when it built: only what annotations name
    assert "Choice" not in kept_here and "GraphBuilder" in kept_here
    assert "builder" not in kept_here and "graph" not in kept_here  # instances: the graph could not go

    def build_one() -> int:
        graph, _ = choosing()
        return id(graph)

    gone = build_one()
    gc.collect()
    assert gone not in _BUILT_IN  # what it kept went with the graph
