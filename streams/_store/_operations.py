"""The operations behind every :class:`StreamHooks` call, written once over a record view.

A store supplies a :class:`~streams.store.RecordView`: get and put its four
kinds of record inside one transaction. The functions here read, check and write through it;
a store runs each call in one transaction of its own and commits it only if
the function returns. :class:`~streams.MemoryStore` runs them over dicts, the
LMDB ledger over an LMDB write transaction, so both keep the same ledger.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from .._errors import (
    CompactedHistoryError,
    KeyedStateError,
    PartitionError,
    PayloadTypeError,
    SequenceError,
    StoreDamagedError,
    StreamFinishedError,
    UnknownStreamError,
)
from ._layouts import AttemptRecord, StreamDescriptor
from ._marks import marked
from ._records import (
    MAX_KEY_BYTES,
    AppendBatch,
    GroupChange,
    GroupFrontier,
    KeyedEntry,
    KeyedRange,
    KeyedRead,
    KeyedWrite,
    MessageAttempt,
    MessageCommit,
    MessageFail,
    MessageOpen,
    MessageRef,
    StoredMessage,
    StreamFinish,
    StreamOpen,
    StreamOpened,
    StreamRead,
    StreamRef,
)
from ._rules import (
    FrontierDraft,
    Subject,
    check_appendable,
    check_generation,
    is_acked,
    min_frontier,
    partitioned,
    reopen,
    same_type,
    state_for,
    type_change,
)
from ._view import AttemptKey, RecordView

__all__ = [
    "append",
    "change_group",
    "commit",
    "describe",
    "fail_message",
    "finish",
    "list_keyed",
    "open_message",
    "open_stream",
    "read_keyed",
    "read_stream",
]


def _descriptor(view: RecordView, ref: StreamRef, what: object) -> StreamDescriptor:
    desc = view.get_descriptor(ref)
    if desc is None:
        raise UnknownStreamError(f"{what}: stream {ref} was never opened in this store")
    return desc


def _frontier(view: RecordView, desc: StreamDescriptor, group: str, what: object) -> GroupFrontier:
    frontier = view.get_group(desc.ref, group)
    if frontier is None and group in desc.groups:
        raise _missing_frontier(desc, group, what)
    if frontier is None:
        raise UnknownStreamError(f"{what}: stream {desc.ref} has no consumer group {group!r}")
    return frontier


def _missing_frontier(desc: StreamDescriptor, group: str, what: object) -> StoreDamagedError:
    return StoreDamagedError(
        f"{what}: stream {desc.ref} lists consumer group {group!r}, whose frontier is missing from "
        "the store; the store is damaged: restore it from a copy (nothing was changed)"
    )


def _check_stored(desc: StreamDescriptor, floor: int, stored: list[StoredMessage]) -> None:
    """Every message above the groups' floor, through the last appended, is in the store, in order."""
    expected = range(floor + 1, desc.appended + 1)
    if (
        floor >= desc.compacted_through
        and len(stored) == len(expected)
        and all(m.seq == seq for m, seq in zip(stored, expected, strict=True))
    ):
        return
    found = f"{len(stored)} message(s)" + (f", {stored[0].seq} to {stored[-1].seq}" if stored else "")
    raise StoreDamagedError(
        f"open: stream {desc.ref} should hold messages {floor + 1} to {desc.appended} for its groups "
        f"(compacted through {desc.compacted_through}), the store has {found}; "
        "the store is damaged: restore it from a copy (nothing was changed)"
    )


def _attempt_key(message: MessageRef, node: str, parent_attempt: str, seq: int | None = None) -> AttemptKey:
    """The budget of ``message`` (or of message ``seq`` of the run starting there)."""
    return AttemptKey(message.ref, message.group, message.seq if seq is None else seq, node, parent_attempt)


