"""Record types passed between the engine and a store through :class:`StreamHooks`.

All are frozen ``msgspec.Struct``\\s. Payloads and states travel as the bytes of
the key's codec: a store never needs the business types to keep its records.
Sequence numbers of a stream start at 1; ``0`` means "none yet".
"""

from __future__ import annotations

from typing import Final

import msgspec

#: The longest encoded key a group's keyed state takes, in bytes (every store keeps at least this).
MAX_KEY_BYTES: Final = 256

__all__ = [
    "AppendBatch",
    "GroupChange",
    "MAX_KEY_BYTES",
    "partition_name",
    "GroupFrontier",
    "KeyedEntry",
    "KeyedRange",
    "KeyedRead",
    "KeyedWrite",
    "MessageAttempt",
    "MessageCommit",
    "MessageFail",
    "MessageOpen",
    "MessageRef",
    "OutputBatch",
    "StoredMessage",
    "StreamFinish",
    "StreamOpen",
    "StreamOpened",
    "StreamRead",
    "StreamRef",
]


class StreamRef(msgspec.Struct, frozen=True, gc=False):
    """A stream's identity: the scope and writer node that own it and its key's name."""

    scope: str
    node: str
    key: str

    def __str__(self) -> str:
        return f"{self.scope}/{self.node}/{self.key}"

    def partition(self, partition: int) -> StreamRef:
        """Partition ``partition`` of the partitioned stream this names: the stream ``key#partition``."""
        return StreamRef(self.scope, self.node, partition_name(self.key, partition))


def partition_name(key: str, partition: int) -> str:
    """The key of partition ``partition`` of stream ``key``: ``key#partition``."""
    return f"{key}#{partition}"


class StreamOpen(msgspec.Struct, frozen=True, gc=False):
    """Open a stream, or reclaim it with a raised generation."""

    ref: StreamRef
    type_name: str
    capacity: int
    groups: tuple[str, ...]
    resumable: bool = False  # the writer promised to continue from its position
    #: Where a group new to the stream starts: "earliest" (sequence 1, refused once compaction
    #: removed messages), "latest" (after the last appended), or the first sequence it handles.
    start: str | int = "earliest"
    #: Acknowledged messages kept for groups added later: compaction leaves the last ``retain``
    #: messages appended even when every group acknowledged them. None keeps the stream's setting
    #: (0 for a new stream).
    retain: int | None = None
    #: A partition of a stream of this many partitions (0: a stream of its own). A stream keeps the
    #: number it was created with: another is refused.
    partitions: int = 0
    #: The message type named with its module (:func:`~streams.store.qualified_type_name`): a
    #: stream whose descriptor names its type so is the same stream. None: only ``type_name``.
    legacy_type_name: str | None = None


class StreamRead(msgspec.Struct, frozen=True, gc=False):
    """Read a stream as it was confirmed, for a process that did not open it: raises no generation.

    ``type_name`` and ``partitions`` are what the reader expects the stream
    to hold and be, as an open names them. ``groups`` are the consumer groups
    whose frontiers are read. ``after`` is the last sequence the reader
    holds: the messages above it are read (None: those above the groups'
    lowest frontier, as an open reads them).
    """

    ref: StreamRef
    type_name: str
    groups: tuple[str, ...]
    partitions: int = 0
    after: int | None = None
    legacy_type_name: str | None = None  # as StreamOpen's


class GroupFrontier(msgspec.Struct, frozen=True, gc=False):
    """A consumer group's confirmed progress on one stream."""

    group: str
    acked_through: int = 0  # contiguous frontier: every seq <= it is acknowledged
    acked_above: tuple[int, ...] = ()  # acknowledged seqs above the frontier, ascending
    state: bytes | None = None  # last committed explicit state
    results: dict[str, bytes] = msgspec.field(default_factory=dict)
    stopped: bool = False
    exhausted: tuple[int, ...] = ()  # seqs whose attempt budget is used up
    failing: tuple[int, ...] = ()  # seqs with confirmed failed attempts, budget left
    attempt: str = ""  # the parent attempt that committed ``state`` and ``results``; another sees neither
    dead_lettered: int = 0  # exhausted messages routed to a dead-letter stream and acknowledged
    active_at: float = 0.0  # wall-clock time (Unix seconds) of the last confirmed ack or failure


