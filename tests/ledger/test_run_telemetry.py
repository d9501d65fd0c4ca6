"""Runs of ``ledger.run`` traced and metered, read back with the OpenTelemetry SDK's in-memory exporter
and reader: a span per run and per node attempt, and series that do not grow with the number of runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ledger import open_ledger
from streams import Execution, Graph, Key, MessageTx, NodeContext, Retry, Stream
from tests.conftest import Metrics

pytestmark = pytest.mark.anyio

RUNS = 100


def shop_graph(name: str) -> Graph:
    """A writer, a reader handling its stream, and a node whose first attempt always fails."""
    orders, total, stamped = Key("orders", Stream[int]), Key("total", int), Key("stamped", bool)
    graph = Graph(name, version="1")

    @graph.node(provides=[orders])
    async def shop(ctx: NodeContext) -> None:
        for i in range(3):
            await ctx.writer(orders).send(i)

    @graph.node(requires=[orders], provides=[total])
    async def count(ctx: NodeContext) -> None:
        async def add(tx: MessageTx[int], value: int) -> None:
            tx.set_state(tx.state + value)
            tx.set(total, tx.state)

        await ctx.handle_messages(orders, add, initial_state=0)

    @graph.node(requires=[total], provides=[stamped], aspects=[Retry(2)])
    async def stamp(ctx: NodeContext) -> None:
        if ctx.attempt == 0:
            raise ConnectionError("the stamping service hung up")
        ctx.set(stamped, True)

    return graph


def spans_of(spans: InMemorySpanExporter, run: ReadableSpan) -> Iterator[ReadableSpan]:
    """The spans under ``run``, at any depth."""
    finished = spans.get_finished_spans()
    under = {run.context.span_id}
    for candidate in sorted(finished, key=lambda s: s.start_time or 0):
        if candidate.parent is not None and candidate.parent.span_id in under:
            under.add(candidate.context.span_id)
            yield candidate


async def test_a_hundred_runs_make_a_span_each_with_node_attempts_and_no_new_series(
    spans: InMemorySpanExporter, metrics_now: Metrics, tmp_path: Path, anyio_backend: str
) -> None:
    name = f"shop-{anyio_backend}"
    graph = shop_graph(name)
    async with open_ledger(tmp_path / "ledger") as ledger:
        await ledger.run(graph, {}, run_id=f"order-{anyio_backend}-0")
        after_one = metrics_now.series()
        for i in range(1, RUNS):
            await ledger.run(graph, {}, run_id=f"order-{anyio_backend}-{i}")
        after_all = metrics_now.series()
    assert after_all == after_one  # not one series more for 99 more runs
    assert not [s for s in after_all if any(f"order-{anyio_backend}" in str(v) for _, v in s[1])]

    finished = spans.get_finished_spans()
    assert not [s.name for s in finished if "order-" in s.name]  # a run id is never in a span's name
    runs = [s for s in finished if s.name == f"invoke_graph {name}"]
    assert len(runs) == RUNS
    assert {dict(s.attributes or {})["streamledger.graph.run_id"] for s in runs} == {
        f"order-{anyio_backend}-{i}" for i in range(RUNS)
    }
    for run in runs:
        attributes = dict(run.attributes or {})
        assert attributes["streamledger.graph.name"] == name
        assert attributes["streamledger.graph.version"] == "1"
        assert (attributes["streamledger.graph.attempt"], attributes["streamledger.run.resumed"]) == (
            1,
            False,
        )
        assert run.status.status_code is StatusCode.UNSET
        under = list(spans_of(spans, run))
        nodes = [s for s in under if s.name.startswith("execute_node ")]
        assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in nodes)
        assert [s.name for s in nodes if s.name != "execute_node stamp"] == [
            "execute_node shop",
            "execute_node count",
        ]
        # the retried node: one span per attempt, the failed one marked by its error's type only
        first, second = [s for s in nodes if s.name == "execute_node stamp"]
        for attempt, span in enumerate((first, second)):
            node = dict(span.attributes or {})
            assert node["streamledger.graph.run_id"] == attributes["streamledger.graph.run_id"]
            assert (node["streamledger.graph.node_id"], node["streamledger.node.attempt"]) == (
                "stamp",
                attempt,
            )
        assert first.status.status_code is StatusCode.ERROR
        assert dict(first.attributes or {})["error.type"] == "ConnectionError"
        assert dict(first.attributes or {})["streamledger.node.status"] == "failed"
        assert second.status.status_code is StatusCode.UNSET
        assert dict(second.attributes or {})["streamledger.node.status"] == "completed"
        # the handler's span is under its node's attempt, named by the stream's template
        (process,) = [s for s in under if s.name.startswith("process ")]
        assert process.name == "process {run_id}/shop/orders"
        (count,) = [s for s in nodes if s.name == "execute_node count"]
        assert process.parent is not None and process.parent.span_id == count.context.span_id
        assert dict(process.attributes or {})["messaging.destination.name"] == (
            f"{attributes['streamledger.graph.run_id']}/shop/orders"
        )
    dumped = repr([(s.name, s.attributes, [(e.name, e.attributes) for e in s.events]) for s in finished])
    assert "hung up" not in dumped  # never an error's message


async def test_a_failed_run_shows_each_failed_attempt_and_its_resume_is_another_attempt_of_the_run(
    spans: InMemorySpanExporter, tmp_path: Path, anyio_backend: str
) -> None:
    name = f"broken-{anyio_backend}"
    graph = Graph(name, version="2")
    fixed = False

    @graph.node(aspects=[Retry(2)])
    async def charge(ctx: NodeContext) -> None:
        if not fixed:
            raise ValueError("card 4111 declined")

    async with open_ledger(tmp_path / "ledger") as ledger:
        with pytest.raises(ValueError):
            await ledger.start(graph, {}, run_id="charge-1")
    (run,) = [s for s in spans.get_finished_spans() if s.name == f"invoke_graph {name}"]
    assert run.status.status_code is StatusCode.ERROR
    assert dict(run.attributes or {})["error.type"] == "ValueError"
    attempts = [s for s in spans_of(spans, run) if s.name == "execute_node charge"]
    assert [dict(s.attributes or {})["streamledger.node.attempt"] for s in attempts] == [0, 1]
    assert all(s.status.status_code is StatusCode.ERROR for s in attempts)
    assert "4111" not in repr(
        [(s.name, s.attributes, s.status.description) for s in spans.get_finished_spans()]
    )


async def test_an_execution_under_no_recording_span_makes_no_node_span(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    seen: list[bool] = []
    graph = Graph("untraced", version="1")

    @graph.node()
    async def look(ctx: NodeContext) -> None:
        seen.append(trace.get_current_span().is_recording())

    async with Execution(graph) as execution:  # nothing traces it: no span is made for its nodes
        await execution.wait()
    async with open_ledger(tmp_path / "ledger") as ledger:  # a run's span: its nodes get theirs
        await ledger.run(graph, {}, run_id="traced")
    assert seen == [False, True]
    assert [s.name for s in spans.get_finished_spans() if s.name == "execute_node look"] == [
        "execute_node look"
    ]
