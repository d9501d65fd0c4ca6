"""The records of node checkpoints: what the engine and a store exchange through the node hooks."""

# No postponed annotations: the records are published as streams.X, and msgspec resolves their
# field types where they are defined, now.
import time
from typing import Literal, Self

import msgspec

from ._records import StreamFinish, StreamRef

__all__ = [
    "COMPLETE_CHAIN",
    "AttemptFailure",
    "CheckpointAttempt",
    "CheckpointAttemptRequest",
    "CheckpointChild",
    "CheckpointChildOpened",
    "CheckpointCommit",
    "CheckpointOutput",
    "Conclusion",
    "NodeCheckpoint",
    "Terminal",
]

#: Aspect-chain position of a node's complete chain; a Retry at index i of the chain has i + 1.
COMPLETE_CHAIN = 0
#: The most characters of a failure's message a boundary's record keeps.
MAX_FAILURE_MESSAGE = 1000


class AttemptFailure(msgspec.Struct, frozen=True):
    """A confirmed failure of one attempt: its error's type and message, and when it ran (Unix seconds).

    Kept in the ledger beside the business data it already holds, for an
    operator (``python -m ledger runs show``); spans and metrics carry the
    type only. ``message`` is cut to :data:`MAX_FAILURE_MESSAGE` characters;
    ``started_at`` is None where the attempt's start is not known.
    """

    index: int  # which attempt of its boundary failed, from 0
    error_type: str
    message: str
    started_at: float | None
    failed_at: float

    @classmethod
    def of(cls, exc: BaseException, *, index: int, started_at: float | None) -> Self:
        """The failure ``exc`` of attempt ``index``, confirmed now."""
        return cls(index, type(exc).__qualname__, str(exc)[:MAX_FAILURE_MESSAGE], started_at, time.time())


class CheckpointAttemptRequest(msgspec.Struct, frozen=True):
    """Open or reclaim the attempt of the retry boundary ``(parent, node, position)``."""

    parent: str  # the scope the boundary lives in: an execution's scope or an enclosing attempt's
    node: str
    position: int  # COMPLETE_CHAIN, or the Retry's place in the node's aspect chain plus one
    limit: int  # attempts the boundary allows (1 for the complete chain)


#: How a stream was known to end when a record was made: "" (still open, or not known; never
#: "production ended"), "finished", or "failed" (only a Sub alias may carry it).
Terminal = Literal["", "finished", "failed"]

#: How a node concluded, as its checkpoint confirms it.
Conclusion = Literal["completed", "skipped"]


class CheckpointOutput(msgspec.Struct, frozen=True):
    """One output of a node: its key, ``ready`` with the encoded value, ``skipped``, or a ``stream``.

    A stream port's output is the descriptor of its source (``stream``), never
    values: its messages have records of their own.
    """

    key: str
    state: Literal["ready", "skipped", "stream"]
    value: bytes | None = None
    stream: StreamRef | None = None
    #: The stream's terminal as known when the record was made (:data:`Terminal`).
    terminal: Terminal = ""
    #: A partitioned stream's number of partitions (``stream`` is then the stream they are
    #: partitions of, each ``key#p`` a stream of its own); 0 for a stream of its own.
    partitions: int = 0


class CheckpointAttempt(msgspec.Struct, frozen=True):
    """The boundary's current attempt: its scope, its index (failures confirmed so far), exhausted or not."""

    scope: str
    index: int
    exhausted: bool = False
    values: tuple[CheckpointOutput, ...] = ()  # outputs contributed by confirmed messages (streams)


class NodeCheckpoint(msgspec.Struct, frozen=True):
    """A node's confirmed conclusion (``completed`` or ``skipped``) with an output per provided key."""

    node: str
    reason: Conclusion
    outputs: tuple[CheckpointOutput, ...]


class CheckpointChild(msgspec.Struct, frozen=True, omit_defaults=True):
    """A Sub mount asking for its child's scope under ``parent`` (the mount's current attempt).

    The store keeps the first identity it sees for the scope and refuses a
    different one: the graph, its version and topology fingerprint, the
    fixed values' fingerprint, and the bindings (child input to the parent
    key wired to it). Inputs that already arrived are not part of it. A
    scope kept with ``legacy_fingerprint`` (the child's fingerprint with types
    named with their modules, :attr:`~streams.Topology.legacy_fingerprint`) is the same
    child; the store keeps the identity without it.
    """

    parent: str
    mount: str
    graph: str
    version: str
    fingerprint: str
    fixed: str
    bindings: tuple[tuple[str, str], ...]
    legacy_fingerprint: str | None = None


class CheckpointChildOpened(msgspec.Struct, frozen=True):
    """The child's scope and its confirmed nodes."""

    scope: str
    nodes: tuple[NodeCheckpoint, ...] = ()


class CheckpointCommit(msgspec.Struct, frozen=True):
    """Confirm ``checkpoint`` as the conclusion of the complete-chain attempt ``scope`` in ``parent``.

    ``streams`` are the successful terminals of the streams the node writes,
    confirmed in the same transaction as its record (a writer's failure is
    confirmed alone, with the stream hooks' ``finish``).
    """

    parent: str
    scope: str
    checkpoint: NodeCheckpoint
    streams: tuple[StreamFinish, ...] = ()
    #: When the attempt began to run and when it concluded (Unix seconds; None where not known).
    started_at: float | None = None
    ended_at: float | None = None
