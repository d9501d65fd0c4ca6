"""A ledger's health as metrics, read from the ledger by any process: lag, throughput, runs, failures.

What a consumer's own metrics cannot say once it is gone (how far behind a
group is, how many runs failed) is in the ledger, and any process may read
it: :func:`read_ledger_metrics` reads one snapshot through ``inspect``'s
reads (an LMDB ledger opened read-only beside its owner, which it never
blocks; PostgreSQL in one read-only transaction beside its workers) and
:func:`observe_ledger` reports it through OpenTelemetry observable
instruments at each collection; ``python -m ledger metrics`` serves it to
Prometheus (:mod:`ledger._metrics_cli`).

Series never multiply with runs. A stream is named as the library's own
metrics name it (:func:`~streams.store.destination_attributes`): a run's
stream by its template, ``{run_id}/node/key``, summed over the runs of the
graph; a node by its path in the graph. The lag and the exhausted messages
of a stream count only while something can still read it: not for the
streams of a run that ended (its failure, if any, is in the runs by
status), nor for a group that stopped.

The age of a group's oldest unacknowledged message comes from its stream's
append marks (:mod:`streams._store._marks`): never less than the real age,
at most about a second more; 0 when nothing waits. Where several streams
share a series (the partitions of a stream, a template's runs), the series
holds the oldest.
"""

from __future__ import annotations

import datetime
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from streams import StreamRef, StreamsError, __version__
from streams.store import ATTR, METRIC, destination_attributes, destination_template

from ._connect import tools_for
from ._errors import LedgerError
from ._runs_report import NOT_ENDED, STATUSES

__all__ = [
    "LEDGER_METRICS",
    "LedgerMetric",
    "LedgerReading",
    "ObservedLedger",
    "observe_ledger",
    "read_ledger_metrics",
]

Attributes = tuple[tuple[str, str], ...]
GRAPH_RUN_STATUSES: Final = ("open", "finished", "failed")
NODE_STATUSES: Final = ("active", "completed", "skipped", "failed")
_ATTEMPT: Final = re.compile(r"#\d+$")  # a retried Sub mount's later attempt in a node's path: m#2


@dataclass(frozen=True)
class LedgerMetric:
    """One metric read from a ledger: its OpenTelemetry name, kind, unit and what it says."""

    name: str
    kind: Literal["gauge", "counter"]
    unit: str
    description: str


#: Every metric read from a ledger, in the order they are exposed.
LEDGER_METRICS: Final = (
    LedgerMetric(METRIC.LEDGER_UP, "gauge", "1", "1 if the ledger was read, 0 if the read failed."),
    LedgerMetric(METRIC.LEDGER_READ_DURATION, "gauge", "s", "How long the ledger's read took."),
    LedgerMetric(
        METRIC.LEDGER_LAG,
        "gauge",
        "{message}",
        "Confirmed messages a consumer group has not handled, of the streams something can still read.",
    ),
    LedgerMetric(
        METRIC.LEDGER_LAG_AGE,
        "gauge",
        "s",
        "How long ago a group's oldest unacknowledged message was appended (0: none waits), of the "
        "streams something can still read.",
    ),
    LedgerMetric(METRIC.LEDGER_APPENDED, "counter", "{message}", "Messages confirmed in the streams."),
    LedgerMetric(METRIC.LEDGER_ACKED, "counter", "{message}", "Messages a consumer group acknowledged."),
    LedgerMetric(
        METRIC.LEDGER_EXHAUSTED,
        "gauge",
        "{message}",
        "Messages that used their budget and wait for a repair, of the streams something can still read.",
    ),
    LedgerMetric(
        METRIC.LEDGER_DEAD_LETTERED,
        "counter",
        "{message}",
        "Exhausted messages routed to a dead-letter stream and acknowledged.",
    ),
    LedgerMetric(
        METRIC.LEDGER_RUNS, "gauge", "{run}", "Runs of ledger.run and workers, by graph and status."
    ),
    LedgerMetric(
        METRIC.LEDGER_NODES, "gauge", "{node}", "The nodes of those runs, by graph, path and status."
    ),
    LedgerMetric(
        METRIC.LEDGER_FAILED_ATTEMPTS,
        "counter",
        "{attempt}",
        "Node attempts a Retry confirmed as failed, by graph and node path.",
    ),
    LedgerMetric(
        METRIC.LEDGER_GRAPH_RUNS, "gauge", "{run}", "Durable pydantic-graph runs, by graph and status."
    ),
)