def open_stream(view: RecordView, request: StreamOpen) -> StreamOpened:
    view.load(descriptors=(request.ref,), groups=[(request.ref, g) for g in request.groups])
    current = view.get_descriptor(request.ref)
    desc = reopen(current, request)
    view.put_descriptor(desc)
    frontiers: list[GroupFrontier] = []
    for group in desc.groups:
        frontier = view.get_group(desc.ref, group)
        if frontier is None:
            if current is not None and group in current.groups:
                raise _missing_frontier(desc, group, "open")
            frontier = GroupFrontier(group=group, acked_through=start_of(desc, group, request.start))
            view.put_group(desc.ref, frontier)
        frontiers.append(frontier)
    floor = min_frontier(frontiers, desc.appended)
    reading = [f for f in frontiers if not f.stopped]
    stored = list(view.messages_after(desc.ref, floor))
    _check_stored(desc, floor, stored)
    tail = tuple(m for m in stored if not all(is_acked(f, m.seq) for f in reading))
    return StreamOpened(
        ref=desc.ref,
        generation=desc.generation,
        appended=desc.appended,
        position=desc.position,
        finished=desc.finished,
        failed=desc.failed,
        groups=tuple(frontiers),
        tail=tail,
        created=current is None,
    )


def describe(view: RecordView, ref: StreamRef) -> StreamDescriptor | None:
    """The descriptor of stream ``ref`` as the store holds it, or None: reads, never writes.

    Unlike :func:`open_stream` it raises no generation, so a caller can
    verify a stream it must not open (its terminal, generation and type).
    """
    view.load(descriptors=(ref,))
    return view.get_descriptor(ref)


def read_stream(view: RecordView, request: StreamRead) -> StreamOpened | None:
    """Stream ``request.ref`` as confirmed, with its groups' frontiers and the messages a reader lacks.

    A read, as :func:`describe` is: it raises no generation, so the writer
    of the stream, in another process, goes on writing. None if the store
    never had the stream. A stream of another type or another number of
    partitions than the request names is refused (:class:`PayloadTypeError`,
    :class:`PartitionError`), and a group it does not have
    (:class:`UnknownStreamError`). The messages are those above
    ``request.after`` (or above the groups' lowest frontier), through the
    last appended; messages compaction removed there are
    :class:`CompactedHistoryError`, never a silent gap.
    """
    ref = request.ref
    view.load(descriptors=(ref,), groups=[(ref, g) for g in request.groups])
    desc = view.get_descriptor(ref)
    if desc is None:
        return None
    if not same_type(desc, request):
        raise PayloadTypeError(
            f"stream {ref} holds {desc.type_name} messages, not "
            f"{request.type_name}{type_change(desc.type_name, request.type_name)}"
        )
    if desc.partitions != request.partitions:
        raise PartitionError(
            f"stream {ref} is {partitioned(desc.partitions)}, "
            f"but was read as {partitioned(request.partitions)}"
        )
    frontiers = tuple(_frontier(view, desc, g, "read") for g in request.groups)
    floor = min_frontier(list(frontiers), desc.appended) if request.after is None else request.after
    if floor < desc.compacted_through:
        raise CompactedHistoryError(
            f"read of stream {ref} after {floor}: messages through {desc.compacted_through} were compacted"
        )
    if floor > desc.appended:
        raise SequenceError(f"read of stream {ref} after {floor}: only {desc.appended} were appended")
    stored = list(view.messages_after(ref, floor)) if floor < desc.appended else []
    _check_stored(desc, floor, stored)
    return StreamOpened(
        ref=ref,
        generation=desc.generation,
        appended=desc.appended,
        position=desc.position,
        finished=desc.finished,
        failed=desc.failed,
        groups=frontiers,
        tail=tuple(stored),
        created=False,
    )


def start_of(desc: StreamDescriptor, group: str, start: str | int) -> int:
    """The frontier a group new to ``desc`` starts at: the sequence before the first it handles.

    Never a silent jump: a start at messages compaction removed is refused.
    """
    if start == "latest":
        return desc.appended
    first = 1 if start == "earliest" else start
    if not isinstance(first, int) or isinstance(first, bool) or first < 1:
        raise ValueError(f"a group starts at 'earliest', 'latest' or a sequence of at least 1, not {start!r}")
    if first <= desc.compacted_through:
        raise CompactedHistoryError(
            f"group {group!r} cannot start at sequence {first} of stream {desc.ref}: messages 1 to "
            f"{desc.compacted_through} were acknowledged by every group and compacted away; start it "
            f"at 'latest' or at a sequence from {desc.compacted_through + 1}"
        )
    if first > desc.appended + 1:
        raise SequenceError(
            f"group {group!r} cannot start at sequence {first} of stream {desc.ref}: only "
            f"{desc.appended} messages were appended (start at most at {desc.appended + 1})"
        )
    return first - 1


