"""OpenTelemetry (API only) for the engine and the ledger. Spans never carry business values.

OpenTelemetry's defaults record an exception's message and traceback on the
span, and a message may quote a payload. :func:`span` records the
exception's type instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

__all__ = ["span", "tracer"]


def tracer() -> trace.Tracer:
    """The library's tracer, looked up at call time so a provider set later is used."""
    return trace.get_tracer("streamledger")


@contextmanager
def span(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[Span]:
    """A current span that, on an exception, records only its type."""
    with tracer().start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            kind = type(exc).__qualname__
            current.set_attribute("streamledger.error.type", kind)
            current.set_status(Status(StatusCode.ERROR, kind))
            raise
