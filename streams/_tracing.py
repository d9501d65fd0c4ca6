"""OpenTelemetry (API only) for the engine, the ledger and durable graphs: one vocabulary.

Every span, event, metric and attribute the library emits is named here,
once: :class:`SPAN`, :class:`EVENT`, :class:`METRIC`, :class:`ATTR` (the
instruments themselves are made in :mod:`streams._metrics`). Spans never carry business
values. OpenTelemetry's defaults record an exception's message and traceback
on the span, and a message may quote a payload: :func:`span` and
:func:`failed` record the exception's type instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

__all__ = ["ATTR", "EVENT", "METRIC", "SPAN", "failed", "span", "tracer"]

_INSTRUMENTATION: Final = "streamledger"


class SPAN:
    """Span names (durable graphs name theirs after the graph and the step)."""

    OPEN_STREAM: Final = "streamledger.open_stream"
    RECOVER: Final = "streamledger.recover"
    #: handle_messages: OpenTelemetry's messaging name, ``{operation} {destination}``, the destination
    #: being the stream's template (a run's streams without the run's id: low cardinality)
    PROCESS: Final = "process {destination}"
    COMMIT_BATCH: Final = "streamledger.commit_batch"
    INVOKE_GRAPH: Final = "invoke_graph {graph}"
    EXECUTE_STEP: Final = "execute_step {node}"
    #: one attempt of a graph node (a Retry's next attempt is a sibling span); a run is INVOKE_GRAPH
    EXECUTE_NODE: Final = "execute_node {node}"


class EVENT:
    STREAM_RECOVERED: Final = "streamledger.stream.recovered"
    BUDGET_EXHAUSTED: Final = "streamledger.budget.exhausted"
    #: a handler attempt failed and its failure was confirmed; a retry follows unless the budget is used
    ATTEMPT_FAILED: Final = "streamledger.message.attempt_failed"
    #: an exhausted message was routed to the dead-letter stream, acknowledged in the same commit
    DEAD_LETTERED: Final = "streamledger.message.dead_lettered"
    CHECKPOINT_RESTORED: Final = "streamledger.checkpoint.restored"
    CHECKPOINT_DISCARDED: Final = "streamledger.checkpoint.discarded"
    CHECKPOINT_SAVED: Final = "streamledger.checkpoint.saved"
    CHECKPOINT_SKIPPED: Final = "streamledger.checkpoint.skipped"


class METRIC:
    """Instrument names: OpenTelemetry's messaging conventions where one fits, the library's own elsewhere."""

    SENT: Final = "messaging.client.sent.messages"
    CONSUMED: Final = "messaging.client.consumed.messages"
    OPERATION_DURATION: Final = "messaging.client.operation.duration"
    FAILED_ATTEMPTS: Final = "streamledger.message.failed_attempts"
    EXHAUSTED: Final = "streamledger.message.exhausted"
    DEAD_LETTERED: Final = "streamledger.message.dead_lettered"
    COMMIT_BATCH_SIZE: Final = "streamledger.commit.batch.size"
    LAG: Final = "streamledger.consumer.lag"
    LEDGER_BATCH_WRITES: Final = "streamledger.ledger.batch.writes"
    LEDGER_COMMIT_DURATION: Final = "streamledger.ledger.commit.duration"
    NODES: Final = "streamledger.nodes"
    EXECUTIONS: Final = "streamledger.executions"
    # read from a ledger by any process (``ledger.observe_ledger``, ``python -m ledger metrics``)
    LEDGER_LAG: Final = "streamledger.ledger.consumer.lag"
    LEDGER_LAG_AGE: Final = "streamledger.ledger.consumer.lag.age"
    LEDGER_APPENDED: Final = "streamledger.ledger.stream.appended"
    LEDGER_ACKED: Final = "streamledger.ledger.consumer.acked"
    LEDGER_EXHAUSTED: Final = "streamledger.ledger.consumer.exhausted"
    LEDGER_DEAD_LETTERED: Final = "streamledger.ledger.consumer.dead_lettered"
    LEDGER_RUNS: Final = "streamledger.ledger.runs"
    LEDGER_NODES: Final = "streamledger.ledger.nodes"
    LEDGER_FAILED_ATTEMPTS: Final = "streamledger.ledger.node.failed_attempts"
    LEDGER_GRAPH_RUNS: Final = "streamledger.ledger.graph_runs"
    LEDGER_UP: Final = "streamledger.ledger.up"
    LEDGER_READ_DURATION: Final = "streamledger.ledger.read.duration"


class ATTR:
    # OpenTelemetry's messaging and error conventions (metrics)
    MESSAGING_SYSTEM: Final = "messaging.system"
    DESTINATION: Final = "messaging.destination.name"
    #: a stream's name without its run's id (``{run_id}/node/key``): what metrics are grouped by
    DESTINATION_TEMPLATE: Final = "messaging.destination.template"
    CONSUMER_GROUP: Final = "messaging.consumer.group.name"
    OPERATION: Final = "messaging.operation.name"
    OPERATION_TYPE: Final = "messaging.operation.type"
    ERROR_KIND: Final = "error.type"
    ERROR_TYPE: Final = "streamledger.error.type"
    # streams and handlers
    STREAM: Final = "streamledger.stream"
    STREAM_SCOPE: Final = "streamledger.stream.scope"
    STREAM_NODE: Final = "streamledger.stream.node"
    STREAM_KEY: Final = "streamledger.stream.key"
    GROUP: Final = "streamledger.group"
    SEQ: Final = "streamledger.seq"
    ATTEMPTS: Final = "streamledger.attempts"
    DEAD_LETTER: Final = "streamledger.dead_letter"
    HANDLED: Final = "streamledger.handled"
    GENERATION: Final = "streamledger.generation"
    APPENDED: Final = "streamledger.appended"
    TAIL: Final = "streamledger.tail"
    CREATED: Final = "streamledger.created"
    RECORDS_READ: Final = "streamledger.records_read"
    # ledger commit batches
    BATCH_WRITES: Final = "streamledger.batch.writes"
    BATCH_FAILED: Final = "streamledger.batch.failed"
    BATCH_MAP_GROWTHS: Final = "streamledger.batch.map_growths"
    # durable graph runs and their checkpoints
    RUN_ID: Final = "streamledger.graph.run_id"
    GRAPH: Final = "streamledger.graph.name"
    GRAPH_VERSION: Final = "streamledger.graph.version"
    #: a run's span: whether this call resumed it (its attempt is the executions it started)
    RESUMED: Final = "streamledger.run.resumed"
    #: a node attempt's span: the failures its innermost Retry confirmed before it (0 for the first)
    NODE_ATTEMPT: Final = "streamledger.node.attempt"
    ATTEMPT: Final = "streamledger.graph.attempt"
    NODE: Final = "streamledger.graph.node_id"
    REASON: Final = "streamledger.checkpoint.reason"
    ERROR: Final = "streamledger.checkpoint.error"
    SEQUENCE: Final = "streamledger.checkpoint.sequence"
    NEXT_NODE: Final = "streamledger.checkpoint.next_node"
    # graph executions and the ledger (metrics)
    NODE_STATUS: Final = "streamledger.node.status"
    RUN_STATUS: Final = "streamledger.run.status"
    EXECUTION_STATUS: Final = "streamledger.execution.status"
    LEDGER: Final = "streamledger.ledger"


def tracer(provider: TracerProvider | None = None) -> trace.Tracer:
    """The library's tracer: the given provider's, else the global one looked up at call time."""
    if provider is not None:
        return provider.get_tracer(_INSTRUMENTATION)
    return trace.get_tracer(_INSTRUMENTATION)


def failed(current: Span, exc: BaseException) -> None:
    """Mark ``current`` as failed with ``exc``'s type only: its message may hold values."""
    kind = type(exc).__qualname__
    current.set_attribute(ATTR.ERROR_KIND, kind)  # OpenTelemetry's convention, which backends group by
    current.set_attribute(ATTR.ERROR_TYPE, kind)
    current.set_status(Status(StatusCode.ERROR, kind))


@contextmanager
def span(
    name: str, attributes: Mapping[str, AttributeValue] | None = None, *, kind: SpanKind = SpanKind.INTERNAL
) -> Iterator[Span]:
    """A current span that, on an exception, records only its type."""
    with tracer().start_as_current_span(
        name, attributes=attributes, kind=kind, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, exc)
            raise
