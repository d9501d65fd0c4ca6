"""Input types of decisions and forks: inferred from the edges into them, or named by input_types."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeVar

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import Field
from pydantic_graph import Graph, GraphBuilder, StepContext, reduce_sum

from ledger import open_ledger
from ledger.graphs import GraphInputTypeError, UntypedNodeWarning

from .graphs import Calls, Log, durable, enter, events, fail_then_retry

T = TypeVar("T")


class Opaque:
    """A type pydantic has no schema for."""

    def __init__(self, n: int) -> None:
        self.n = n


def _builder(input_type: Any = int) -> GraphBuilder:
    return GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=input_type, output_type=int)


def step_then_decision(first: Any, *, transform: bool = False) -> Graph:
    """start -> first -> (transform?) -> decide -> after -> end; ``after`` is the step to fail."""
    g = _builder()

    @g.step
    async def after(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "after", ctx.inputs)

    decide = g.decision(node_id="decide").branch(g.match(int).to(after))
    step = g.step(first, node_id="first")
    edge = g.edge_from(step)
    if transform:
        edge = edge.transform(lambda ctx: ctx.inputs)
    g.add(g.edge_from(g.start_node).to(step), edge.to(decide))
    g.add(g.edge_from(after).to(g.end_node))
    return g.build()


async def annotated_int(ctx: StepContext[Log, Calls, int]) -> Annotated[int, Field(gt=0)]:
    return enter(ctx, "first", 0)  # breaks its own constraint: the graph never checks it


async def plain_int(ctx: StepContext[Log, Calls, int]) -> int:
    return enter(ctx, "first", ctx.inputs)


async def unannotated(ctx: StepContext[Log, Calls, int]):  # type: ignore[no-untyped-def]
    return enter(ctx, "first", ctx.inputs)


async def returns_any(ctx: StepContext[Log, Calls, int]) -> Any:
    return enter(ctx, "first", ctx.inputs)


async def returns_type_var(ctx: StepContext[Log, Calls, T]) -> T:
    result: T = enter(ctx, "first", ctx.inputs)
    return result


async def returns_opaque(ctx: StepContext[Log, Calls, int]) -> Opaque:
    return enter(ctx, "first", Opaque(ctx.inputs))


async def test_a_decision_takes_the_return_type_of_the_step_before_it_without_annotated_metadata(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph = step_then_decision(annotated_int)
    trail = await fail_then_retry(tmp_path, graph, "after", inputs=5, provider=provider, exporter=exporter)
    assert trail.first == ["first", "after"]
    assert trail.retry == ["after"]  # resumed before the decision: its input 0 was not checked against gt=0
    assert trail.seen == [0]


@pytest.mark.parametrize(
    ("first", "transform", "why"),
    [
        pytest.param(
            plain_int, True, "the edge from 'first' transforms its value", id="transform-on-the-edge"
        ),
        pytest.param(
            unannotated, False, "'first' before it has no return annotation", id="no-return-annotation"
        ),
        pytest.param(returns_any, False, "'first' before it returns Any", id="returns-Any"),
        pytest.param(returns_type_var, False, "returns a type variable", id="returns-a-type-variable"),
        pytest.param(
            returns_opaque, False, "Opaque has no pydantic schema", id="returns-a-type-without-schema"
        ),
    ],
)
async def test_a_decision_whose_input_type_cannot_be_inferred_gets_no_checkpoint_before_it(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    first: Any,
    transform: bool,
    why: str,
) -> None:
    graph = step_then_decision(first, transform=transform)
    if first is returns_opaque:
        graph = _opaque_decision()
    with pytest.warns(UntypedNodeWarning, match=f"'decide' \\([^)]*{why}"):
        trail = await fail_then_retry(
            tmp_path, graph, "after", inputs=5, provider=provider, exporter=exporter
        )
    assert trail.retry == ["first", "after"]  # started over: no checkpoint before the decision
    skipped = events(trail.spans, "streamledger.checkpoint.skipped")
    assert {
        (e["streamledger.checkpoint.next_node"], e["streamledger.checkpoint.reason"]) for e in skipped
    } == {("decide", "untyped")}


def _opaque_decision() -> Graph:
    g = _builder()

    @g.step
    async def after(ctx: StepContext[Log, Calls, Opaque]) -> int:
        opaque: Opaque = ctx.inputs
        return enter(ctx, "after", opaque.n)

    decide = g.decision(node_id="decide").branch(g.match(Opaque).to(after))
    first = g.step(returns_opaque, node_id="first")
    g.add(
        g.edge_from(g.start_node).to(first), g.edge_from(first).to(decide), g.edge_from(after).to(g.end_node)
    )
    return g.build()


async def test_an_inferred_type_without_schema_is_dropped_and_the_graph_still_registers(
    tmp_path: Path,
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(_opaque_decision(), ledger, on_untyped="ignore")
        result = await runner.run("r", state=Log(), inputs=5, deps=Calls())
    assert result.output == 5
    assert runner.untyped == {"decide": "its inferred input type Opaque has no pydantic schema"}


async def test_input_types_names_the_type_inference_cannot(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph = step_then_decision(plain_int, transform=True)
    trail = await fail_then_retry(
        tmp_path, graph, "after", inputs=5, provider=provider, exporter=exporter, input_types={"decide": int}
    )
    assert trail.retry == ["after"]


async def test_an_explicit_type_pydantic_cannot_handle_is_refused_at_registration(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        with pytest.raises(GraphInputTypeError, match=r"input_types\['decide'\]"):
            durable(step_then_decision(plain_int), ledger, input_types={"decide": Opaque})
        with pytest.raises(GraphInputTypeError, match="not a node"):
            durable(step_then_decision(plain_int), ledger, input_types={"decied": int})


def looping_decisions(input_type: Any, first: Any) -> Graph:
    """start -> first -> outer -> inner; inner -> (> 10) after | bump -> inner (a loop); after -> end.

    ``inner``'s edges come from ``outer`` (a decision) and ``bump`` (a step), so its type is known
    only if ``outer``'s is: decisions after decisions.
    """
    g = _builder(input_type)

    @g.step
    async def bump(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "bump", ctx.inputs + 4)

    @g.step
    async def after(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "after", ctx.inputs)

    inner = (
        g.decision(node_id="inner")
        .branch(g.match(int, matches=lambda n: n > 10).to(after))
        .branch(g.match(int).to(bump))
    )
    outer = g.decision(node_id="outer").branch(g.match(int).to(inner))
    step = g.step(first, node_id="first")
    g.add(
        g.edge_from(g.start_node).to(step),
        g.edge_from(step).to(outer),
        g.edge_from(bump).to(inner),
        g.edge_from(after).to(g.end_node),
    )
    return g.build()


async def test_decisions_after_decisions_infer_their_types_until_nothing_more_is_learned(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph = looping_decisions(int, plain_int)
    trail = await fail_then_retry(tmp_path, graph, "after", inputs=5, provider=provider, exporter=exporter)
    assert trail.first == ["first", "bump", "bump", "after"]
    assert trail.retry == ["after"]  # resumed after the last bump, before the inner decision
    assert trail.result.output == 13


async def test_a_decision_fed_by_an_untyped_decision_stays_untyped(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph = looping_decisions(int, unannotated)
    with pytest.warns(UntypedNodeWarning, match="'inner' \\(the decision 'outer' before it is untyped\\)"):
        trail = await fail_then_retry(
            tmp_path, graph, "after", inputs=5, provider=provider, exporter=exporter
        )
    assert trail.retry == ["first", "bump", "bump", "after"]


async def test_decisions_after_an_explicitly_typed_one_infer_from_the_explicit_type(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    graph = looping_decisions(int, unannotated)
    trail = await fail_then_retry(
        tmp_path, graph, "after", inputs=5, provider=provider, exporter=exporter, input_types={"outer": int}
    )
    assert trail.retry == ["after"]


def start_into_decision(input_type: Any) -> Graph:
    """start -> loop; loop -> (> 10) after | bump -> loop: ``loop``'s edges come from the start and a step."""
    g = _builder(input_type)

    @g.step
    async def bump(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "bump", int(ctx.inputs) + 4)

    @g.step
    async def after(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "after", ctx.inputs)

    loop = (
        g.decision(node_id="loop")
        .branch(g.match(int, matches=lambda n: isinstance(n, int) and n > 10).to(after))
        .branch(g.match(object).to(bump))
    )
    g.add(g.edge_from(g.start_node).to(loop), g.edge_from(bump).to(loop), g.edge_from(after).to(g.end_node))
    return g.build()


