"""Errors raised by the stream engine.

Every error derives from :class:`StreamsError`, but one: a store's
:class:`CheckpointScopeFailure`, which the engine catches by its exact type
and never lets reach the caller. Errors caused by what the caller passed
mix in the matching built-in (``TypeError``, ``ValueError``); failures of
the reliable layer underneath are :class:`CheckpointError`. Messages name
the stream, group and sequence involved, never a payload.

::

    StreamsError
    ├── PayloadTypeError (TypeError)            a value of the wrong type for its key
    ├── HandlerContractError (TypeError)        a handler that is not async, or reads a state never given
    ├── OutputLimitError (ValueError)           too many staged outputs, or a batch over capacity
    ├── StreamStateError                        an operation the endpoint's state forbids
    │   ├── CompactedHistoryError               a group asked to start at messages compaction removed
    │   ├── ScopeInUseError                     a second StreamScope of one scope on the same hooks
    │   ├── StreamClosedError                   the writer finished or failed; no more sends
    │   └── GroupBusyError                      another handler already consumes this group
    ├── StreamFailedError                       the writer failed; readers see the failure, not EOF
    ├── MessageExhaustedError                   a message used its whole attempt budget
    ├── SourceNotResumableError                 an active stream reopened without a continuation promise
    ├── PartitionError (ValueError)             a stream opened with other partitions than it has
    ├── GraphError (ValueError)                 a graph that cannot run, or inputs it does not take
    ├── OutputError (ValueError)                a node set a key it does not provide, or set one twice
    ├── SkippedInputError (LookupError)         a node read an input that was skipped
    ├── ExecutionCancelledError                 the execution was cancelled before it finished
    ├── StrayCancellationError                  a node's code raised a cancellation nothing had asked for
    ├── ConfirmedFailureError                   a node's (or a Retry's) final failure was confirmed earlier
    ├── RestorePlanError (ValueError)           a recovery plan that does not fit the graph; nothing installed
    └── CheckpointError                         the ledger refused or lost a reliable operation
        ├── StaleGenerationError                a record from an older generation
        ├── SequenceError                       a gap, a repeat or an unknown sequence number
        ├── UnknownStreamError                  a record for a stream never opened
        ├── StreamFinishedError                 a write to a stream the ledger knows finished
        ├── RecordDecodeError                   a stored payload or state no longer reads as its type
        ├── KeyedStateError (ValueError)        a keyed-state key longer than the ledger keeps
        └── StoreDamagedError                   the store's records contradict each other: one is missing

    Exception
    └── CheckpointScopeFailure                  a store's open_child: the scope's final failure is confirmed
                                                (not a StreamsError: the engine catches exactly this type)
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointScopeFailure",
    "CompactedHistoryError",
    "ConfirmedFailureError",
    "ExecutionCancelledError",
    "GraphError",
    "GroupBusyError",
    "HandlerContractError",
    "KeyedStateError",
    "MessageExhaustedError",
    "OutputError",
    "OutputLimitError",
    "PartitionError",
    "PayloadTypeError",
    "RecordDecodeError",
    "RestorePlanError",
    "ScopeInUseError",
    "SequenceError",
    "SkippedInputError",
    "SourceNotResumableError",
    "StaleGenerationError",
    "StoreDamagedError",
    "StreamClosedError",
    "StreamFailedError",
    "StreamFinishedError",
    "StreamStateError",
    "StrayCancellationError",
    "StreamsError",
    "UnknownStreamError",
]


class StreamsError(Exception):
    """Root of every error raised by ``streams``."""


class PayloadTypeError(StreamsError, TypeError):
    """A value does not have the type its key declares."""


class OutputLimitError(StreamsError, ValueError):
    """A handled message staged more outputs than allowed, or a batch larger than its stream."""


class StreamStateError(StreamsError):
    """The endpoint's state forbids the operation."""


class CompactedHistoryError(StreamStateError):
    """A consumer group was asked to start at messages every group acknowledged and compaction removed."""


class HandlerContractError(StreamsError, TypeError):
    """A handler broke handle_messages' contract (it is not async, it reads a state never given).

    A programming error, not a failure of the message: the run stops before
    any attempt is confirmed, so no budget is spent on it.
    """


class ScopeInUseError(StreamStateError):
    """A scope already open on the same stream hooks in this process: share its StreamScope."""


class StreamClosedError(StreamStateError):
    """The writer already finished or failed."""


class GroupBusyError(StreamStateError):
    """Another handler already consumes this consumer group."""


class StreamFailedError(StreamsError):
    """The stream's writer failed; its readers see the failure instead of end-of-stream."""


class MessageExhaustedError(StreamsError):
    """A message used every attempt of its budget; the handler fails, it is never skipped."""


class SourceNotResumableError(StreamsError):
    """An active stream was reopened by a writer that did not promise to continue it."""


class PartitionError(StreamsError, ValueError):
    """A stream opened with another number of partitions than it was created with, or partitioned
    twice over; nothing was opened."""


class GraphError(StreamsError, ValueError):
    """A graph that cannot run, or inputs it does not take; ``problems`` lists each one found."""

    def __init__(self, message: str, *, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


class OutputError(StreamsError, ValueError):
    """A node set or skipped a key it does not provide, or a key already settled."""


class SkippedInputError(StreamsError, LookupError):
    """A node read ``ctx[key]`` for an input that was skipped: use ``ctx.get(key)`` to accept ``NoValue``."""


class ExecutionCancelledError(StreamsError):
    """The execution was cancelled (``Execution.cancel`` or its host) before it finished."""


class CheckpointError(StreamsError):
    """A reliable operation failed or its outcome is unknown; stop and recover from the ledger."""


class StaleGenerationError(CheckpointError):
    """A delivery, append or commit carries an older generation than the ledger's."""


class SequenceError(CheckpointError):
    """A sequence number is not the next one, was already acknowledged, or was never appended."""


class UnknownStreamError(CheckpointError):
    """A record names a stream that was never opened in this store."""


class StreamFinishedError(CheckpointError):
    """A record would write to a stream the ledger knows is finished."""


class RecordDecodeError(CheckpointError):
    """A stored payload, state or result no longer decodes as its type; recovery stops."""


class KeyedStateError(CheckpointError, ValueError):
    """A keyed-state key whose encoding is longer than a ledger keeps (``MAX_KEY_BYTES``)."""


class StoreDamagedError(CheckpointError):
    """A record the store's other records name is missing (a stream's group without its frontier).

    The store is damaged; nothing was changed and recovery stops. It is never
    read as empty history (a new group, a fresh budget).
    """


class CheckpointScopeFailure(Exception):
    """Raised by ``open_child``, exactly this type: the scope's final business failure is confirmed."""

    def __init__(self, scope: str) -> None:
        super().__init__(f"scope {scope!r} failed for good (confirmed)")
        self.scope = scope


class StrayCancellationError(StreamsError):
    """A node's own code raised a cancellation while nothing cancelled its execution: a business failure.

    The execution's cancel scopes decide, not the exception's type: a
    library that raises its own ``CancelledError`` fails the node (a Retry
    may run it again); a cancellation of the execution or its host does not.
    """


class ConfirmedFailureError(StreamsError):
    """A node's (or a retry boundary's) final failure was confirmed earlier; its budget is not refilled.

    The original error is not kept: a new run of the same work needs a new scope (run id).
    """


class RestorePlanError(StreamsError, ValueError):
    """A recovery plan that does not fit the graph; nothing of it was installed."""
