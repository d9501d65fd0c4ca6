"""Spans and events of the engine: recoveries, handler runs, exhausted budgets; never values."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streams import Key, MemoryStore, MessageExhaustedError, MessageTx, Stream, handle_messages, open_scope

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
    (run,) = [s for s in spans.get_finished_spans() if s.name == "streamledger.handle_messages"]
    assert dict(run.attributes or {})["streamledger.handled"] == 3
