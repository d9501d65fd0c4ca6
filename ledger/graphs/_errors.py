"""Errors raised by durable pydantic-graph runs.

Every one derives from :class:`ledger.LedgerError`, says what was wrong with
the identifiers needed to find it and what to do, and never carries a value of
the graph (state, inputs or outputs may be private).

::

    LedgerError
    ├── GraphStateTypeError (TypeError)          the state type cannot be written down
    ├── GraphInputTypeError (TypeError)          the input or output type, or an input_types entry, cannot be
    ├── UnsupportedPydanticGraphError            the installed pydantic-graph is not a verified version
    ├── GraphRunActiveError                      the run id is already running in this process
    ├── InvalidRunIdError (ValueError)           the run id is empty or too long for a ledger key
    └── NotInGraphStepError (LookupError)        current_step() was called outside a durable step

    UserWarning
    └── UntypedNodeWarning                       no checkpoint can be saved before some nodes (registration)
"""

from __future__ import annotations

from .._errors import InvalidRunIdError, LedgerError

__all__ = [
    "GraphInputTypeError",
    "GraphRunActiveError",
    "GraphStateTypeError",
    "InvalidRunIdError",
    "NotInGraphStepError",
    "UnsupportedPydanticGraphError",
    "UntypedNodeWarning",
]


class GraphStateTypeError(LedgerError, TypeError):
    """The graph's state type has no pydantic schema, so no checkpoint could hold it."""


class GraphInputTypeError(LedgerError, TypeError):
    """The graph's input or output type, or a type named in ``input_types``, cannot be written down."""


class UnsupportedPydanticGraphError(LedgerError):
    """The installed pydantic-graph is not one whose run internals were verified."""


class GraphRunActiveError(LedgerError):
    """The run id is already being run by this process."""


class NotInGraphStepError(LedgerError, LookupError):
    """:func:`current_step` was called outside a step of a durable graph run."""


class UntypedNodeWarning(UserWarning):
    """Registration found nodes after steps whose input type is not known: no checkpoint before them.

    A crash or failure in such a node's run resumes from the checkpoint before
    the step that led to it, so that step runs again. Name the types with
    ``input_types=`` to checkpoint there, or register with
    ``on_untyped="ignore"`` to accept it.
    """
