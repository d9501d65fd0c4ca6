"""The private check behind quiescent boundaries, and the pydantic-graph versions it is pinned to."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

import importlib.metadata
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from packaging.requirements import Requirement
from pydantic import TypeAdapter
from pydantic.errors import PydanticUndefinedAnnotation
from pydantic_graph import EndMarker, GraphBuilder, GraphTask, StepContext

import ledger.graphs._runner
from ledger import open_ledger
from ledger.graphs import VERIFIED_VERSIONS, DurableGraph, UnsupportedPydanticGraphError
from ledger.graphs._quiescence import check_pydantic_graph_version

from .graphs import Calls, Log, durable, enter, events, run_spans, three_steps


def test_the_installed_pydantic_graph_is_a_verified_version() -> None:
    assert importlib.metadata.version("pydantic-graph") in VERIFIED_VERSIONS


def test_an_unverified_pydantic_graph_is_refused_naming_the_versions_that_work() -> None:
    for version in ("2.99.0", "2.50.0", "2.67.0", "2.100.0"):
        with pytest.raises(UnsupportedPydanticGraphError) as refused:
            check_pydantic_graph_version(version)
        assert f"{version} is installed" in str(refused.value)
        assert "verified only on 2.51.0 to 2.68.0" in str(refused.value)
        assert "pip install 'pydantic-graph==2.68.0'" in str(refused.value)
    check_pydantic_graph_version("2.51.0")
    check_pydantic_graph_version("2.68.0")


def test_the_extras_bounds_admit_the_verified_releases_and_no_later_one() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    wanted = [Requirement(r) for extra in extras.values() for r in extra if r.startswith("pydantic-graph")]
    assert len(wanted) == 2  # the extra and the dev extra
    for requirement in wanted:
        assert all(requirement.specifier.contains(v) for v in VERIFIED_VERSIONS)
        assert not requirement.specifier.contains("2.50.0")
        assert not requirement.specifier.contains("2.69.0")  # the next release is refused until verified


async def test_registration_checks_the_installed_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger.graphs._runner, "installed_pydantic_graph_version", lambda: "3.0.0")
    async with open_ledger(tmp_path / "l") as opened:
        with pytest.raises(UnsupportedPydanticGraphError):
            DurableGraph[Log, Calls, int, int](three_steps(), opened)


async def test_the_private_fields_the_check_reads_have_the_verified_shape() -> None:
    graph = three_steps()
    async with graph.iter(state=Log(), deps=Calls(), inputs=5, infer_name=False) as run:
        async for event in run:
            iterator = run._iterator_instance
            assert iterator is not None
            assert isinstance(iterator.active_reducers, dict)
            assert all(isinstance(task, GraphTask) for task in iterator.active_tasks.values())
            if not isinstance(event, EndMarker):
                # At a yield the finished task is still active; its successors are not yet.
                assert len(iterator.active_tasks) == 1
                assert not {t.task_id for t in event} & set(iterator.active_tasks)


async def test_only_yields_after_a_step_are_boundaries(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def first(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "first", ctx.inputs)

    @g.step
    async def second(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "second", ctx.inputs)

    decide = g.decision(node_id="decide").branch(g.match(int).to(second))
    g.add(g.edge_from(g.start_node).to(first), g.edge_from(first).to(decide))
    g.add(g.edge_from(second).to(g.end_node))
    async with open_ledger(tmp_path / "l") as opened:
        await durable(g.build(), opened, tracer_provider=provider).run(
            "r", state=Log(), inputs=1, deps=Calls()
        )
    saved = events(run_spans(exporter), "streamledger.checkpoint.saved")
    # Not after the start node, not after the decision: after each step, and at the end.
    assert [(e["streamledger.graph.node_id"], e["streamledger.checkpoint.next_node"]) for e in saved] == [
        ("first", "decide"),
        ("second", "__end__"),
        ("__end__", ""),
    ]
    assert [e["streamledger.checkpoint.sequence"] for e in saved] == [1, 2, 3]


def test_pydantic_completes_adapters_through_the_types_namespace_the_adapter_passes() -> None:
    """``TypeAdapter.rebuild(_types_namespace=...)`` is the private parameter ``_annotations`` relies on."""
    from .local_graphs import journal

    state_type = journal().state_type
    adapter: TypeAdapter[object] = TypeAdapter(state_type)
    assert not adapter.pydantic_complete  # Note is a builder local nothing reaches
    note = state_type.__dataclass_fields__["notes"].type  # "list[Note]"
    assert note == "list[Note]"
    with pytest.raises(PydanticUndefinedAnnotation, match="Note"):
        adapter.rebuild(raise_errors=True, _types_namespace={})

    @dataclass
    class Note:
        text: str

    adapter.rebuild(raise_errors=True, _types_namespace={"Note": Note})
    assert adapter.pydantic_complete
    assert adapter.validate_json(b'{"notes": [{"text": "hi"}]}') == state_type([Note("hi")])