@dataclass(frozen=True)
class LedgerReading:
    """One read of a ledger: each metric's points, by name, as (attributes, value); ``error`` if it failed."""

    ledger: str
    points: Mapping[str, Mapping[Attributes, float]]
    error: str | None = None


def read_ledger_metrics(target: str | os.PathLike[str]) -> LedgerReading:
    """Read the metrics of the ledger at ``target`` (a directory or a URL) now: blocking, read-only.

    Raises what ``inspect`` raises for a ledger it cannot read (not a
    ledger, damaged, unreachable); :meth:`ObservedLedger.reading` turns that
    into a reading whose ``up`` is 0.
    """
    tools = tools_for(target)
    base: Attributes = ((ATTR.LEDGER, tools.name(str(target))),)
    started = time.perf_counter()
    report = tools.inspect(str(target), False)
    points = _points(report, base, time.time())
    points[METRIC.LEDGER_UP] = {base: 1}
    points[METRIC.LEDGER_READ_DURATION] = {base: round(time.perf_counter() - started, 6)}
    return LedgerReading(tools.name(str(target)), points)


def _seconds(moment: str) -> float:
    """A report's UTC time (``2026-12-01T09:00:00Z``) as Unix seconds."""
    return datetime.datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()


def _points(report: Mapping[str, Any], base: Attributes, now: float) -> dict[str, dict[Attributes, float]]:
    points: dict[str, dict[Attributes, float]] = defaultdict(lambda: defaultdict(float))
    runs = {run["run_id"]: run for run in report["runs"]}
    for entry in report["streams"]:
        ref = StreamRef(entry["scope"], entry["node"], entry["key"])
        run, template = _run_of(ref, runs)
        destination = _attributes(
            base, destination_attributes(str(ref), template, None if run is None else run["graph"])
        )
        live = run is None or run["status"] in NOT_ENDED
        points[METRIC.LEDGER_APPENDED][destination] += entry["appended"]
        for group in entry["groups"]:
            where = _attributes(destination, {ATTR.CONSUMER_GROUP: group["group"]})
            reading = live and not group["stopped"]
            points[METRIC.LEDGER_LAG][where] += group["pending"] if reading else 0
            oldest = group["oldest_unacked_at"] if reading else None
            age = 0.0 if oldest is None else max(0.0, now - _seconds(oldest))
            points[METRIC.LEDGER_LAG_AGE][where] = max(points[METRIC.LEDGER_LAG_AGE][where], age)
            points[METRIC.LEDGER_EXHAUSTED][where] += group["exhausted"] if reading else 0
            points[METRIC.LEDGER_ACKED][where] += entry["appended"] - group["pending"]
            points[METRIC.LEDGER_DEAD_LETTERED][where] += group["dead_lettered"]
    for run in runs.values():
        graph = {ATTR.GRAPH: run["graph"]}
        for status in STATUSES:  # every status of a graph, so a panel shows 0 rather than nothing
            points[METRIC.LEDGER_RUNS][_attributes(base, {**graph, ATTR.RUN_STATUS: status})] += 0
        points[METRIC.LEDGER_RUNS][_attributes(base, {**graph, ATTR.RUN_STATUS: run["status"]})] += 1
        for node in run["nodes"]:
            path = "/".join(_ATTEMPT.sub("", part) for part in node["path"].split("/"))
            at = _attributes(base, {**graph, ATTR.NODE: path})
            if node["boundary"] == "node":
                for status in NODE_STATUSES:
                    points[METRIC.LEDGER_NODES][_attributes(at, {ATTR.NODE_STATUS: status})] += 0
                points[METRIC.LEDGER_NODES][_attributes(at, {ATTR.NODE_STATUS: node["status"]})] += 1
            else:
                points[METRIC.LEDGER_FAILED_ATTEMPTS][at] += node["failures"]
    for graph_run in report["graph_runs"]:
        graph = {ATTR.GRAPH: graph_run["graph"] or ""}
        for status in GRAPH_RUN_STATUSES:
            points[METRIC.LEDGER_GRAPH_RUNS][_attributes(base, {**graph, ATTR.RUN_STATUS: status})] += 0
        points[METRIC.LEDGER_GRAPH_RUNS][
            _attributes(base, {**graph, ATTR.RUN_STATUS: graph_run["status"]})
        ] += 1
    return {name: dict(found) for name, found in points.items()}