def append(view: RecordView, batch: AppendBatch) -> None:
    view.load(descriptors=(batch.ref,))
    desc = _descriptor(view, batch.ref, "append")
    check_appendable(desc, batch.generation, batch.first_seq, "append")
    view.put_messages(desc.ref, batch.first_seq, batch.payloads)
    now_ms = int(time.time() * 1000)
    view.put_descriptor(
        msgspec.structs.replace(
            desc,
            appended=desc.appended + len(batch.payloads),
            position=desc.position if batch.position is None else batch.position,
            marks=marked(desc.marks, batch.first_seq, now_ms, desc.compacted_through)
            if batch.payloads
            else desc.marks,
        )
    )


def open_message(view: RecordView, request: MessageOpen) -> MessageAttempt:
    message = request.message
    _load_message(view, message, _attempt_key(message, request.node, request.parent_attempt))
    desc = _descriptor(view, message.ref, f"open of {message}")
    check_generation(desc, message.generation, f"open of {message}")
    frontier = _frontier(view, desc, message.group, f"open of {message}")
    if message.seq < 1 or message.seq > desc.appended:
        raise SequenceError(f"open of {message}: sequence {message.seq} was never appended")
    if is_acked(frontier, message.seq):
        raise SequenceError(f"open of {message}: already acknowledged")
    record = view.get_attempt(_attempt_key(message, request.node, request.parent_attempt))
    state = state_for(frontier, request.parent_attempt)
    if record is None:
        return MessageAttempt(index=0, exhausted=request.limit <= 0, state=state)
    return MessageAttempt(
        index=record.failures,
        exhausted=record.failures >= request.limit or record.exhausted,
        state=state,
        failed_at=record.failed_at,
        error_type=record.error_type,
    )


def fail_message(view: RecordView, request: MessageFail) -> MessageAttempt:
    message = request.message
    what = f"failure of {message}"
    _load_message(view, message, _attempt_key(message, request.node, request.parent_attempt))
    desc = _descriptor(view, message.ref, what)
    check_generation(desc, message.generation, what)
    frontier = _frontier(view, desc, message.group, what)
    if is_acked(frontier, message.seq) or message.seq > desc.appended:
        raise SequenceError(f"{what}: the message is acknowledged or was never appended")
    key = _attempt_key(message, request.node, request.parent_attempt)
    record = view.get_attempt(key)
    failures = 0 if record is None else record.failures
    if failures != request.index or (record is not None and record.exhausted):
        raise SequenceError(
            f"{what}: attempt {request.index} is not the open attempt ({failures} confirmed failures)"
        )
    exhausted = failures + 1 >= request.limit
    failed_at = request.at or time.time()
    view.put_attempt(key, AttemptRecord(failures + 1, exhausted, failed_at, request.error_type))
    failing = tuple(s for s in frontier.failing if s != message.seq)
    if exhausted:
        frontier = msgspec.structs.replace(
            frontier,
            exhausted=tuple(sorted({*frontier.exhausted, message.seq})),
            failing=failing,
            active_at=failed_at,
        )
    else:
        frontier = msgspec.structs.replace(
            frontier, failing=tuple(sorted((*failing, message.seq))), active_at=failed_at
        )
    view.put_group(desc.ref, frontier)
    return MessageAttempt(
        index=failures + 1,
        exhausted=exhausted,
        state=state_for(frontier, request.parent_attempt),
        failed_at=failed_at,
        error_type=request.error_type,
    )


