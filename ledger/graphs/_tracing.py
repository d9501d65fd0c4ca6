"""Spans, events and the step context of durable graph runs (OpenTelemetry API only).

A run is one ``invoke_graph {name}`` span per attempt. Its events say what
happened to checkpoints, never with values:

* ``streamledger.checkpoint.restored``: resumed from a checkpoint;
* ``streamledger.checkpoint.discarded``: a checkpoint was not resumed, with
  ``streamledger.checkpoint.reason`` (``format``, ``graph_changed``,
  ``untyped``, ``invalid``) and, for ``invalid``,
  ``streamledger.checkpoint.error`` (where and why, no values);
* ``streamledger.checkpoint.saved``: a step boundary was saved;
* ``streamledger.checkpoint.skipped``: a quiescent step boundary was not
  saved, with ``streamledger.checkpoint.reason`` (``untyped``, ``one_shot``,
  ``not_serializable``, ``reads_back_different``, ``reads_back_as_other_class``).

Each step runs inside an ``execute_step {node}`` span, a child of the run's
span, and can read :func:`current_step` (run id, idempotency key, node, attempt).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, cast

import msgspec
from opentelemetry import context as otel_context
from opentelemetry.trace import Span, Tracer
from pydantic_graph import Graph, Step, StepContext
from pydantic_graph.step import StepFunction

from streams.store import ATTR, SPAN, failed

from ._errors import NotInGraphStepError
from ._quiescence import is_stream_step

__all__ = ["StepInfo", "current_step", "traced_graph"]


class StepInfo(msgspec.Struct, frozen=True):
    """What a running step knows about its durable run.

    ``idempotency_key`` is the same in every attempt of the run, in any
    process, so a step that is repeated after a crash can pass it (with its
    ``node_id`` when one run calls a service from several steps) to the
    services it calls and have them drop the repeat.
    """

    run_id: str
    idempotency_key: str
    node_id: str
    attempt: int


_current_step: ContextVar[StepInfo] = ContextVar("streamledger_current_step")


def current_step() -> StepInfo:
    """The durable run and step the caller is running in.

    Raises :class:`NotInGraphStepError` outside a step of a durable run.
    """
    try:
        return _current_step.get()
    except LookupError:
        raise NotInGraphStepError(
            "current_step() was called outside a step of a durable graph run; call it from a step "
            "function run by DurableGraph.run"
        ) from None


def traced_graph(graph: Graph, *, tracer: Tracer | None, run_id: str, attempt: int) -> Graph:
    """A copy of ``graph`` whose steps run in ``execute_step`` spans with :func:`current_step` set.

    The copy shares everything but its step nodes with ``graph``; each step is a
    shallow copy whose function wraps the original (``Step.__init__`` is how a
    step takes its function). With no tracer (the run's span records nothing,
    so no step span would either) the steps only set :func:`current_step`.
    """
    nodes: dict[Any, Any] = {}
    for node_id, node in graph.nodes.items():
        if isinstance(node, Step):
            info = StepInfo(run_id, run_id, node_id, attempt)
            wrapped = copy.copy(node)
            call = _traced_call(node.call, info, tracer, stream=is_stream_step(node))
            Step.__init__(wrapped, id=node.id, call=cast(StepFunction, call), label=node.label)
            node = wrapped
        nodes[node_id] = node
    return dataclasses.replace(graph, nodes=nodes)


def _attributes(info: StepInfo) -> dict[str, str | int]:
    return {ATTR.RUN_ID: info.run_id, ATTR.NODE: info.node_id, ATTR.ATTEMPT: info.attempt}


def _traced_call(
    call: Callable[[StepContext], Awaitable[Any]],
    info: StepInfo,
    tracer: Tracer | None,
    *,
    stream: bool,
) -> Callable[[StepContext], Awaitable[Any]]:
    name = SPAN.EXECUTE_STEP.format(node=info.node_id)
    if tracer is None:

        async def run_untraced(ctx: StepContext) -> Any:
            token = _current_step.set(info)
            try:
                if stream:
                    return _stream_in_step(await call(ctx), info)
                return await call(ctx)
            finally:
                _current_step.reset(token)

        return run_untraced

    async def run_step(ctx: StepContext) -> Any:
        token = _current_step.set(info)
        try:
            if stream:
                # The stream's body runs later, in whichever task reads it: trace that.
                parent = otel_context.get_current()
                items = await call(ctx)
                return _traced_stream(
                    items, info, lambda: tracer.start_span(name, parent, attributes=_attributes(info))
                )
            with tracer.start_as_current_span(
                name, attributes=_attributes(info), record_exception=False, set_status_on_exception=False
            ) as span:
                try:
                    return await call(ctx)
                except BaseException as exc:
                    failed(span, exc)
                    raise
        finally:
            _current_step.reset(token)

    return run_step


async def _traced_stream(
    items: AsyncIterable[Any], info: StepInfo, start_span: Callable[[], Span]
) -> AsyncIterator[Any]:
    _current_step.set(info)  # the reading task's own context: it ends with the task
    span = start_span()
    try:
        async for item in items:
            yield item
    except BaseException as exc:
        failed(span, exc)
        raise
    finally:
        span.end()


async def _stream_in_step(items: AsyncIterable[Any], info: StepInfo) -> AsyncIterator[Any]:
    _current_step.set(info)  # the reading task's own context: it ends with the task
    async for item in items:
        yield item
