"""Checkpoints that cannot be resumed start the run over and say why on the run's span."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from pydantic_graph import Graph, GraphBuilder, StepContext

from ledger import CorruptRecordError, Ledger, open_ledger
from ledger._graph_runs import FORMAT_VERSION, GraphCheckpoint
from ledger.graphs import UntypedNodeWarning
from ledger.lmdb._graph_runs import checkpoint_key
from ledger.lmdb._seal import seal

from .graphs import Boom, Calls, Log, durable, enter, events, run_spans, three_steps

DISCARDED = "streamledger.checkpoint.discarded"


async def fail_at(ledger: Ledger, graph: Graph, step: str, **kwargs: Any) -> None:
    with pytest.raises(Boom):
        await durable(graph, ledger).run("r", deps=Calls(fail_at={step}), **kwargs)


async def rerun(
    ledger: Ledger, graph: Graph, provider: TracerProvider, **kwargs: Any
) -> tuple[list[str], Any]:
    calls = Calls()
    result = await durable(graph, ledger, tracer_provider=provider).run("r", deps=calls, **kwargs)
    return calls.ran, result


def discarded(exporter: InMemorySpanExporter) -> list[dict[str, Any]]:
    (span,) = run_spans(exporter)
    assert span.name == "invoke_graph three" or span.name.startswith("invoke_graph")
    return events([span], DISCARDED)


async def overwrite_checkpoint(ledger: Ledger, value: bytes) -> None:
    db = ledger.backend.env.db("graph_runs")

    def write(txn: lmdb.Transaction) -> None:
        txn.put(checkpoint_key("r"), value, db=db)

    await ledger.backend.env.write(write)


def stored_checkpoint(ledger: Ledger) -> GraphCheckpoint:
    with ledger.backend.env.read() as txn:
        raw = txn.get(checkpoint_key("r"), db=ledger.backend.env.db("graph_runs"))
    assert raw is not None
    return msgspec.msgpack.decode(bytes(raw)[4:], type=GraphCheckpoint)


async def test_checkpoints_are_written_in_format_version_1(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, three_steps(), "three", state=Log(), inputs=5)
        assert FORMAT_VERSION == 1
        assert stored_checkpoint(ledger).format_version == 1


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x93\x01\x02\x03", id="not-a-checkpoint"),
        pytest.param(
            msgspec.msgpack.encode({"format_version": 2, "anything": "else"}), id="format-version-2"
        ),
    ],
)
async def test_a_checkpoint_of_another_format_starts_over(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter, body: bytes
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, three_steps(), "three", state=Log(), inputs=5)
        await overwrite_checkpoint(ledger, seal("graph_runs", checkpoint_key("r"), body))
        ran, result = await rerun(ledger, three_steps(), provider, state=Log(), inputs=5)
    assert ran == ["one", "two", "three"]
    assert result.output == 9
    assert discarded(exporter) == [{"streamledger.checkpoint.reason": "format"}]


async def test_a_damaged_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, three_steps(), "three", state=Log(), inputs=5)
        good = stored_checkpoint(ledger)
        await overwrite_checkpoint(ledger, b"\x00\x00\x00\x00" + msgspec.msgpack.encode(good))
        calls = Calls()
        with pytest.raises(CorruptRecordError, match="graph_runs"):
            await durable(three_steps(), ledger).run("r", state=Log(), inputs=5, deps=calls)
        assert calls.ran == []


def three_steps_with_another_two() -> Graph:
    g = GraphBuilder(name="three", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def one(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "one", ctx.inputs + 1)

    @g.step(node_id="two")
    async def two_rewritten(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "two", ctx.inputs * 2)

    @g.step
    async def three(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "three", ctx.inputs - 3)

    g.add(
        g.edge_from(g.start_node).to(one),
        g.edge_from(one).to(two_rewritten),
        g.edge_from(two_rewritten).to(three),
        g.edge_from(three).to(g.end_node),
    )
    return g.build()


async def test_a_checkpoint_of_a_graph_whose_nodes_changed_starts_over(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, three_steps(), "three", state=Log(), inputs=5)
        ran, result = await rerun(ledger, three_steps_with_another_two(), provider, state=Log(), inputs=5)
    assert ran == ["one", "two", "three"]
    assert result.output == 9
    assert discarded(exporter) == [{"streamledger.checkpoint.reason": "graph_changed"}]


def two_decisions(order: str) -> Graph:
    """Two unnamed decisions: the builder numbers their ids in the order they are added."""
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def small(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "small", ctx.inputs + 100)

    @g.step
    async def large(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "large", ctx.inputs - 100)

    @g.step
    async def first(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "first", ctx.inputs)

    @g.step
    async def last(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "last", ctx.inputs)

    to_small = g.decision().branch(g.match(int).to(small))
    to_large = g.decision().branch(g.match(int).to(large))
    edges = {
        "small": g.edge_from(first).to(to_small),
        "large": g.edge_from(small).to(to_large),
    }
    g.add(g.edge_from(g.start_node).to(first))
    for name in order.split():
        g.add(edges[name])
    g.add(g.edge_from(large).to(last), g.edge_from(last).to(g.end_node))
    return g.build()


async def test_node_ids_the_builder_invents_in_another_order_count_as_a_changed_graph(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    before, after = two_decisions("small large"), two_decisions("large small")
    assert set(before.nodes) == set(after.nodes)  # same ids, on other nodes
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, before, "small", state=Log(), inputs=5)
        ran, result = await rerun(ledger, after, provider, state=Log(), inputs=5)
    assert ran == ["first", "small", "large", "last"]
    assert result.output == 5
    assert discarded(exporter) == [{"streamledger.checkpoint.reason": "graph_changed"}]


def step_into_decision(transform: bool) -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def first(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "first", ctx.inputs)

    @g.step
    async def after(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "after", ctx.inputs)

    decide = g.decision(node_id="decide").branch(g.match(int).to(after))
    edge = g.edge_from(first)
    if transform:
        edge = edge.transform(lambda ctx: ctx.inputs)
    g.add(g.edge_from(g.start_node).to(first), edge.to(decide), g.edge_from(after).to(g.end_node))
    return g.build()


async def test_a_checkpoint_whose_next_node_lost_its_type_starts_over(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, step_into_decision(False), "after", state=Log(), inputs=5)
        with pytest.warns(UntypedNodeWarning, match="'decide' \\(the edge from 'first' transforms its value"):
            ran, result = await rerun(ledger, step_into_decision(True), provider, state=Log(), inputs=5)
    assert ran == ["first", "after"]
    assert result.output == 5
    assert discarded(exporter) == [{"streamledger.checkpoint.reason": "untyped"}]


class AccountV1(BaseModel):
    owner: str


class AccountV2(BaseModel):
    owner: str
    email: str  # a required field added between deploys


class BookV1(BaseModel):
    accounts: dict[str, AccountV1] = {}
    steps: list[str] = []


class BookV2(BaseModel):
    accounts: dict[str, AccountV2] = {}
    steps: list[str] = []


def book_graph(state_type: type[BaseModel]) -> Graph:
    g = GraphBuilder(name="g", state_type=state_type, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def open_account(ctx: StepContext[Any, Calls, int]) -> int:
        calls: Calls = ctx.deps
        calls.enter("open_account")
        book: Any = ctx.state
        if state_type is BookV1:
            book.accounts["acct-7731-private"] = AccountV1(owner="Ada Secret")
        else:
            book.accounts["acct-7731-private"] = AccountV2(owner="Ada Secret", email="ada@example.com")
        return ctx.inputs

    @g.step
    async def close(ctx: StepContext[Any, Calls, int]) -> int:
        calls: Calls = ctx.deps
        calls.enter("close")
        return ctx.inputs

    g.add(g.edge_from(g.start_node).to(open_account), g.edge_from(open_account).to(close))
    g.add(g.edge_from(close).to(g.end_node))
    return g.build()


async def test_a_checkpoint_that_no_longer_validates_starts_over_and_says_where_without_values(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await fail_at(ledger, book_graph(BookV1), "close", state=BookV1(), inputs=5)
        ran, result = await rerun(ledger, book_graph(BookV2), provider, state=BookV2(), inputs=5)
    assert ran == ["open_account", "close"]
    assert result.state.accounts["acct-7731-private"].email == "ada@example.com"
    (event,) = discarded(exporter)
    assert event["streamledger.checkpoint.reason"] == "invalid"
    error = event["streamledger.checkpoint.error"]
    assert error == "state: missing at accounts.*.email"
    for value in ("acct-7731-private", "Ada Secret"):
        assert value not in error
