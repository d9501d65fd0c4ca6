"""OpenTelemetry metrics (API only) for streams, handlers, the ledger and graph executions.

Every instrument the library records is made here, once, on the global
meter provider; with no SDK installed they are no-ops, and an SDK installed
later takes them over (the API's proxies). The names are
:class:`~streams._tracing.METRIC`'s: OpenTelemetry's messaging conventions
where one fits, the library's own elsewhere. Attributes name
streams and groups, never values. The engine records per batch, not per
message, so metrics cost nothing a batch does not already pay.

A stream's endpoint is observed for the lag gauge from when it opens until
its scope ends (:func:`observe_stream`, :func:`forget_stream`); a group is
reported while it reads: one that stopped, or whose graph node concluded, is not.

No attribute carries a run's id. A stream is named in every metric by its
``messaging.destination.template``: the streams of a run (whose scope is the
run's id, or a child scope under it) by the template
:func:`~streams.store.destination_template` gives (``{run_id}/node/key``),
with ``streamledger.graph.name``; any other stream by its name, which is then
its ``messaging.destination.name`` too. The full name of a run's stream is a
span attribute, never a metric's.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from ._tracing import ATTR, METRIC
from ._version import __version__

__all__ = [
    "INSTRUMENTS",
    "destination_attributes",
    "forget_stream",
    "group_attributes",
    "observe_stream",
    "stream_attributes",
]

SYSTEM: Final = "streamledger"


class _Instruments:
    """The library's instruments, made once on the global meter provider."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.sent = meter.create_counter(
            METRIC.SENT, unit="{message}", description="Messages confirmed in a stream (appended)."
        )
        self.consumed = meter.create_counter(
            METRIC.CONSUMED, unit="{message}", description="Messages a consumer group confirmed as handled."
        )
        self.operation_duration = meter.create_histogram(
            METRIC.OPERATION_DURATION,
            unit="s",
            description="How long a confirmation took in the store (an append, a commit batch).",
        )
        self.failed_attempts = meter.create_counter(
            METRIC.FAILED_ATTEMPTS, unit="{attempt}", description="Handler attempts confirmed as failed."
        )
        self.exhausted = meter.create_counter(
            METRIC.EXHAUSTED, unit="{message}", description="Messages that used their whole attempt budget."
        )
        self.dead_lettered = meter.create_counter(
            METRIC.DEAD_LETTERED,
            unit="{message}",
            description="Exhausted messages routed to a dead-letter stream and acknowledged.",
        )
        self.commit_batch_size = meter.create_histogram(
            METRIC.COMMIT_BATCH_SIZE, unit="{message}", description="Messages one handler commit confirmed."
        )
        self.ledger_batch_writes = meter.create_histogram(
            METRIC.LEDGER_BATCH_WRITES, unit="{write}", description="Writes one ledger transaction confirmed."
        )
        self.ledger_commit_duration = meter.create_histogram(
            METRIC.LEDGER_COMMIT_DURATION,
            unit="s",
            description="From a ledger batch's hand-over to its writer thread to its landing, fsync and all.",
        )
        self.nodes = meter.create_counter(
            METRIC.NODES, unit="{node}", description="Graph nodes that concluded, by status."
        )
        self.executions = meter.create_counter(
            METRIC.EXECUTIONS, unit="{execution}", description="Graph executions that ended, by status."
        )
        meter.create_observable_gauge(
            METRIC.LAG,
            callbacks=[_observe_lag],
            unit="{message}",
            description="Messages confirmed in a stream that a consumer group still reading has not handled.",
        )


class ObservedStream(Protocol):
    """What the lag gauge reads of a stream: its destination's attributes and each group's lag."""

    @property
    def destination(self) -> Mapping[str, str]: ...

    def lags(self) -> Iterator[tuple[str, int]]: ...


_streams: weakref.WeakSet[ObservedStream] = weakref.WeakSet()


def observe_stream(stream: ObservedStream) -> None:
    """Report ``stream``'s groups in the lag gauge."""
    _streams.add(stream)


def forget_stream(stream: ObservedStream) -> None:
    """Stop reporting ``stream`` (its scope or execution ended)."""
    _streams.discard(stream)


def _observe_lag(options: CallbackOptions) -> Iterable[Observation]:
    return list(_lags())


def _lags() -> Iterator[Observation]:
    for stream in list(_streams):
        for name, lag in stream.lags():
            yield Observation(lag, group_attributes(stream.destination, name))


def destination_attributes(name: str, template: str | None, graph: str | None) -> dict[str, str]:
    """A stream's attributes in every metric: its template; its name only if it has no other template.

    ``template`` is a run's stream's low-cardinality name (None for any
    other stream, whose name is its template); ``graph`` the graph whose
    execution writes it, if any.
    """
    attributes = {ATTR.MESSAGING_SYSTEM: SYSTEM, ATTR.DESTINATION_TEMPLATE: template or name}
    if template is None:
        attributes[ATTR.DESTINATION] = name
    if graph is not None:
        attributes[ATTR.GRAPH] = graph
    return attributes


def stream_attributes(destination: Mapping[str, str], operation: str, kind: str) -> dict[str, str]:
    """A stream's metric attributes for ``operation`` (OpenTelemetry's operation type ``kind``)."""
    return {**destination, ATTR.OPERATION: operation, ATTR.OPERATION_TYPE: kind}


def group_attributes(destination: Mapping[str, str], group: str) -> dict[str, str]:
    return {**destination, ATTR.CONSUMER_GROUP: group}


INSTRUMENTS: Final = _Instruments(metrics.get_meter("streamledger", __version__))
