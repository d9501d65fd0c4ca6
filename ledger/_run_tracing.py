"""The span of a run of ``ledger.run``, ``ledger.resume`` and ``ledger.start``: ``invoke_graph {graph}``.

One span per execution a call starts (a run, or each resume that runs
something), named after the graph, never the run: the run's id is an
attribute (``streamledger.graph.run_id``), with the graph's name and
version, ``streamledger.graph.attempt`` (the executions the run has started,
this one included) and whether this call resumed it. The engine makes each
node attempt's span under it (:mod:`streams`' ``execute_node {node}``, a
Retry's next attempt a sibling), so a retried node shows each try and a
failed run the attempt it failed in. A run that fails has status ERROR and
``error.type``, the type of the error the caller gets, never its message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from streams.store import ATTR, SPAN, span


class TracedRun(Protocol):
    """What a run's span says of its record (``_runs.RunRecord``)."""

    @property
    def run_id(self) -> str: ...

    @property
    def graph(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def starts(self) -> int: ...


__all__ = ["traced_run"]


@asynccontextmanager
async def traced_run(record: TracedRun, *, resumed: bool) -> AsyncIterator[None]:
    """The run's span, current for the block: entered before the execution, so its nodes run under it.

    Async only to sit in the execution's own ``async with``; it awaits nothing.
    """
    with span(
        SPAN.INVOKE_GRAPH.format(graph=record.graph),
        {
            ATTR.RUN_ID: record.run_id,
            ATTR.GRAPH: record.graph,
            ATTR.GRAPH_VERSION: record.version,
            ATTR.ATTEMPT: record.starts,
            ATTR.RESUMED: resumed,
        },
    ):
        yield
