"""Durable pydantic-graph runs: step-boundary checkpoints in the ledger (extra ``pydantic-graph``).

Wrap a built ``pydantic_graph.Graph`` in :class:`DurableGraph` with an open
ledger, and run it under a run id; after a crash or an exception, running the
same run id again resumes from the latest checkpoint without repeating the
steps it had completed. See ``docs/graphs.md``.
"""

# ruff: noqa: E402 - the package imports its modules once its extra is known to be installed

from streams.store import publish as _publish

from .._errors import require_extra as _require_extra

_require_extra("pydantic_graph", "pydantic-graph", "ledger.graphs (durable pydantic-graph runs)")

from ._annotations import remember_builder_locals as _remember_builder_locals
from ._errors import GraphInputTypeError as GraphInputTypeError
from ._errors import GraphRunActiveError as GraphRunActiveError
from ._errors import GraphStateTypeError as GraphStateTypeError
from ._errors import InvalidRunIdError as InvalidRunIdError
from ._errors import NotInGraphStepError as NotInGraphStepError
from ._errors import UnsupportedPydanticGraphError as UnsupportedPydanticGraphError
from ._errors import UntypedNodeWarning as UntypedNodeWarning
from ._quiescence import VERIFIED_VERSIONS as VERIFIED_VERSIONS
from ._runner import DurableGraph as DurableGraph
from ._runner import DurableGraphRun as DurableGraphRun
from ._runner import GraphRunResult as GraphRunResult
from ._runner import GraphRunStatus as GraphRunStatus
from ._tracing import StepInfo as StepInfo
from ._tracing import current_step as current_step

__all__ = [
    "VERIFIED_VERSIONS",
    "DurableGraph",
    "DurableGraphRun",
    "GraphInputTypeError",
    "GraphRunActiveError",
    "GraphRunResult",
    "GraphRunStatus",
    "GraphStateTypeError",
    "InvalidRunIdError",
    "NotInGraphStepError",
    "StepInfo",
    "UnsupportedPydanticGraphError",
    "UntypedNodeWarning",
    "current_step",
]

_publish(globals(), __all__)  # tracebacks and docs name the public module

# graphs built from now on keep the builder's locals, so their annotations resolve once it returned
_remember_builder_locals()