def _run_of(ref: StreamRef, runs: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The run whose stream ``ref`` is (its scope is the run's id or a child scope under it), and its
    template; (None, None) for a stream of no run. The longest run id that gives a template wins."""
    scope = ref.scope
    candidates = [scope[:i] for i in range(len(scope), 0, -1) if i == len(scope) or scope[i] == "/"]
    for run_id in candidates:
        if run_id in runs:
            template = destination_template(ref, run_id)
            if template is not None:
                return runs[run_id], template
    return None, None


def _attributes(base: Attributes, more: Mapping[str, str]) -> Attributes:
    return tuple(sorted({**dict(base), **more}.items()))


@dataclass(eq=False)
class ObservedLedger:
    """A ledger read at most every ``max_age`` seconds; reported by :func:`observe_ledger`'s instruments
    until :meth:`close`."""

    target: str | os.PathLike[str]
    max_age: float
    _reading: LedgerReading | None = None
    _read_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reading(self) -> LedgerReading:
        """The latest reading, read again once it is older than ``max_age`` seconds."""
        with self._lock:  # one read for all the instruments of one collection
            now = time.monotonic()
            if self._reading is None or now - self._read_at >= self.max_age:
                self._reading, self._read_at = self._read(), now
            return self._reading

    def _read(self) -> LedgerReading:
        try:
            return read_ledger_metrics(self.target)
        except (LedgerError, StreamsError) as exc:  # reported as the ledger being down, never raised
            name = tools_for(self.target).name(str(self.target))
            down: dict[str, Mapping[Attributes, float]] = {METRIC.LEDGER_UP: {((ATTR.LEDGER, name),): 0}}
            return LedgerReading(name, down, f"{type(exc).__qualname__}: {exc}")

    def close(self) -> None:
        """Stop reporting this ledger (through :func:`observe_ledger`'s instruments)."""
        with _registered:
            if self in _observed:
                _observed.remove(self)

    def __enter__(self) -> ObservedLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_observed: list[ObservedLedger] = []
_registered = threading.Lock()
_instruments_made = False


def observe_ledger(target: str | os.PathLike[str], *, max_age: float = 1.0) -> ObservedLedger:
    """Report the ledger at ``target`` through observable instruments on the global meter provider.

    Each collection reads the ledger (once for all its instruments, a
    reading being reused for ``max_age`` seconds), on the thread that
    collects: a periodic reader's, or the Prometheus exporter's HTTP
    thread, never an event loop's. Every point has ``streamledger.ledger``,
    so one process may observe several ledgers. With no SDK installed it
    costs nothing: nothing collects.
    """
    global _instruments_made
    if not max_age > 0:
        raise ValueError(f"max_age is a number of seconds above 0, got {max_age!r}")
    observed = ObservedLedger(target, max_age)
    with _registered:
        if not _instruments_made:
            meter = metrics.get_meter("streamledger", __version__)
            for metric in LEDGER_METRICS:
                make = (
                    meter.create_observable_counter
                    if metric.kind == "counter"
                    else meter.create_observable_gauge
                )
                make(
                    metric.name,
                    callbacks=[_callback(metric.name)],
                    unit=metric.unit,
                    description=metric.description,
                )
            _instruments_made = True
        _observed.append(observed)
    return observed


def _callback(name: str) -> Any:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(value, dict(attributes))
            for observed in list(_observed)
            for attributes, value in observed.reading().points.get(name, {}).items()
        ]

    return observe
