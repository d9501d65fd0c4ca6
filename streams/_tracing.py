"""OpenTelemetry (API only) for the stream engine. Attributes never carry business values."""

from __future__ import annotations

from opentelemetry import trace

__all__ = ["tracer"]


def tracer() -> trace.Tracer:
    """The library's tracer, looked up at call time so a provider set later is used."""
    return trace.get_tracer("streamledger")
