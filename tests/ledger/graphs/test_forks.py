"""Checkpoints only at quiescent boundaries: never inside a fork, again after its join."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_graph import Fork, Graph, GraphBuilder, StepContext, reduce_list_append

from ledger._graph_runs import SavedForkFrame, SavedTask
from ledger.graphs._checkpoint import task_request
from ledger.graphs._fingerprint import graph_fingerprint

from .graphs import Calls, Log, enter, events, fail_then_retry


def mapped(items: int, parent: Literal["farthest", "closest"]) -> Graph:
    """start -> spread -> map(double -> inc) -> collect -> total -> final -> end."""
    g = GraphBuilder(name="mapped", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def spread(ctx: StepContext[Log, Calls, int]) -> list[int]:
        return enter(ctx, "spread", [ctx.inputs + i for i in range(items)])

    @g.step
    async def double(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, f"double {ctx.inputs}", 2 * ctx.inputs)

    @g.step
    async def inc(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, f"inc {ctx.inputs}", ctx.inputs + 1)

    @g.step
    async def total(ctx: StepContext[Log, Calls, list[int]]) -> int:
        return enter(ctx, "total", sum(ctx.inputs))

    @g.step
    async def final(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "final", ctx.inputs + 1)

    collect = g.join(
        reduce_list_append, initial_factory=list[int], node_id="collect", preferred_parent_fork=parent
    )
    g.add(
        g.edge_from(g.start_node).to(spread),
        g.edge_from(spread).map(fork_id="fan").to(double),
        g.edge_from(double).to(inc),
        g.edge_from(inc).to(collect),
        g.edge_from(collect).to(total),
        g.edge_from(total).to(final),
        g.edge_from(final).to(g.end_node),
    )
    return g.build()


@pytest.mark.parametrize("failing", ["double 5", "inc 10"])
@pytest.mark.parametrize("parent", ["farthest", "closest"])
@pytest.mark.parametrize("items", [1, 2])
async def test_a_run_failing_inside_a_map_resumes_from_before_the_fork(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    items: int,
    parent: str,
    failing: str,
) -> None:
    graph = mapped(items, parent)  # type: ignore[arg-type]
    trail = await fail_then_retry(tmp_path, graph, failing, inputs=5, provider=provider, exporter=exporter)
    assert "spread" not in trail.retry
    inside = [f"double {5 + i}" for i in range(items)] + [f"inc {2 * (5 + i)}" for i in range(items)]
    assert sorted(trail.retry) == sorted([*inside, "total", "final"])
    assert trail.result.output == sum(2 * (5 + i) + 1 for i in range(items)) + 1
    saved = events(trail.spans, "streamledger.checkpoint.saved")
    assert {e["streamledger.graph.node_id"] for e in saved} <= {"spread", "total", "final", "__end__"}


@pytest.mark.parametrize("parent", ["farthest", "closest"])
async def test_boundaries_after_the_join_are_saved_again(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter, parent: str
) -> None:
    graph = mapped(2, parent)  # type: ignore[arg-type]
    trail = await fail_then_retry(tmp_path, graph, "final", inputs=5, provider=provider, exporter=exporter)
    assert trail.retry == ["final"]
    assert trail.result.output == 25
    assert sorted(trail.result.state.steps) == [
        "double 5",
        "double 6",
        "final",
        "inc 10",
        "inc 12",
        "spread",
        "total",
    ]


def broadcast() -> Graph:
    """start -> split -> (left, right) -> both (join) -> final -> end."""
    g = GraphBuilder(name="broadcast", state_type=Log, deps_type=Calls, input_type=int, output_type=list[int])

    @g.step
    async def split(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "split", ctx.inputs)

    @g.step
    async def left(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "left", ctx.inputs - 1)

    @g.step
    async def right(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "right", ctx.inputs + 1)

    @g.step
    async def final(ctx: StepContext[Log, Calls, list[int]]) -> list[int]:
        return enter(ctx, "final", sorted(ctx.inputs))

    both = g.join(reduce_list_append, initial_factory=list[int], node_id="both")
    g.add(
        g.edge_from(g.start_node).to(split),
        g.edge_from(split).to(left, right),
        g.edge_from(left, right).to(both),
        g.edge_from(both).to(final),
        g.edge_from(final).to(g.end_node),
    )
    return g.build()


async def test_a_run_failing_inside_a_broadcast_resumes_from_before_the_fork(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, broadcast(), "right", inputs=5, provider=provider, exporter=exporter
    )
    assert sorted(trail.retry) == ["final", "left", "right"]
    assert trail.result.output == [4, 6]


def unjoined() -> Graph:
    """start -> spread -> map(inside) -> after -> end: a fork whose copies never meet again."""
    g = GraphBuilder(name="unjoined", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def spread(ctx: StepContext[Log, Calls, int]) -> list[int]:
        return enter(ctx, "spread", [ctx.inputs])

    @g.step
    async def inside(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "inside", ctx.inputs + 1)

    @g.step
    async def after(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "after", ctx.inputs + 1)

    g.add(
        g.edge_from(g.start_node).to(spread),
        g.edge_from(spread).map().to(inside),
        g.edge_from(inside).to(after),
        g.edge_from(after).to(g.end_node),
    )
    return g.build()


async def test_no_checkpoint_is_taken_under_a_fork_without_a_join(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, unjoined(), "after", inputs=5, provider=provider, exporter=exporter
    )
    assert trail.retry == ["inside", "after"]  # resumed before the fork, not after `inside`
    assert trail.result.output == 7


def looping_fork() -> Graph:
    """start -> spread -> map(double) -> collect (closest parent) -> check; check -> spread | final.

    A resumed run enters the fork again with fork stacks carried over from the run before.
    """
    g = GraphBuilder(name="looping", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def spread(ctx: StepContext[Log, Calls, int]) -> list[int]:
        return enter(ctx, "spread", [ctx.inputs, ctx.inputs])

    @g.step
    async def double(ctx: StepContext[Log, Calls, int]) -> int:
        return 2 * ctx.inputs

    @g.step
    async def total(ctx: StepContext[Log, Calls, list[int]]) -> int:
        return enter(ctx, "total", sum(ctx.inputs))

    @g.step
    async def final(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "final", ctx.inputs)

    collect = g.join(reduce_list_append, initial_factory=list[int], preferred_parent_fork="closest")
    check = (
        g.decision(node_id="check")
        .branch(g.match(int, matches=lambda n: n > 100).to(final))
        .branch(g.match(int).to(spread))
    )
    g.add(
        g.edge_from(g.start_node).to(spread),
        g.edge_from(spread).map().to(double),
        g.edge_from(double).to(collect),
        g.edge_from(collect).to(total),
        g.edge_from(total).to(check),
        g.edge_from(final).to(g.end_node),
    )
    return g.build()


async def test_a_resumed_run_passes_through_forks_again_with_carried_fork_stacks(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # 5 -> 20 -> 80 -> 320: the second `total` fails once, and the retry resumes before `check`.
    trail = await fail_then_retry(
        tmp_path, looping_fork(), "total", inputs=5, provider=provider, exporter=exporter
    )
    assert trail.first == ["spread", "total"]
    assert trail.retry == ["total", "spread", "total", "spread", "total", "final"]
    assert trail.result.output == 320


def test_carried_fork_stack_ids_are_prefixed_with_the_attempt() -> None:
    saved = SavedTask(
        "final", b"1", (SavedForkFrame("__start__", "task:0", 0), SavedForkFrame("fan", "task:3", 1))
    )
    request = task_request(saved, 1, attempt=4)
    assert [(f.fork_id, f.node_run_id, f.thread_index) for f in request.fork_stack] == [
        ("__start__", "a4.task:0", 0),
        ("fan", "a4.task:3", 1),
    ]


def test_a_broadcasts_fingerprint_does_not_depend_on_the_order_its_paths_are_stored_in() -> None:
    # pydantic-graph 2.61 and earlier store a broadcast's paths reversed; 2.62 and later in order.
    graph = broadcast()
    (fork_id,) = [node_id for node_id, node in graph.nodes.items() if isinstance(node, Fork)]
    assert len(graph.edges_by_source[fork_id]) == 2
    reordered = dataclasses.replace(
        graph,
        edges_by_source={**graph.edges_by_source, fork_id: list(reversed(graph.edges_by_source[fork_id]))},
    )
    assert graph_fingerprint(reordered) == graph_fingerprint(graph)
