"""Graphs and helpers shared by the durable-graph tests (and the crash test's child process)."""

# mypy cannot read pydantic-graph's infer_variance type variables, so to mypy StepContext takes
# no type arguments; the step annotations below are what the runner reads at run time.
# mypy: disable-error-code="type-arg"

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_graph import Graph, GraphBuilder, StepContext

from ledger import Ledger, open_ledger
from ledger.graphs import DurableGraph, GraphRunResult

T = TypeVar("T")


class Boom(Exception):
    """A step failing on purpose."""


@dataclass
class Calls:
    """Deps of the test graphs: records each step that ran, and fails chosen steps once."""

    ran: list[str] = field(default_factory=list)
    fail_at: set[str] = field(default_factory=set)
    seen: list[Any] = field(default_factory=list)

    def enter(self, node: str, inputs: Any = None) -> None:
        self.ran.append(node)
        self.seen.append(inputs)
        if node in self.fail_at:
            self.fail_at.discard(node)
            raise Boom(node)


@dataclass
class Log:
    steps: list[str] = field(default_factory=list)


def enter(ctx: StepContext, node: str, result: T) -> T:
    """What every test step does first: record itself in deps and state (mypy sees neither's type)."""
    calls: Calls = ctx.deps
    log: Log = ctx.state
    calls.enter(node, ctx.inputs)
    log.steps.append(node)
    return result


def three_steps(name: str = "three") -> Graph:
    """5 -> one (+1) -> two (*2) -> three (-3) -> 9, logging each step in the state."""
    g = GraphBuilder(name=name, state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def one(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "one", ctx.inputs + 1)

    @g.step
    async def two(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "two", ctx.inputs * 2)

    @g.step
    async def three(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "three", ctx.inputs - 3)

    g.add(
        g.edge_from(g.start_node).to(one),
        g.edge_from(one).to(two),
        g.edge_from(two).to(three),
        g.edge_from(three).to(g.end_node),
    )
    return g.build()


@dataclass
class Retried:
    first: list[str]  # steps the failing attempt ran
    retry: list[str]  # steps the retry ran
    seen: list[Any]  # the inputs of the steps the retry ran
    result: GraphRunResult[Any, Any]
    spans: list[ReadableSpan]


async def fail_then_retry(
    path: Path,
    graph: Graph,
    fail_at: str,
    *,
    inputs: Any,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    state: Callable[[], Any] = Log,
    **options: Any,
) -> Retried:
    """Run ``graph`` with step ``fail_at`` failing once, then retry it; say what each attempt ran."""
    async with open_ledger(path) as ledger:
        runner = durable(graph, ledger, tracer_provider=provider, **options)
        calls = Calls(fail_at={fail_at})
        with pytest.raises(Boom):
            await runner.run("r", state=state(), inputs=inputs, deps=calls)
        first, calls.ran, calls.seen = calls.ran, [], []
        result = await runner.run("r", state=state(), inputs=inputs, deps=calls)
    return Retried(first, calls.ran, calls.seen, result, run_spans(exporter))


async def run_with_retry(
    durable: DurableGraph[Any, Calls, Any, Any],
    run_id: str,
    calls: Calls,
    *,
    state: Any = None,
    inputs: Any = None,
) -> GraphRunResult[Any, Any]:
    """Run until it succeeds, as a retrying caller would; a Boom is the only failure expected."""
    for _ in range(10):
        try:
            return await durable.run(run_id, state=state, inputs=inputs, deps=calls)
        except Boom:
            continue
    raise AssertionError("the run never succeeded")


def durable(graph: Graph, ledger: Ledger, **options: Any) -> DurableGraph[Any, Calls, Any, Any]:
    return DurableGraph[Any, Calls, Any, Any](graph, ledger, **options)


def run_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_graph")]


def events(spans: Sequence[ReadableSpan], name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for s in spans for e in s.events if e.name == name]
