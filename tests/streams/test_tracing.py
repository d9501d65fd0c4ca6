"""Spans and events of the engine: recoveries, handler runs, exhausted budgets; never values."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from ledger import open_ledger
from streams import (
    DeadLetter,
    Key,
    MemoryStore,
    MessageExhaustedError,
    MessageTx,
    Stream,
    handle_messages,
    open_scope,
)

SECRETS = Key("secrets", Stream[str])


async def test_exhausted_budget_leaves_an_event_without_the_payload(spans: InMemorySpanExporter) -> None:
    store = MemoryStore()
    async with open_scope(store, scope="t") as scope:
        stream = await scope.open_stream(SECRETS, node="src", groups=("g",))
        await stream.writer().send("card 4111-1111")
        await stream.writer().finish()

        async def fail(tx: MessageTx[None], value: str) -> None:
            raise ValueError("declined")

        with pytest.raises(MessageExhaustedError):
            await handle_messages(stream.reader("g"), fail, attempts=2)
    events = [e for s in spans.get_finished_spans() for e in s.events]
    exhausted = [e for e in events if e.name == "streamledger.budget.exhausted"]
    assert len(exhausted) == 1
    attributes = dict(exhausted[0].attributes or {})
    assert attributes["streamledger.seq"] == 1
    assert attributes["streamledger.attempts"] == 2
    assert attributes["streamledger.error.type"] == "ValueError"
    dumped = repr(
        [
            (s.name, s.attributes, [(e.name, e.attributes) for e in s.events])
            for s in spans.get_finished_spans()
        ]
    )
    assert "4111" not in dumped and "declined" not in dumped


async def test_a_dead_letter_leaves_an_event_naming_its_stream_without_the_payload(
    spans: InMemorySpanExporter,
) -> None:
    async with open_scope(MemoryStore(), scope="t-dead") as scope:
        stream = await scope.open_stream(SECRETS, node="src", groups=("g",))
        dead = await scope.open_stream(Key("dead", Stream[DeadLetter[str]]), node="src", groups=("ops",))
        await stream.writer().send("card 4111-1111")
        await stream.writer().finish()

        async def fail(tx: MessageTx[None], value: str) -> None:
            raise ValueError("declined")

        await handle_messages(stream.reader("g"), fail, attempts=1, dead_letter=dead.writer())
        await dead.writer().finish()
    events = [e for s in spans.get_finished_spans() for e in s.events]
    [letter] = [dict(e.attributes or {}) for e in events if e.name == "streamledger.message.dead_lettered"]
    assert letter == {
        "streamledger.seq": 1,
        "streamledger.attempts": 1,
        "streamledger.error.type": "ValueError",
        "streamledger.dead_letter": "t-dead/src/dead",
    }
    dumped = repr(
        [
            (s.name, s.attributes, [(e.name, e.attributes) for e in s.events])
            for s in spans.get_finished_spans()
        ]
    )
    assert "4111" not in dumped and "declined" not in dumped


async def test_reopening_a_stream_records_a_recovery(spans: InMemorySpanExporter) -> None:
    store = MemoryStore()
    for _ in range(2):
        async with open_scope(store, scope="t") as scope:
            stream = await scope.open_stream(SECRETS, node="src", groups=("g",), resumable=True)
            await stream.writer().send("x")
            await stream.writer().flush()
    opens = [s for s in spans.get_finished_spans() if s.name == "streamledger.open_stream"]
    assert [dict(s.attributes or {})["streamledger.generation"] for s in opens] == [1, 2]
    assert [[e.name for e in s.events] for s in opens] == [[], ["streamledger.stream.recovered"]]
    assert dict(opens[1].attributes or {})["streamledger.tail"] == 1


async def test_handler_run_span_counts_handled_messages(spans: InMemorySpanExporter) -> None:
    async with open_scope(MemoryStore(), scope="t") as scope:
        stream = await scope.open_stream(SECRETS, node="src", groups=("g",))
        for i in range(3):
            await stream.writer().send(str(i))
        await stream.writer().finish()

        async def ok(tx: MessageTx[None], value: str) -> None:
            pass

        await handle_messages(stream.reader("g"), ok)
    (run,) = [s for s in spans.get_finished_spans() if s.name == "process t/src/secrets"]
    attributes = dict(run.attributes or {})
    assert attributes["streamledger.handled"] == 3
    assert run.kind == SpanKind.CONSUMER
    assert {k: attributes[k] for k in attributes if k.startswith("messaging.")} == {
        "messaging.system": "streamledger",
        "messaging.destination.name": "t/src/secrets",
        "messaging.destination.template": "t/src/secrets",  # a standalone scope's name is its own
        "messaging.consumer.group.name": "g",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
    }


async def test_the_run_span_records_the_error_the_caller_gets_and_every_retry(
    spans: InMemorySpanExporter,
) -> None:
    async with open_scope(MemoryStore(), scope="retries") as scope:
        stream = await scope.open_stream(SECRETS, node="src", groups=("g",))
        for value in ("flaky", "broken"):
            await stream.writer().send(value)
        await stream.writer().finish()
        tries: dict[str, int] = {}

        async def handler(tx: MessageTx[None], value: str) -> None:
            tries[value] = tries.get(value, 0) + 1
            if value == "broken" or tries[value] == 1:
                raise KeyError("no")

        with pytest.raises(MessageExhaustedError):
            await handle_messages(stream.reader("g"), handler, attempts=2)
    (run,) = [s for s in spans.get_finished_spans() if s.name == "process retries/src/secrets"]
    assert dict(run.attributes or {})["streamledger.error.type"] == "MessageExhaustedError"  # not a group
    assert run.status.description == "MessageExhaustedError"
    failed = [dict(e.attributes or {}) for e in run.events if e.name == "streamledger.message.attempt_failed"]
    assert [(f["streamledger.seq"], f["streamledger.attempts"]) for f in failed] == [(1, 1), (2, 1), (2, 2)]
    assert {f["streamledger.error.type"] for f in failed} == {"KeyError"}


async def test_a_commit_batch_links_to_the_handler_runs_it_confirms(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with open_ledger(tmp_path / "l") as ledger, open_scope(ledger.streams, scope="linked") as scope:
        stream = await scope.open_stream(SECRETS, node="src", groups=("g",))
        for i in range(5):
            await stream.writer().send(str(i))
        await stream.writer().finish()

        async def ok(tx: MessageTx[None], value: str) -> None:
            pass

        await handle_messages(stream.reader("g"), ok)
    finished = spans.get_finished_spans()
    (run,) = [s for s in finished if s.name == "process linked/src/secrets"]
    batches = [s for s in finished if s.name == "streamledger.commit_batch"]
    linked = [b for b in batches if any(link.context.span_id == run.context.span_id for link in b.links)]
    assert linked  # the commits of the run's messages are found from the run's trace
    assert all(link.context.trace_id == run.context.trace_id for b in linked for link in b.links)
