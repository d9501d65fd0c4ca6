"""A span per node attempt, under the span its execution runs in: a durable run's, or the host's own.

OpenTelemetry's conventions for an operation that is tried again (HTTP's
resends, the stable example) give every attempt a span of its own, carrying
its ordinal, and no logical span around the attempts: a trace then shows how
long each try took and how each ended, where one span with retry events
would hide the time of every try but the whole. So each run of a node's
function, or of a Sub mount's child, is one ``execute_node {node}`` span,
and a Retry's next attempt is a sibling with a higher
``streamledger.node.attempt`` (the failures its boundary confirmed before
it, ``NodeContext.attempt``). A failed attempt's span has status ERROR and
``error.type``, never the message; a skip, a cancellation or a failure
raised after a cancellation reached the node is no failure, and says so in
``streamledger.node.status``.

Spans are made only under a recording span: an execution nobody traces, and
a program with no OpenTelemetry SDK, pay one context-variable read per
attempt.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio
from opentelemetry.trace import get_current_span
from opentelemetry.util.types import AttributeValue

from ._context import NodeContext, NodeSkipped
from ._outcome import interrupted
from ._tracing import ATTR, SPAN, failed, tracer

__all__ = ["node_attempt"]


@contextmanager
def node_attempt(ctx: NodeContext, graph: str) -> Iterator[None]:
    """The span of one attempt of ``ctx``'s node, of ``graph``, if the caller's span records."""
    if not get_current_span().is_recording():
        yield
        return
    attributes: dict[str, AttributeValue] = {
        ATTR.GRAPH: graph,
        ATTR.NODE: ctx.group,
        ATTR.NODE_ATTEMPT: ctx.attempt,
    }
    run_id = ctx.run_id
    if run_id is not None:
        attributes[ATTR.RUN_ID] = run_id
    with tracer().start_as_current_span(
        SPAN.EXECUTE_NODE.format(node=ctx.node),
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield
        except NodeSkipped:
            current.set_attribute(ATTR.NODE_STATUS, "skipped")
            raise
        except anyio.get_cancelled_exc_class():
            current.set_attribute(ATTR.NODE_STATUS, "cancelled")
            raise
        except BaseException as exc:
            if isinstance(exc, Exception) and interrupted():  # raised once a cancellation reached it
                current.set_attribute(ATTR.NODE_STATUS, "cancelled")
            else:
                current.set_attribute(ATTR.NODE_STATUS, "failed")
                failed(current, exc)
            raise
        current.set_attribute(ATTR.NODE_STATUS, "completed")