class _StreamDraft:
    """A stream descriptor being extended by the outputs of a commit batch."""

    __slots__ = ("appended", "desc", "first", "payloads")

    def __init__(self, desc: StreamDescriptor) -> None:
        self.desc = desc
        self.appended = desc.appended
        self.first = 0
        self.payloads: list[bytes] = []


def commit(view: RecordView, commits: Sequence[MessageCommit]) -> None:
    """Apply every commit in order; the caller's transaction makes the batch all or nothing.

    The batch works on one draft per group and per output stream and writes
    each changed record once, so its cost per message is a few comparisons.
    """
    streams: dict[StreamRef, _StreamDraft] = {}
    groups: dict[tuple[StreamRef, str], tuple[_StreamDraft, FrontierDraft]] = {}
    _load_commits(view, commits)

    def stream(ref: StreamRef, what: str, message: MessageRef) -> _StreamDraft:
        draft = streams.get(ref)
        if draft is None:
            draft = streams[ref] = _StreamDraft(_descriptor(view, ref, Subject(what, message)))
        return draft

    # A batch usually holds the messages of one group writing one output stream: the
    # drafts of the last message are reused when its stream objects are the same.
    last_ref: StreamRef | None = None
    last_group = ""
    last_out: StreamRef | None = None
    target: _StreamDraft | None = None
    for c in commits:
        message = c.message
        if message.ref is not last_ref or message.group != last_group:
            key = (message.ref, message.group)
            entry = groups.get(key)
            if entry is None:
                source = stream(message.ref, "commit of", message)
                frontier = _frontier(view, source.desc, message.group, Subject("commit of", message))
                entry = groups[key] = (source, FrontierDraft(frontier))
            source, group = entry
            last_ref, last_group = message.ref, message.group
        first = message.seq
        last = c.through or first
        if message.generation != source.desc.generation:
            check_generation(source.desc, message.generation, Subject("commit of", message))
        if group.stopped:
            raise SequenceError(f"commit of {message}: group {message.group!r} stopped handling this stream")
        if last < first:
            raise SequenceError(f"commit of {message}: its run ends at {last}, before it starts")
        if first < 1 or last > source.appended:
            seq = first if first < 1 or first > source.appended else source.appended + 1
            raise SequenceError(f"ack of {_at(message, seq)}: sequence {seq} was never appended")
        if c.dead_letter:
            _check_dead_letter(c)
        if (
            first == group.acked_through + 1
            and not group.acked_above
            and not group.exhausted
            and not group.failing
            and c.attempt == 0
            and not c.dead_letter
        ):
            group.acked_through = last  # the common case: a run from the frontier, nothing pending
        else:
            for seq in range(first, last + 1):
                _ack(view, group, c, seq)
        if c.parent_attempt != group.attempt:
            # another parent attempt takes the group over: none of the last one's state reaches it
            group.own(c.parent_attempt)
            view.clear_keyed(message.ref, message.group)
        if c.keyed:
            _write_keyed(view, c, c.keyed)
        if c.state is not None:
            group.state = c.state
        if c.results:
            group.results.update(c.results)
        if c.stop:
            group.stopped = True
        for out in c.outputs:
            if out.ref is not last_out or target is None:
                target = streams.get(out.ref) or stream(out.ref, "output of", message)
                last_out = out.ref
            if not target.payloads:
                check_appendable(target.desc, out.generation, out.first_seq, Subject("output of", message))
                target.first = out.first_seq
            elif out.generation != target.desc.generation or out.first_seq != target.appended + 1:
                check_appendable(
                    msgspec.structs.replace(target.desc, appended=target.appended),
                    out.generation,
                    out.first_seq,
                    Subject("output of", message),
                )
            target.payloads.extend(out.payloads)
            target.appended += len(out.payloads)
    now = time.time()
    for draft in streams.values():
        if draft.payloads:
            desc = draft.desc
            view.put_messages(desc.ref, draft.first, draft.payloads)
            marks = marked(desc.marks, draft.first, int(now * 1000), desc.compacted_through)
            view.put_descriptor(msgspec.structs.replace(desc, appended=draft.appended, marks=marks))
    for (ref, _), (_, group) in groups.items():
        group.active_at = now
        view.put_group(ref, group.record())
    for ref in {ref for ref, _ in groups}:
        _maybe_compact(view, ref)


