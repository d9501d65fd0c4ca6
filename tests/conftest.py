from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sniffio
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import LedgerEnv
from ledger.postgres._alone import LedgerConnection

from . import pg_server

#: What a module's source says when its tests start processes, servers or browsers: they are not
#: in the edit loop's selection (``-m quick``), nor is any test on PostgreSQL or marked ``slow``.
_STARTS_PROCESSES = (
    "subprocess",
    "Popen",
    "SIGKILL",
    "pg_server",
    "browser",
    "multiprocessing",
    "ledger_command",  # ``python -m ledger``, forked from the tests' command server
    "from fuzz",  # the fuzz loops' entry points: the kill loop, the bit flips
)


@cache
def _starts_processes(module: Path) -> bool:
    source = module.read_text(encoding="utf-8")
    return any(word in source for word in _STARTS_PROCESSES)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core, at most eight. Many tests spend their time waiting on a
    subprocess, a server, a browser or a lease running out, and a second worker a core fills it."""
    return min(2 * (os.cpu_count() or 1), 8)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``quick`` each test that runs in this process alone: the edit loop's selection.

    ``python -m pytest -m quick`` runs the core of every package (streams,
    the LMDB ledger, the graphs) in about a minute; the whole suite adds the
    crash tests, PostgreSQL, the command line, the browser and the benches.
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        on_postgres = (
            "postgres" in item.nodeid.lower()
            or item.get_closest_marker("postgres") is not None
            or {"postgres_server", "postgres_url"} & set(fixtures)
        )
        if on_postgres or item.get_closest_marker("slow") is not None or _starts_processes(item.path):
            continue
        item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def postgres_server() -> Any:
    """The session's private PostgreSQL server. A machine without one fails these tests, never skips them:
    the PostgreSQL ledger is proven here or nowhere (``.ci/run`` installs the package where it is missing).
    """
    try:
        return pg_server.server()
    except pg_server.Unavailable as exc:
        pytest.fail(f"the PostgreSQL ledger's tests need a server: {exc}", pytrace=False)


@pytest.fixture
def postgres_url(postgres_server: Any) -> str:
    """A URL of a new, empty ledger: a schema of its own on the session's server."""
    return pg_server.new_ledger_url()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _on_an_event_loop() -> str | None:
    """The async library running on this thread, or None (a worker thread, or plain sync code)."""
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def _off_the_loop(what: str, call: Callable[..., Any], *, unless: str = "") -> Callable[..., Any]:
    """``call``, failing the test when the library makes it on an event loop's thread.

    ``unless`` names the one function of the library that may make it there,
    two frames up: the committer's commit of a lone write on an idle loop.
    """

    def guarded(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        allowed = unless and sys._getframe(2).f_code.co_name == unless
        if caller.split(".")[0] in ("ledger", "streams") and not allowed:  # tests themselves may block
            library = _on_an_event_loop()
            assert library is None, f"{what} ran on the {library} event loop's thread, which it blocks"
        return call(*args, **kwargs)

    return guarded


@pytest.fixture(autouse=True)
def _no_blocking_ledger_calls_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test in which the library blocks an event loop's thread on the disk or the network.

    On LMDB: opening the environment or beginning a write transaction (file
    I/O and fsync; an open takes tens of milliseconds): ``open_ledger``
    opens in a worker thread, and write transactions belong to the writer
    thread, but for a lone write the committer makes on an idle loop
    (``LmdbBatches.commit_inline``, ``tests/ledger/test_inline_commit.py``).
    On PostgreSQL: connecting, or any statement (a network round trip, which
    may wait for another transaction's locks): they run in worker threads.
    Calls made by test code itself (reading a ledger back after a run) are
    not checked.
    """
    monkeypatch.setattr(LedgerEnv, "open", _off_the_loop("LedgerEnv.open", LedgerEnv.open))
    monkeypatch.setattr(
        LedgerEnv, "open_readonly", _off_the_loop("LedgerEnv.open_readonly", LedgerEnv.open_readonly)
    )
    monkeypatch.setattr(
        LedgerEnv,
        "begin_write",
        _off_the_loop("a write transaction", LedgerEnv.begin_write, unless="commit_inline"),
    )
    # the PostgreSQL backend: every round trip to the server, and every connection made
    monkeypatch.setattr(psycopg, "connect", _off_the_loop("psycopg.connect", psycopg.connect))
    connect = LedgerConnection.connect.__func__  # type: ignore[attr-defined]  # the ledger's connections
    monkeypatch.setattr(LedgerConnection, "connect", classmethod(_off_the_loop("a connect", connect)))
    for cls in (psycopg.Connection, psycopg.Cursor):
        monkeypatch.setattr(cls, "execute", _off_the_loop(f"{cls.__name__}.execute", cls.execute))
    monkeypatch.setattr(
        psycopg.Cursor, "executemany", _off_the_loop("Cursor.executemany", psycopg.Cursor.executemany)
    )


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


class Metrics:
    """The library's metrics as the OpenTelemetry SDK's in-memory reader collects them now."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self._reader = reader

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """Each data point of instrument ``name``: its attributes and the point itself."""
        data = self._reader.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend((dict(p.attributes or {}), p) for p in metric.data.data_points)
        return found

    def series(self) -> set[tuple[str, frozenset[tuple[str, Any]]]]:
        """Every series reported now: each instrument's name with each attribute set it has points for."""
        data = self._reader.get_metrics_data()
        return {
            (metric.name, frozenset((point.attributes or {}).items()))
            for resource in (data.resource_metrics if data is not None else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
        }

    def value(self, name: str, **attributes: Any) -> Any:
        """The sum (counters), the point (histograms) or the value (gauges) whose attributes include these."""
        wanted = {k.replace("__", "."): v for k, v in attributes.items()}
        matching = [p for a, p in self.points(name) if wanted.items() <= a.items()]
        if not matching:
            return None
        assert len(matching) == 1, f"{name} has {len(matching)} points with {wanted}"
        point = matching[0]
        return getattr(point, "value", point)


_metric_reader = InMemoryMetricReader()
_meter_installed = False


@pytest.fixture
def metrics_now() -> Metrics:
    """The process's metrics, read by an in-memory reader installed once (counters add up across tests)."""
    global _meter_installed
    if not _meter_installed:
        otel_metrics.set_meter_provider(MeterProvider(metric_readers=[_metric_reader]))
        _meter_installed = True
    return Metrics(_metric_reader)