async def test_an_edge_from_the_start_carries_the_graphs_input_type(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, start_into_decision(int), "after", inputs=5, provider=provider, exporter=exporter
    )
    assert trail.first == ["bump", "bump", "after"]
    assert trail.retry == ["after"]


async def test_edges_that_carry_different_types_leave_a_decision_untyped(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with pytest.warns(
        UntypedNodeWarning, match="'loop' \\(the edges into it carry different types: int, str\\)"
    ):
        trail = await fail_then_retry(
            tmp_path, start_into_decision(str), "after", inputs="5", provider=provider, exporter=exporter
        )
    assert trail.retry == ["bump", "bump", "after"]
    assert {
        e["streamledger.checkpoint.reason"] for e in events(trail.spans, "streamledger.checkpoint.skipped")
    } == {"untyped"}


def join_into_decision() -> Graph:
    """start -> spread -> map -> double -> total (join) -> loop; bump -> loop; loop -> after | bump."""
    g = _builder()

    @g.step
    async def spread(ctx: StepContext[Log, Calls, int]) -> list[int]:
        return enter(ctx, "spread", [ctx.inputs, 1])

    @g.step
    async def double(ctx: StepContext[Log, Calls, int]) -> int:
        return 2 * ctx.inputs

    @g.step
    async def bump(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "bump", ctx.inputs + 4)

    @g.step
    async def after(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "after", ctx.inputs)

    total = g.join(reduce_sum, initial=0, node_id="total")
    loop = (
        g.decision(node_id="loop")
        .branch(g.match(int, matches=lambda n: n > 20).to(after))
        .branch(g.match(int).to(bump))
    )
    g.add(
        g.edge_from(g.start_node).to(spread),
        g.edge_from(spread).map().to(double),
        g.edge_from(double).to(total),
        g.edge_from(total).to(loop),
        g.edge_from(bump).to(loop),
        g.edge_from(after).to(g.end_node),
    )
    return g.build()


async def test_an_edge_from_a_join_leaves_a_decision_untyped(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with pytest.warns(UntypedNodeWarning, match="'loop' \\(the edge from the join 'total' carries"):
        trail = await fail_then_retry(
            tmp_path, join_into_decision(), "after", inputs=5, provider=provider, exporter=exporter
        )
    assert trail.first == ["spread", "bump", "bump", "bump", "after"]  # (5 + 1) * 2 = 12, 16, 20, 24
    # Resumed before the fork (after spread), not before the decision after any bump.
    assert trail.retry == ["bump", "bump", "bump", "after"]
    assert trail.result.output == 24