def _write_keyed(view: RecordView, c: MessageCommit, writes: tuple[KeyedWrite, ...]) -> None:
    ref, group = c.message.ref, c.message.group
    for write in writes:
        if len(write.key) > MAX_KEY_BYTES:
            raise KeyedStateError(
                f"commit of {c.message}: a keyed-state key of {len(write.key)} bytes; a ledger keeps keys "
                f"of at most {MAX_KEY_BYTES} bytes (nothing was confirmed)"
            )
        view.put_keyed(ref, group, write.key, write.value)


def read_keyed(view: RecordView, request: KeyedRead) -> tuple[bytes | None, ...]:
    """The values of ``request.keys`` in the group's keyed state as its parent attempt sees it: reads only.

    The keyed state belongs to the parent attempt that last committed for the
    group (the frontier's ``attempt``); any other attempt sees no key.
    """
    ref, group = request.ref, request.group
    what = f"keyed read of group {group!r}"
    view.load(descriptors=(ref,), groups=((ref, group),))
    frontier = _frontier(view, _descriptor(view, ref, what), group, what)
    if frontier.attempt != request.parent_attempt or not request.keys:
        return (None,) * len(request.keys)
    return tuple(view.get_keyed(ref, group, request.keys))


def list_keyed(view: RecordView, request: KeyedRange) -> tuple[KeyedEntry, ...]:
    """Up to ``request.limit`` confirmed keys of a group's keyed state, in byte order: reads only."""
    ref, group = request.ref, request.group
    what = f"keyed listing of group {group!r}"
    if request.limit < 0:
        raise ValueError(f"{what}: a limit is at least 0, not {request.limit}")
    view.load(descriptors=(ref,), groups=((ref, group),))
    _frontier(view, _descriptor(view, ref, what), group, what)
    if request.limit == 0 or (request.stop is not None and request.stop <= request.start):
        return ()
    return tuple(view.keyed_range(ref, group, request.start, request.stop, request.limit))


def _load_message(view: RecordView, message: MessageRef, budget: AttemptKey) -> None:
    view.load(descriptors=(message.ref,), groups=((message.ref, message.group),), attempts=(budget,))


def _load_commits(view: RecordView, commits: Sequence[MessageCommit]) -> None:
    """Read ahead what a batch of commits touches: its streams, then every group of the committed ones.

    Every group, not only the committing ones: compaction reads them all.
    """
    sources = {c.message.ref: None for c in commits}
    view.load(descriptors=[*sources, *(out.ref for c in commits for out in c.outputs)])
    view.load(
        groups=[
            (ref, group)
            for ref in sources
            if (desc := view.get_descriptor(ref)) is not None
            for group in desc.groups
        ]
    )


def _at(message: MessageRef, seq: int) -> MessageRef:
    """``message``, or the message ``seq`` of a run that starts there."""
    return message if seq == message.seq else msgspec.structs.replace(message, seq=seq)


def _ack(view: RecordView, group: FrontierDraft, c: MessageCommit, seq: int) -> None:
    """Acknowledge message ``seq`` of commit ``c``, forgetting its budget if it had failures."""
    if seq <= group.acked_through or (group.acked_above and group.is_acked(seq)):
        raise SequenceError(f"ack of {_at(c.message, seq)}: already acknowledged")
    key = _attempt_key(c.message, c.node, c.parent_attempt, seq)
    forget_attempt = c.attempt > 0
    if c.dead_letter:
        record = view.get_attempt(key)
        if record is None or not (record.exhausted or 0 < c.limit <= record.failures):
            raise SequenceError(
                f"dead letter of {_at(c.message, seq)}: the message has not exhausted its attempt "
                f"budget in node {c.node!r}; only an exhausted message is dead-lettered"
            )
        group.exhausted.discard(seq)
        group.dead_lettered += 1
        forget_attempt = True
    elif group.exhausted and seq in group.exhausted:
        record = view.get_attempt(key)
        if record is not None and record.exhausted:
            raise SequenceError(
                f"commit of {_at(c.message, seq)}: the message exhausted its attempt budget in this node"
            )
        group.exhausted.discard(seq)
        forget_attempt = True
    group.ack(seq)
    if group.failing:
        group.failing.discard(seq)
    if forget_attempt:
        view.delete_attempt(key)


