"""Metrics through the OpenTelemetry API, read back with the SDK's in-memory reader.

Each test works in a scope of its own: the streams' names, and so the
metrics' attributes, are its own, whatever other tests recorded before.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ledger import open_ledger
from streams import (
    DeadLetter,
    ExecCheckpoint,
    Execution,
    Graph,
    Key,
    MemoryStore,
    MessageExhaustedError,
    MessageTx,
    NodeContext,
    Stream,
    StreamRef,
    StreamWriter,
    handle_messages,
    open_scope,
)
from streams.store import destination_template
from tests.conftest import Metrics

pytestmark = pytest.mark.anyio

NUMBERS = Key("numbers", Stream[int])
DOUBLED = Key("doubled", Stream[int])
SENT = "messaging.client.sent.messages"
CONSUMED = "messaging.client.consumed.messages"
DURATION = "messaging.client.operation.duration"


async def test_appends_commits_failures_batches_and_lag_are_counted_per_stream_and_group(
    metrics_now: Metrics, anyio_backend: str
) -> None:
    scope_name = f"metrics-{anyio_backend}"
    source, out = f"{scope_name}/src/numbers", f"{scope_name}/double/doubled"
    failed_once: set[int] = set()
    async with open_scope(MemoryStore(), scope=scope_name) as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        doubled = await scope.open_stream(DOUBLED, node="double", groups=("sink",))
        for i in range(10):
            await numbers.writer().send(i)
        await numbers.writer().finish()
        assert metrics_now.value(SENT, messaging__destination__name=source) == 10
        assert metrics_now.value("streamledger.consumer.lag", messaging__destination__name=source) == 10
        writer: StreamWriter[int] = doubled.writer()

        async def double(tx: MessageTx[None], value: int) -> None:
            if value == 3 and value not in failed_once:
                failed_once.add(value)
                raise ValueError("the first try of 3 fails")
            tx.send(writer, 2 * value)

        result = await handle_messages(numbers.reader("g"), double, attempts=2)
        assert result.handled == 10
        group = {"messaging__destination__name": source, "messaging__consumer__group__name": "g"}
        assert metrics_now.value(CONSUMED, **group) == 10
        # OpenTelemetry's consumed-messages metric requires its operation's name
        assert metrics_now.value(CONSUMED, **group, messaging__operation__name="process") == 10
        assert metrics_now.value(SENT, messaging__destination__name=out) == 10  # outputs, once committed
        assert (
            metrics_now.value("streamledger.message.failed_attempts", **group, error__type="ValueError") == 1
        )
        batches = metrics_now.value("streamledger.commit.batch.size", **group)
        assert batches.sum == 10 and 1 <= batches.count <= 10
        commits = metrics_now.value(DURATION, **group, messaging__operation__name="commit")
        assert commits.count == batches.count and commits.sum > 0
        appends = metrics_now.value(
            DURATION, messaging__destination__name=source, messaging__operation__name="append"
        )
        assert appends.count >= 1
        assert metrics_now.value("streamledger.consumer.lag", **group) == 0
        assert metrics_now.value("streamledger.consumer.lag", messaging__destination__name=out) == 10
    # the scope ended: its streams are no longer observed
    assert metrics_now.value("streamledger.consumer.lag", messaging__destination__name=out) is None


async def test_an_exhausted_message_is_counted_with_its_error_type(
    metrics_now: Metrics, anyio_backend: str
) -> None:
    scope_name = f"exhausted-{anyio_backend}"
    async with open_scope(MemoryStore(), scope=scope_name) as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        await numbers.writer().send(1)
        await numbers.writer().finish()

        async def broken(tx: MessageTx[None], value: int) -> None:
            raise KeyError("always")

        with pytest.raises(MessageExhaustedError):
            await handle_messages(numbers.reader("g"), broken, attempts=2)
    group = {
        "messaging__destination__name": f"{scope_name}/src/numbers",
        "messaging__consumer__group__name": "g",
    }
    assert metrics_now.value("streamledger.message.failed_attempts", **group, error__type="KeyError") == 2
    assert metrics_now.value("streamledger.message.exhausted", **group, error__type="KeyError") == 1
    assert metrics_now.value(CONSUMED, **group) is None  # nothing was handled


async def test_a_readers_acks_are_counted_consumed_by_the_ack_operation(
    metrics_now: Metrics, anyio_backend: str
) -> None:
    scope_name = f"metrics-acks-{anyio_backend}"
    async with open_scope(MemoryStore(), scope=scope_name) as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("r",))
        for i in range(3):
            await numbers.writer().send(i)
        reader = numbers.reader("r")
        for seq in (1, 2):
            await reader.receive()
            await reader.ack(seq)
    group = {
        "messaging__destination__name": f"{scope_name}/src/numbers",
        "messaging__consumer__group__name": "r",
    }
    assert metrics_now.value(CONSUMED, **group, messaging__operation__name="ack") == 2
    assert metrics_now.value(CONSUMED, **group, messaging__operation__name="process") is None


async def test_a_dead_lettered_message_is_counted_as_exhausted_dead_lettered_and_consumed(
    metrics_now: Metrics, anyio_backend: str
) -> None:
    scope_name = f"dead-{anyio_backend}"
    async with open_scope(MemoryStore(), scope=scope_name) as scope:
        numbers = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        dead = await scope.open_stream(Key("dead", Stream[DeadLetter[int]]), node="src", groups=("ops",))
        await numbers.writer().send(1)
        await numbers.writer().finish()

        async def broken(tx: MessageTx[None], value: int) -> None:
            raise KeyError("always")

        await handle_messages(numbers.reader("g"), broken, attempts=2, dead_letter=dead.writer())
        await dead.writer().finish()
    group = {
        "messaging__destination__name": f"{scope_name}/src/numbers",
        "messaging__consumer__group__name": "g",
    }
    assert metrics_now.value("streamledger.message.exhausted", **group, error__type="KeyError") == 1
    assert metrics_now.value("streamledger.message.dead_lettered", **group) == 1
    assert metrics_now.value(CONSUMED, **group) == 1  # acknowledged: the group moved on
    assert metrics_now.value(SENT, messaging__destination__name=f"{scope_name}/src/dead") == 1


async def test_nodes_executions_and_ledger_batches_are_counted(
    metrics_now: Metrics, tmp_path: Path, anyio_backend: str
) -> None:
    name = f"metered-{anyio_backend}"
    n, total = Key("n", int), Key("total", int)
    graph = Graph(name, version="1", inputs=[n])

    @graph.node(requires=[n], provides=[total])
    async def add(ctx: NodeContext) -> None:
        ctx.set(total, ctx[n] + 1)

    @graph.node(requires=[total])
    async def skip_nothing(ctx: NodeContext) -> None:
        pass

    async with open_ledger(tmp_path / name) as ledger:
        outcome = await ledger.run(graph, {n: 1}, run_id="r")
    assert outcome.result[total] == 2
    nodes = {"streamledger__graph__name": name, "streamledger__node__status": "completed"}
    assert metrics_now.value("streamledger.nodes", **nodes) == 2
    done = {"streamledger__graph__name": name, "streamledger__execution__status": "completed"}
    assert metrics_now.value("streamledger.executions", **done) == 1
    writes = metrics_now.value("streamledger.ledger.batch.writes", streamledger__ledger=name)
    assert writes.count >= 1 and writes.sum >= 2  # at least the two node records
    landed = metrics_now.value("streamledger.ledger.commit.duration", streamledger__ledger=name)
    assert landed.count == writes.count and landed.sum > 0


async def test_an_executions_stream_lag_is_observed_while_its_reader_runs_and_not_after_it_concluded(
    metrics_now: Metrics, anyio_backend: str
) -> None:
    orders = Key(f"orders_{anyio_backend}", Stream[int])
    destination = f"execution/shop/orders_{anyio_backend}"
    graph = Graph(f"lagging-{anyio_backend}", version="1")
    lags: list[object] = []

    @graph.node(provides=[orders])
    async def shop(ctx: NodeContext) -> None:
        for i in range(3):
            await ctx.writer(orders).send(i)
        await ctx.writer(orders).flush()
        lags.append(metrics_now.value("streamledger.consumer.lag", messaging__destination__name=destination))

    @graph.node(requires=[orders])
    async def count(ctx: NodeContext) -> None:
        async def ack(tx: MessageTx[None], value: int) -> None:
            pass

        await ctx.handle_messages(orders, ack)

    execution = Execution(graph)
    async with execution:
        await execution.wait()
    assert lags and lags[0] is not None  # observed while the reader had messages to handle
    # a concluded reader leaves its group (it no longer holds the writer back), so no lag is left
    assert metrics_now.value("streamledger.consumer.lag", messaging__destination__name=destination) is None


def test_the_library_records_metrics_without_the_sdk() -> None:
    script = (
        "import sys, streams, ledger\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'the SDK was imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parent)


def test_a_runs_stream_template_takes_out_the_run_id_and_the_attempts_of_the_mounts_above_it() -> None:
    run = "order/42"  # a run id may hold '/'
    # the scopes the store's rules give: a mount's complete-chain attempt, its Retry's attempts, its child
    child = f"{run}/pack@0.1.0/pack"
    retried = f"{run}/pack@0.1.0/pack@1.3.2/pack"
    nested = f"{child}/box@0.1.0/box"
    assert destination_template(StreamRef(run, "shop", "orders"), run) == "{run_id}/shop/orders"
    assert destination_template(StreamRef(child, "fill", "items"), run) == "{run_id}/pack/fill/items"
    assert destination_template(StreamRef(retried, "fill", "items"), run) == "{run_id}/pack/fill/items"
    assert destination_template(StreamRef(nested, "tape", "rolls#3"), run) == "{run_id}/pack/box/tape/rolls#3"
    assert destination_template(StreamRef("order/43", "shop", "orders"), run) is None  # another run
    assert destination_template(StreamRef(f"{run}/stray", "shop", "orders"), run) is None  # not a child scope


async def test_a_runs_streams_are_counted_by_their_template_never_by_the_run_id(
    metrics_now: Metrics, anyio_backend: str
) -> None:
    orders = Key("orders", Stream[int])
    inner = Graph(f"packing-{anyio_backend}", version="1", inputs=[orders])

    @inner.node(requires=[orders])
    async def count(ctx: NodeContext) -> None:
        async def ack(tx: MessageTx[None], value: int) -> None:
            pass

        await ctx.handle_messages(orders, ack)

    graph = Graph(f"templated-{anyio_backend}", version="1")

    @graph.node(provides=[orders])
    async def shop(ctx: NodeContext) -> None:
        for i in range(3):
            await ctx.writer(orders).send(i)

    graph.sub("pack", inner, inlets={orders: orders})
    store = MemoryStore()
    for run_id in ("templated-run-1", "templated-run-2"):
        async with Execution(graph, checkpoint=ExecCheckpoint(run_id, store)) as execution:
            await execution.wait()
    template = {
        "messaging__destination__template": "{run_id}/shop/orders",
        "streamledger__graph__name": graph.name,
    }
    assert metrics_now.value(SENT, **template) == 6  # both runs: one series
    consumed = metrics_now.value(CONSUMED, **template, messaging__consumer__group__name="pack/count")
    assert consumed == 6
    named = [
        attributes
        for name in (SENT, CONSUMED, DURATION, "streamledger.commit.batch.size")
        for attributes, _ in metrics_now.points(name)
        if any("templated-run" in str(value) for value in attributes.values())
    ]
    assert named == []  # no series names a run
