from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import open_ledger

#: Opens the same ledger each time it is called.
Opening = Callable[[], AbstractAsyncContextManager[Any]]


@pytest.fixture(params=["lmdb", "postgres"])
def opening(request: pytest.FixtureRequest, tmp_path: Path) -> Opening:
    """A ledger to run durable graphs on: an LMDB directory, or a PostgreSQL database."""
    if request.param == "lmdb":
        return lambda: open_ledger(tmp_path / "l")
    from ledger.postgres import open_postgres

    url = request.getfixturevalue("postgres_url")
    return lambda: open_postgres(url)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()