class StoredMessage(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One confirmed message of a stream: its sequence number and its encoded payload."""

    seq: int
    payload: bytes


class StreamOpened(msgspec.Struct, frozen=True, gc=False):
    """What a store confirms on open: descriptor, frontiers and unacknowledged tail."""

    ref: StreamRef
    generation: int
    appended: int  # the last confirmed sequence number
    position: int | None  # the send_at cursor of the last confirmed append
    finished: bool
    failed: bool
    groups: tuple[GroupFrontier, ...]
    tail: tuple[StoredMessage, ...]  # messages some group has not acknowledged
    created: bool  # True when this open created the stream

    @classmethod
    def empty(
        cls, ref: StreamRef, groups: tuple[str, ...], *, generation: int = 1, failed: bool = False
    ) -> StreamOpened:
        """A stream without messages: a new one, or (``failed``) one known only by its failure."""
        return cls(
            ref=ref,
            generation=generation,
            appended=0,
            position=None,
            finished=False,
            failed=failed,
            groups=tuple(GroupFrontier(group=group) for group in groups),
            tail=(),
            created=not failed,
        )


class AppendBatch(msgspec.Struct, frozen=True, gc=False):
    """Messages ``first_seq..`` appended by a writer, with the cursor after the last one."""

    ref: StreamRef
    generation: int
    first_seq: int
    payloads: tuple[bytes, ...]
    position: int | None = None


class MessageRef(msgspec.Struct, frozen=True, gc=False):
    """One message as seen by one consumer group, in one generation."""

    ref: StreamRef
    group: str
    generation: int
    seq: int

    def __str__(self) -> str:
        return f"{self.ref}#{self.seq} (group {self.group!r}, generation {self.generation})"


class MessageOpen(msgspec.Struct, frozen=True, gc=False):
    """Reclaim a message's attempt budget and the group's last committed state.

    A budget is keyed by the logical source, group, sequence, processing node
    and parent attempt; the generation only fences.
    """

    message: MessageRef
    node: str
    limit: int
    parent_attempt: str = ""


class MessageAttempt(msgspec.Struct, frozen=True, gc=False):
    """What ``open_message`` and ``fail_message`` confirm of a message in its group: the failed attempts
    before this one, whether its budget is used up, and the group's state the attempt starts from."""

    index: int  # attempts already confirmed failed
    exhausted: bool
    state: bytes | None
    failed_at: float = 0.0  # when the last failure was confirmed (Unix seconds); 0 with none
    error_type: str = ""  # the type of the last confirmed failure's error


class MessageFail(msgspec.Struct, frozen=True, gc=False):
    """Confirm that attempt ``index`` of a message failed."""

    message: MessageRef
    node: str
    limit: int
    index: int
    parent_attempt: str = ""
    error_type: str = ""  # the qualified name of the error's type (never its text)
    at: float = 0.0  # when the attempt failed (Unix seconds): the start of a retry delay


class OutputBatch(msgspec.Struct, frozen=True, gc=False):
    """Output messages staged by one handled message for one stream."""

    ref: StreamRef
    generation: int
    first_seq: int
    payloads: tuple[bytes, ...]


class KeyedWrite(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One key of a group's keyed state set (``value``) or deleted (``value`` None) by a commit."""

    key: bytes
    value: bytes | None = None


class KeyedEntry(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One confirmed key of a group's keyed state and its encoded value."""

    key: bytes
    value: bytes


class KeyedRead(msgspec.Struct, frozen=True, gc=False):
    """Read keys of a group's keyed state as parent attempt ``parent_attempt`` sees it.

    An attempt other than the one that last committed for the group sees no
    key at all, as it sees none of that attempt's explicit state.
    """

    ref: StreamRef
    group: str
    keys: tuple[bytes, ...]
    parent_attempt: str = ""


class KeyedRange(msgspec.Struct, frozen=True, gc=False):
    """List a group's confirmed keys in byte order, from ``start`` (included) to ``stop`` (excluded)."""

    ref: StreamRef
    group: str
    start: bytes = b""
    stop: bytes | None = None  # None: to the last key
    limit: int = 100


class MessageCommit(msgspec.Struct, frozen=True, gc=False):
    """Everything one handled message confirms: ack, state, keyed state, results, outputs, stop.

    With ``through`` set it confirms a run of consecutive messages of the
    group, ``message.seq`` to ``through``, handled in order by one node:
    their acks, the last state set, their results merged in order, their
    outputs in order (one batch per output stream) and a stop after the
    last. A store applies it exactly as that many single commits.
    """

    message: MessageRef
    node: str = ""
    attempt: int = 0  # of the first message; the others of a run had theirs at this index too
    state: bytes | None = None  # None: the state is unchanged
    results: dict[str, bytes] = msgspec.field(default_factory=dict)
    outputs: tuple[OutputBatch, ...] = ()
    stop: bool = False
    parent_attempt: str = ""
    through: int = 0  # 0: the one message ``message.seq``; else the last sequence of the run
    #: The message exhausted its budget in ``node``: its one output is its dead letter, and the
    #: ack moves the group past it (a message not exhausted is refused).
    dead_letter: bool = False
    #: With ``dead_letter``: the attempt limit the message used up (it may be lower than when its
    #: failures were confirmed); 0 trusts the budget's own exhausted mark only.
    limit: int = 0
    #: The keys of the group's keyed state this commit sets or deletes, in the order made; in a run,
    #: every message's writes in order (the last write of a key holds).
    keyed: tuple[KeyedWrite, ...] = ()

    @property
    def last_seq(self) -> int:
        """The last sequence this commit acknowledges."""
        return self.through or self.message.seq

    @property
    def count(self) -> int:
        """How many messages this commit acknowledges."""
        return max(self.through - self.message.seq + 1, 0) if self.through else 1


class GroupChange(msgspec.Struct, frozen=True, gc=False):
    """An operator's change of one consumer group: remove it, or move its frontier.

    ``move`` sets where the group's next message is (``"earliest"``,
    ``"latest"`` or a sequence, as a new group's start) and forgets its
    failures, exhausted messages, dead budgets and stop; ``keep_state``
    keeps its explicit state, keyed state and results, else all three are
    cleared. A removal deletes the group's keyed state with it. Either
    change raises the stream's generation: endpoints open on it are fenced
    off and must reopen.
    """

    ref: StreamRef
    group: str
    remove: bool = False
    to: str | int = "earliest"
    keep_state: bool = True


class StreamFinish(msgspec.Struct, frozen=True, gc=False):
    """Confirm the writer's terminal: finished, or failed."""

    ref: StreamRef
    generation: int
    failed: bool = False
