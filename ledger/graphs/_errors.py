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
"""

from __future__ import annotations

from .._errors import LedgerError

__all__ = [
    "GraphInputTypeError",
    "GraphRunActiveError",
    "GraphStateTypeError",
    "InvalidRunIdError",
    "NotInGraphStepError",
    "UnsupportedPydanticGraphError",
]


class GraphStateTypeError(LedgerError, TypeError):
    """The graph's state type has no pydantic schema, so no checkpoint could hold it."""


class GraphInputTypeError(LedgerError, TypeError):
    """The graph's input or output type, or a type named in ``input_types``, cannot be written down."""


class UnsupportedPydanticGraphError(LedgerError):
    """The installed pydantic-graph is not one whose run internals were verified."""


class GraphRunActiveError(LedgerError):
    """The run id is already being run by this process."""


class InvalidRunIdError(LedgerError, ValueError):
    """The run id cannot be a ledger key: empty, or longer than the key limit."""


class NotInGraphStepError(LedgerError, LookupError):
    """:func:`current_step` was called outside a step of a durable graph run."""
