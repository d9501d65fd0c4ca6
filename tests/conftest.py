from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_exporter = InMemorySpanExporter()
_installed = False


class _WhileArmed(SimpleSpanProcessor):
    """Exports only while a test that asked for spans runs, so nothing piles up in between."""

    armed = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.armed:
            super().on_end(span)


_processor = _WhileArmed(_exporter)


def _install() -> None:
    """Route the process's spans to ``_exporter`` once, sharing an SDK provider if one is set."""
    global _installed
    if _installed:
        return
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(_processor)
    _installed = True


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An exporter holding the spans finished during the test."""
    _install()
    _exporter.clear()
    _WhileArmed.armed = True
    try:
        yield _exporter
    finally:
        _WhileArmed.armed = False
        _exporter.clear()