def _check_dead_letter(c: MessageCommit) -> None:
    """A dead-letter commit acknowledges its one message with its dead letter, and nothing else."""
    if c.through or c.state is not None or c.results or c.stop or c.keyed:
        raise SequenceError(
            f"dead letter of {c.message}: a dead-letter commit acknowledges one message and sets "
            "no state, keyed state, results or stop"
        )
    if len(c.outputs) != 1 or len(c.outputs[0].payloads) != 1:
        raise SequenceError(
            f"dead letter of {c.message}: the commit must carry exactly one message, its dead letter"
        )


#: Acknowledged messages are removed in chunks of at least this many.
COMPACT_CHUNK = 1024


def _maybe_compact(view: RecordView, ref: StreamRef) -> None:
    desc = view.get_descriptor(ref)
    if desc is None:
        return
    frontiers = [_frontier(view, desc, g, "compaction") for g in desc.groups]
    acked = min_frontier(frontiers, desc.appended)
    floor = min(acked, desc.appended - desc.retain)  # the last ``retain`` messages stay
    if floor - desc.compacted_through >= COMPACT_CHUNK or (
        floor > desc.compacted_through and acked == desc.appended and (desc.finished or desc.failed)
    ):
        view.compact(desc.ref, floor)
        view.put_descriptor(msgspec.structs.replace(desc, compacted_through=floor))


def finish(view: RecordView, request: StreamFinish) -> None:
    desc = _descriptor(view, request.ref, "finish")
    check_generation(desc, request.generation, "finish")
    if desc.finished or desc.failed:
        if desc.failed == request.failed:
            return
        raise StreamFinishedError(f"finish of stream {desc.ref}: it already ended the other way")
    view.put_descriptor(msgspec.structs.replace(desc, finished=not request.failed, failed=request.failed))
    _maybe_compact(view, desc.ref)


def change_group(view: RecordView, change: GroupChange) -> GroupFrontier | None:
    """Remove or move a consumer group (an operator's repair); returns the moved frontier.

    Every budget the group holds goes with it, and its keyed state with a
    removal or a move that does not keep state; the stream's generation is
    raised, so endpoints still open on the stream are fenced off. Removing
    frees what the group held back: compaction runs again without it.
    """
    ref, name = change.ref, change.group
    what = f"{'removal' if change.remove else 'move'} of group {name!r}"
    view.load(descriptors=(ref,))
    desc = _descriptor(view, ref, what)
    view.load(groups=[(ref, g) for g in desc.groups])
    if name not in desc.groups:
        listed = ", ".join(repr(g) for g in desc.groups) or "none"
        raise UnknownStreamError(
            f"{what}: stream {ref} has no consumer group {name!r} (its groups: {listed})"
        )
    frontier = _frontier(view, desc, name, what)
    moved: GroupFrontier | None = None
    if change.remove or not change.keep_state:
        view.clear_keyed(ref, name)
    if change.remove:
        view.delete_group(ref, name)
        groups = tuple(g for g in desc.groups if g != name)
    else:
        moved = GroupFrontier(
            group=name,
            acked_through=start_of(desc, name, change.to),
            state=frontier.state if change.keep_state else None,
            results=dict(frontier.results) if change.keep_state else {},
            attempt=frontier.attempt if change.keep_state else "",
            dead_lettered=frontier.dead_lettered,
            active_at=time.time(),
        )
        view.put_group(ref, moved)
        groups = desc.groups
    view.delete_budgets(ref, name)
    view.put_descriptor(msgspec.structs.replace(desc, groups=groups, generation=desc.generation + 1))
    _maybe_compact(view, ref)
    return moved
