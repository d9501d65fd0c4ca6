"""Managed stream endpoints: one shared endpoint per stream, writers and readers on it.

A :class:`ManagedStream` is the single in-process endpoint of a stream in a
scope: one open, one tail, one delivery ledger, shared by every writer and
reader handle. Messages become visible to readers only after the store
confirmed their append (or the commit that staged them); readers in one
consumer group share its messages, each group sees every message.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, Final, Generic, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from ._codec import Codec
from ._errors import (
    CheckpointError,
    GroupBusyError,
    StreamClosedError,
    StreamFailedError,
    StreamStateError,
)
from ._keys import Key, Stream, refuse_as_key_types
from ._metrics import (
    INSTRUMENTS,
    destination_attributes,
    forget_stream,
    group_attributes,
    observe_stream,
    stream_attributes,
)
from ._outcome import is_fault
from ._pipeline import ConfirmPipeline
from ._store._hooks import FollowHooks, StreamHooks
from ._store._records import (
    AppendBatch,
    GroupFrontier,
    MessageCommit,
    MessageRef,
    StreamFinish,
    StreamOpened,
    StreamRead,
    StreamRef,
)
from ._store._rules import FrontierDraft, min_frontier
from ._tracing import ATTR
from ._type_names import qualified_type_name

__all__ = [
    "GroupSnapshot",
    "ManagedStream",
    "Message",
    "StreamCore",
    "StreamReader",
    "StreamSnapshot",
    "StreamWriter",
    "core_of",
    "frontier_of",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)

#: How often a full writer reads its groups' frontiers from the store (seconds).
FRONTIER_POLL_SECONDS: Final = 0.2

#: Holds the place of a recovered message that every group reading acknowledged already.
_GAP: Final = object()


def _context_of(appends: _Appends[Any]) -> contextvars.Context:
    """Where a batch's ``append`` runs: the writer's context variables at its first send."""
    assert appends.context is not None, "a batch confirmed holds a send"
    return appends.context


class Message(Generic[T_co]):
    """A delivered message: its sequence number in the stream and its value."""

    __slots__ = ("group", "seq", "value")

    def __init__(self, seq: int, value: T_co, group: str) -> None:
        self.seq = seq
        self.value = value
        self.group = group

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, group={self.group!r})"


class GroupSnapshot(msgspec.Struct, frozen=True):
    """One consumer group in a :class:`StreamSnapshot`: its contiguous frontier, the confirmed messages
    it has not acknowledged yet, how many used their whole budget, and whether it stopped reading."""

    group: str
    acked_through: int
    pending: int
    exhausted: int
    stopped: bool


class StreamSnapshot(msgspec.Struct, frozen=True):
    """A values-free view of a stream endpoint."""

    key: str
    scope: str
    node: str
    generation: int
    capacity: int
    appended: int
    position: int | None
    finished: bool
    failed: bool
    groups: tuple[GroupSnapshot, ...]


class _Group(FrontierDraft):
    """One consumer group's in-memory delivery ledger: its frontier plus a delivery cursor."""

    __slots__ = ("claimed", "cursor", "left")

    def __init__(self, frontier: GroupFrontier) -> None:
        super().__init__(frontier)
        self.cursor = frontier.acked_through  # the last sequence handed to a reader
        self.claimed = False
        self.left = False  # its reader node concluded: it holds the writer back no more (in memory)


class _Appends(Generic[T]):
    """A writer's appends as cut for one store call: the batch, and the values to publish after it."""

    __slots__ = ("batch", "context", "values")

    def __init__(self, batch: AppendBatch, values: list[T], context: contextvars.Context | None) -> None:
        self.batch = batch
        self.values = values
        self.context = context  # the writer's context variables at the batch's first send


class StreamCore(Generic[T]):
    """The engine's side of a stream endpoint: its state and the operations handlers and handles use.

    :class:`ManagedStream` is the public façade over it; readers, writers and
    ``handle_messages`` reach the stream through this named API (``reserve``,
    ``publish``, ``take_ready``, ``local_ack_many``, ``latch``, ...), never
    through private members.
    """

    def __init__(
        self,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
        hooks: StreamHooks,
        key: Key[Stream[T]],
        ref: StreamRef,
        opened: StreamOpened,
        *,
        capacity: int,
        resumable: bool,
        on_latch: Callable[[CheckpointError], object] | None = None,
        node_owned: bool = False,
        partitions: int = 0,
        template: str | None = None,
        graph: str | None = None,
    ) -> None:
        self._spawn = spawn  # runs the background flush in the scope's task group
        self._on_latch = on_latch  # an execution's failure latch, which this stream's failures trip too
        #: Written by a graph node: it ends with the node (its success is confirmed with the node's
        #: record), so the writer handle can neither finish nor fail it.
        self.node_owned = node_owned
        self.key = key
        self.ref = ref
        self.hooks: StreamHooks = hooks
        self.codec: Codec[T] = Codec(key.item_type)
        self.what = f"stream {ref}"
        self.capacity = capacity
        self.resumable = resumable
        self.partitions = partitions  # of the partitioned stream it is a partition of (0: none)
        self._reads_frontiers = isinstance(hooks, FollowHooks)  # a protocol check is slow: made once
        self.generation = opened.generation
        self.finished = opened.finished
        self.failed = opened.failed
        self.position = opened.position
        self._confirmed = opened.appended  # the last confirmed sequence
        self.next_seq = opened.appended + 1  # the next sequence to assign
        # The values of sequences _evicted_through + 1 .. _confirmed, in order: what some
        # group still reading has not acknowledged (a recovered tail leaves _GAP for the
        # messages every such group acknowledged out of order).
        self._evicted_through = min_frontier(list(opened.groups), opened.appended)
        self._values: list[Any] = [_GAP] * (opened.appended - self._evicted_through)
        for m in opened.tail:
            self._values[m.seq - self._evicted_through - 1] = self.codec.decode(
                m.payload, what=f"message {m.seq} of {self.what}"
            )
        self._groups: dict[str, _Group] = {}
        for frontier in opened.groups:
            group = _Group(frontier)
            self._groups[group.name] = group
        self._group_list = list(self._groups.values())
        self._changed = anyio.Event()
        # Sent, not yet handed to the store: the last sequence numbers assigned.
        self._pending_values: list[T] = []
        self._pending_payloads: list[bytes] = []
        self._pending_position: int | None = None
        self._pending_context: contextvars.Context | None = None  # at the first pending send
        self._appends: ConfirmPipeline[_Appends[T]] = ConfirmPipeline(
            cut=self._cut_appends,
            confirm=self._confirm_appends,
            land=self._land_appends,
            fail=lambda _, exc: self.latch(exc, "an append"),
            context=_context_of,
            spawn=spawn,
            surface=True,  # the scope fails even if no writer waits for this append
        )
        self._broken: CheckpointError | None = None
        self._writer_mode: str | None = None  # "direct" or "handler"
        self._handler_owner: object | None = None  # the handle_messages run writing it
        #: what its metrics name it by: its template (a run's stream without the run's id, or its name)
        self.template = template or str(ref)
        self.destination = destination_attributes(str(ref), template, graph)
        self.append_attributes = stream_attributes(self.destination, "append", "send")  # made once
        observe_stream(self)

    # -- shared state -----------------------------------------------------------------------

    @property
    def confirmed(self) -> int:
        """The last sequence the store confirmed: the last a reader can be handed."""
        return self._confirmed

    def notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_change(self) -> None:
        await self._changed.wait()

    def group(self, name: str) -> _Group:
        try:
            return self._groups[name]
        except KeyError:
            raise StreamStateError(
                f"stream {self.ref} has no consumer group {name!r}; declare it in open_stream(groups=...)"
            ) from None

    def latch(self, cause: BaseException, what: str = "a confirmation") -> CheckpointError:
        """Latch a failure of the reliable layer: every later operation raises the same error."""
        if self._broken is None:
            if isinstance(cause, CheckpointError):
                self._broken = cause
            else:
                error = CheckpointError(
                    f"{what} on stream {self.ref} failed; its outcome is unknown: reopen to recover"
                )
                error.__cause__ = cause
                self._broken = error
        self.notify()
        assert isinstance(self._broken, CheckpointError)
        if self._on_latch is not None:
            self._on_latch(self._broken)
        return self._broken

    def check_healthy(self) -> None:
        if self._broken is not None:
            raise self._broken  # the same error the failed operation raised, not a second one

    def floor(self) -> int:
        """The largest sequence every group still reading acknowledged.

        A stopped group reads no more; it holds back neither the writer nor compaction.
        """
        groups = self._group_list
        if len(groups) == 1:
            group = groups[0]
            return self._confirmed if group.stopped or group.left else group.acked_through
        return min((g.acked_through for g in groups if not (g.stopped or g.left)), default=self._confirmed)

    def leave(self, name: str) -> None:
        """Group ``name``'s reader concluded: the writer no longer waits for it to make room."""
        group = self._groups.get(name)
        if group is not None and not group.left:
            group.left = True
            self._evict()
            self.notify()

    def _unacked(self) -> int:
        """Messages assigned but not acknowledged by the slowest group."""
        return self.next_seq - 1 - self.floor()

    async def wait_capacity(self, n: int) -> None:
        """Wait for room for ``n`` messages; a full stream looks at the store's frontiers too.

        Its groups may be handled in other processes (:func:`streams.follow_stream`),
        whose acks this endpoint only sees in the store: while full, and some
        group is not handled by a ``handle_messages`` of this process, it reads
        them after every :data:`FRONTIER_POLL_SECONDS` without a change here
        (a store that can, a :class:`~streams.store.FollowHooks`).
        """
        while self._unacked() + n > self.capacity and self._unacked() > 0:
            self.check_healthy()
            if not self._reads_frontiers or self._all_handled_here():
                await self.wait_change()
                continue
            with anyio.move_on_after(FRONTIER_POLL_SECONDS) as waited:
                await self.wait_change()
            if waited.cancelled_caught:  # nothing changed here meanwhile: the acks may be elsewhere
                await self._read_frontiers()

    def _all_handled_here(self) -> bool:
        """Whether every group still reading is handled in this process (its acks are seen here)."""
        return all(g.claimed or g.stopped or g.left for g in self._group_list)

    async def _read_frontiers(self) -> None:
        request = StreamRead(
            self.ref,
            self.codec.name,
            tuple(g.name for g in self._group_list),
            self.partitions,
            self._confirmed,
            legacy_type_name=qualified_type_name(self.key.item_type),
        )
        assert isinstance(self.hooks, FollowHooks)
        latest = await self.hooks.read_stream(request)  # a read: a failure confirms and changes nothing
        moved = False
        for frontier in latest.groups if latest is not None else ():
            group = self._groups[frontier.group]
            # a group handled elsewhere: what the store confirmed is ahead of what this endpoint saw
            if not group.claimed and frontier.acked_through > group.acked_through:
                group.acked_through = frontier.acked_through
                group.acked_above = [seq for seq in group.acked_above if seq > frontier.acked_through]
                group.cursor = max(group.cursor, frontier.acked_through)
                moved = True
            if not group.claimed and frontier.stopped and not group.stopped:
                group.stopped = moved = True
        if moved:
            self._evict()
            self.notify()

    @property
    def done(self) -> bool:
        """Whether the writer finished or failed (readers may still hold unread messages)."""
        return self.finished or self.failed

    async def wait_done(self) -> None:
        """Wait until the writer's terminal result is confirmed."""
        while not self.done:
            self.check_healthy()
            await self.wait_change()

    def snapshot(self) -> StreamSnapshot:
        """A values-free view of the endpoint."""
        return StreamSnapshot(
            key=self.key.name,
            scope=self.ref.scope,
            node=self.ref.node,
            generation=self.generation,
            capacity=self.capacity,
            appended=self._confirmed,
            position=self.position,
            finished=self.finished,
            failed=self.failed,
            groups=tuple(
                GroupSnapshot(
                    group=g.name,
                    acked_through=g.acked_through,
                    pending=self._confirmed - g.acked_through - len(g.acked_above),
                    exhausted=len(g.exhausted),
                    stopped=g.stopped,
                )
                for g in self._groups.values()
            ),
        )

    # -- the writer side --------------------------------------------------------------------

    def _claim_writer(self, mode: str) -> None:
        if self._writer_mode is None:
            self._writer_mode = mode
        elif self._writer_mode != mode:
            raise StreamStateError(
                f"stream {self.ref} is written by a message handler's staged outputs; "
                "it cannot also take direct sends (and vice versa)"
            )
        if self.done:
            raise StreamClosedError(f"stream {self.ref} already ended; it takes no more messages")

    def claim_for_handler(self, run: object) -> None:
        """Make ``run`` the one handler run whose staged outputs write this stream."""
        self.check_healthy()
        self._claim_writer("handler")
        if self._handler_owner is not None and self._handler_owner is not run:
            raise StreamStateError(
                f"stream {self.ref} is already written by another running message handler; "
                "a stream has one writer node"
            )
        self._handler_owner = run

    def release_handler(self, run: object) -> None:
        """``run`` ended: give back sequence numbers it reserved but never committed."""
        if self._handler_owner is run:
            self._handler_owner = None
            if self._broken is None:
                self.next_seq = self._confirmed + 1
                self.notify()

    def reserve(self, n: int) -> int:
        first = self.next_seq
        self.next_seq += n
        return first

    def publish(self, first_seq: int, values: list[T] | tuple[T, ...], *, notify: bool = True) -> None:
        """Make confirmed messages visible to readers (after their commit)."""
        last = first_seq + len(values) - 1
        # sequences are confirmed in order: these follow the last value held
        assert first_seq == self._evicted_through + 1 + len(self._values), (first_seq, self._confirmed)
        self._values.extend(values)
        if last > self._confirmed:
            self._confirmed = last
        if self.floor() > self._evicted_through:
            self._evict()  # no group still reading needs them (every group stopped)
        if notify:
            self.notify()

    def send_nowait(self, value: T, send_at: int | None) -> None:
        """Stage ``value`` for the next group commit at once: :exc:`anyio.WouldBlock` if the stream is full.

        Refused as :meth:`send` refuses, before the room is looked at; a
        refused value or ``WouldBlock`` stages nothing. No checkpoint: the
        fast path, for a caller that yields when it is full.
        """
        if self._broken is not None or self._writer_mode != "direct" or self.finished or self.failed:
            self._check_writable()
        value, payload = self.codec.prepare(value, what=self.what)
        if self.next_seq - 1 - self.floor() >= self.capacity:
            raise anyio.WouldBlock
        self.next_seq += 1
        self._pending_values.append(value)
        self._pending_payloads.append(payload)
        if send_at is not None:
            self._pending_position = send_at
        if self._pending_context is None:  # the batch's first send: one copy a batch, not a message
            self._pending_context = contextvars.copy_context()
        self._appends.stage()

    async def send(self, value: T, send_at: int | None) -> None:
        """The writer's ``send``: a checkpoint, then :meth:`send_nowait`, waiting for room while it is full.

        The checkpoint comes first, so a cancelled send has staged nothing,
        and nothing is awaited between staging and returning, so a send that
        staged its value is never cancelled after it. After a wait every
        check is made again (the stream may have ended or broken meanwhile).
        """
        await anyio.lowlevel.checkpoint()
        while True:
            try:
                self.send_nowait(value, send_at)
            except anyio.WouldBlock:
                await self.wait_capacity(1)
            else:
                return

    def _check_writable(self) -> None:
        if self._broken is not None:
            raise self._broken
        self._claim_writer("direct")

    # the writer's appends: what was sent since the last cut leaves in one batch

    def _cut_appends(self) -> _Appends[T]:
        values, self._pending_values = self._pending_values, []
        payloads, self._pending_payloads = self._pending_payloads, []
        position, self._pending_position = self._pending_position, None
        context, self._pending_context = self._pending_context, None
        first = self.next_seq - len(values)  # the pending sends are the last assigned
        batch = AppendBatch(self.ref, self.generation, first, tuple(payloads), position)
        return _Appends(batch, values, context)

    async def _confirm_appends(self, appends: _Appends[T]) -> None:
        started = time.perf_counter()
        await self.hooks.append(appends.batch)
        INSTRUMENTS.operation_duration.record(time.perf_counter() - started, self.append_attributes)

    def _land_appends(self, appends: _Appends[T]) -> None:
        if appends.batch.position is not None:
            self.position = appends.batch.position
        self.publish(appends.batch.first_seq, appends.values)
        INSTRUMENTS.sent.add(len(appends.values), self.append_attributes)

    def lags(self) -> Iterator[tuple[str, int]]:
        """Each group still reading, and how many confirmed messages it has not handled."""
        confirmed = self._confirmed
        for group in self._group_list:
            if not (group.stopped or group.left):
                handled_above = sum(1 for seq in group.acked_above if seq <= confirmed)
                yield group.name, max(0, confirmed - group.acked_through - handled_above)

    def close(self) -> None:
        """Its scope ended: the endpoint is no longer reported."""
        forget_stream(self)

    async def flush(self) -> None:
        target = self.next_seq - 1
        while self._confirmed < target:
            self.check_healthy()
            await self.wait_change()

    async def end(self, *, failed: bool) -> None:
        if await self.confirm_end(failed=failed):
            self.confirmed_end(failed=failed)

    async def confirm_end(self, *, failed: bool) -> bool:
        """Confirm the stream's end in the store, telling no reader yet; False if it had ended so already.

        :meth:`confirmed_end` then tells the readers: a writer ending several
        streams tells them all at once, with no checkpoint between them.
        """
        if self.done:
            if self.failed == failed:
                return False
            raise StreamClosedError(f"stream {self.ref} already ended the other way")
        await self.flush()
        self.check_healthy()
        request = StreamFinish(ref=self.ref, generation=self.generation, failed=failed)
        try:
            with anyio.CancelScope(shield=True):
                await self.hooks.finish(request)
        except BaseException as exc:
            if not is_fault(exc, shielded=True):
                raise
            raise self.latch(exc, "finishing")  # noqa: B904 - the latched error keeps its cause
        return True

    def confirmed_end(self, *, failed: bool) -> None:
        """The stream's end is confirmed (by :meth:`end`, or with its writer node's record)."""
        self.finished = not failed
        self.failed = failed
        self.notify()

    # -- the reader side --------------------------------------------------------------------

    def take_ready(self, group: _Group, limit: int) -> tuple[Sequence[int], list[T]]:
        """Hand out up to ``limit`` confirmed, unacknowledged messages in sequence order.

        Returns their sequence numbers and values, as two sequences of equal length.
        """
        seq = max(group.cursor, group.acked_through)
        if not group.acked_above:  # nothing acked out of order: a contiguous range
            end = min(seq + limit, self._confirmed)
            if end <= seq:
                return (), []
            group.cursor = end
            base = self._evicted_through + 1
            return range(seq + 1, end + 1), self._values[seq + 1 - base : end + 1 - base]
        taken: list[int] = []
        while len(taken) < limit and seq < self._confirmed:
            seq += 1
            if not group.is_acked(seq):
                taken.append(seq)
        group.cursor = seq
        base = self._evicted_through + 1
        return taken, [self._values[s - base] for s in taken]

    def at_end(self, group: _Group) -> bool:
        return self.done and max(group.cursor, group.acked_through) >= self._confirmed

    def raise_end(self) -> None:
        if self.failed:
            raise StreamFailedError(f"the writer of stream {self.ref} failed")
        raise anyio.EndOfStream

    def _local_ack(self, group: _Group, seq: int) -> None:
        group.ack(seq)
        self._evict()

    def local_ack_many(self, group: _Group, seqs: Sequence[int]) -> None:
        """Acknowledge committed messages locally, in ascending sequence order."""
        first, last = seqs[0], seqs[-1]
        if (
            first == group.acked_through + 1
            and last - first == len(seqs) - 1
            and (not group.acked_above or group.acked_above[0] > last + 1)
        ):
            group.acked_through = last
        else:
            for seq in seqs:
                group.ack(seq)
        self._evict()

    def _evict(self) -> None:
        floor = self.floor()
        if floor > self._evicted_through:
            del self._values[: floor - self._evicted_through]
            self._evicted_through = floor

    async def ack(self, group: _Group, seq: int) -> None:
        self.check_healthy()
        if seq > self._confirmed or group.is_acked(seq):
            raise StreamStateError(f"stream {self.ref} group {group.name!r}: nothing to ack at {seq}")
        if group.claimed:
            raise GroupBusyError(
                f"group {group.name!r} of stream {self.ref} is consumed by handle_messages; it acks itself"
            )
        message = MessageRef(ref=self.ref, group=group.name, generation=self.generation, seq=seq)
        try:
            with anyio.CancelScope(shield=True):
                await self.hooks.commit([MessageCommit(message=message)])
        except BaseException as exc:
            if not is_fault(exc, shielded=True):
                raise
            raise self.latch(exc, f"the ack of {seq}")  # noqa: B904 - the latched error keeps its cause
        self._local_ack(group, seq)
        INSTRUMENTS.consumed.add(
            1,
            {
                **group_attributes(self.destination, group.name),
                ATTR.OPERATION: "ack",
                ATTR.OPERATION_TYPE: "settle",
            },
        )
        self.notify()

    @property
    def held(self) -> int:
        """How many messages the endpoint holds in memory (those some reading group has not acked)."""
        return len(self._values)


class ManagedStream(Generic[T]):
    """The shared endpoint of one stream. Obtain it from :meth:`StreamScope.open_stream`.

    ``_core`` is the engine's :class:`StreamCore` behind it, for the engine alone.
    """

    __slots__ = ("_core",)

    def __init__(self, core: StreamCore[T]) -> None:
        self._core = core

    def __repr__(self) -> str:
        return f"ManagedStream({self._core.ref}, generation={self._core.generation})"

    @property
    def key(self) -> Key[Stream[T]]:
        return self._core.key

    @property
    def ref(self) -> StreamRef:
        return self._core.ref

    @property
    def generation(self) -> int:
        return self._core.generation

    @property
    def capacity(self) -> int:
        return self._core.capacity

    @property
    def resumable(self) -> bool:
        return self._core.resumable

    @property
    def position(self) -> int | None:
        """The ``send_at`` cursor of the last confirmed message."""
        return self._core.position

    @property
    def finished(self) -> bool:
        return self._core.finished

    @property
    def failed(self) -> bool:
        return self._core.failed

    @property
    def done(self) -> bool:
        """Whether the writer finished or failed (readers may still hold unread messages)."""
        return self._core.done

    async def wait_done(self) -> None:
        """Wait until the writer's terminal result is confirmed (a checkpoint even if it is)."""
        await anyio.lowlevel.checkpoint()
        await self._core.wait_done()

    def snapshot(self) -> StreamSnapshot:
        """A values-free view of the endpoint."""
        return self._core.snapshot()

    def writer(self) -> StreamWriter[T]:
        """The writer handle (the stream has one writer node; handles share its state)."""
        return StreamWriter(self)

    def reader(self, group: str) -> StreamReader[T]:
        """A reader handle in consumer ``group``."""
        return StreamReader(self, group)


def core_of(stream: ManagedStream[T]) -> StreamCore[T]:
    """The engine's :class:`StreamCore` behind ``stream``: how the execution tree ends, flushes and
    leaves the streams it opened, without reaching into the endpoint."""
    return stream._core


def frontier_of(reader: StreamReader[Any]) -> _Group:
    """The frontier draft of ``reader``'s group, shared by every reader of the group: what the
    group's handler advances, without reaching into the reader."""
    return reader._group


class StreamWriter(Generic[T_contra]):
    """The send end of a managed stream.

    Its async operations are checkpoints, as anyio's and trio's are: each
    yields to the scheduler and raises a pending cancellation before it does
    anything, even when it could complete at once, so a loop of sends lets
    other tasks run and can be cancelled at any message. :meth:`send_nowait`
    is the fast path that never yields.
    """

    __slots__ = ("_stream",)

    def __init__(self, stream: ManagedStream[Any]) -> None:
        self._stream = stream

    @property
    def stream(self) -> ManagedStream[Any]:
        return self._stream

    @property
    def position(self) -> int | None:
        """The ``send_at`` cursor of the last confirmed message: where a source continues."""
        return self._stream.position

    @property
    def done(self) -> bool:
        return self._stream.done

    def send(self, value: T_contra, *, send_at: int | None = None) -> Coroutine[Any, Any, None]:
        """Queue ``value`` for the next group commit, waiting while the stream is at capacity.

        ``send_at`` is the source's cursor after this message; once confirmed it
        becomes :attr:`position`. Readers see the message only after the ledger
        confirmed it; :meth:`flush` waits for that. Await it: ``await writer.send(v)``.
        A checkpoint: a send cancelled raises before it queued anything, and
        one that queued its value returns.
        """
        return self._stream._core.send(value, send_at)  # the endpoint's coroutine, not a wrapper

    def send_nowait(self, value: T_contra, *, send_at: int | None = None) -> None:
        """Queue ``value`` at once, as :meth:`send` does, without yielding.

        Raises :exc:`anyio.WouldBlock`, queueing nothing, when the stream holds
        ``capacity`` unacknowledged messages (``await send`` would wait); a
        closed, broken or refused send raises what :meth:`send` raises.
        """
        self._stream._core.send_nowait(value, send_at)

    async def flush(self) -> None:
        """Wait until every message sent so far is confirmed."""
        await anyio.lowlevel.checkpoint()
        await self._stream._core.flush()

    async def finish(self) -> None:
        """Confirm every sent message, then the stream's successful end (``Done``)."""
        await anyio.lowlevel.checkpoint()
        self._check_not_node_owned("finish")
        await self._stream._core.end(failed=False)

    async def fail(self) -> None:
        """Confirm the writer's failure: readers get :class:`StreamFailedError` after the tail."""
        await anyio.lowlevel.checkpoint()
        self._check_not_node_owned("fail")
        await self._stream._core.end(failed=True)

    def _check_not_node_owned(self, what: str) -> None:
        core = self._stream._core
        if core.node_owned:
            raise StreamStateError(
                f"stream {core.ref} is a graph node's output: it cannot {what} it; it ends with the node "
                "(finished once the node's record is confirmed, failed if the node fails)"
            )


class StreamReader(Generic[T_co]):
    """The receive end of a managed stream in one consumer group.

    Its async operations are checkpoints, as :class:`StreamWriter`'s are;
    :meth:`receive_nowait` is the fast path that never yields.
    """

    __slots__ = ("_group", "_stream")

    def __init__(self, stream: ManagedStream[Any], group: str) -> None:
        self._stream = stream
        self._group = stream._core.group(group)

    @property
    def stream(self) -> ManagedStream[Any]:
        return self._stream

    @property
    def group(self) -> str:
        return self._group.name

    @property
    def _frontier(self) -> _Group:
        """The group's frontier draft, shared by every reader of the group (for the engine)."""
        return self._group

    async def receive(self) -> Message[T_co]:
        """The next message of the group; ``anyio.EndOfStream`` after the last one.

        A checkpoint, then waits until a message is confirmed if none is. A
        receive cancelled has taken no message: none is taken between its
        last wait and its return.
        """
        await anyio.lowlevel.checkpoint()
        stream = self._stream._core
        while (message := self._take()) is None:
            await stream.wait_change()
        return message

    def receive_nowait(self) -> Message[T_co]:
        """The group's next confirmed message, as :meth:`receive` returns it, without yielding.

        Raises :exc:`anyio.WouldBlock` when no message is ready now (one sent
        but not yet confirmed is not); at the end of the stream, or for a
        group it may not read, it raises what :meth:`receive` raises.
        """
        message = self._take()
        if message is None:
            raise anyio.WouldBlock
        return message

    def _take(self) -> Message[T_co] | None:
        """The next message, or None if none is ready yet; raises at the end and for a refused group."""
        stream, group = self._stream._core, self._group
        if group.claimed:
            raise GroupBusyError(
                f"group {group.name!r} of stream {stream.ref} is consumed by handle_messages"
            )
        if group.stopped:
            raise StreamStateError(
                f"group {group.name!r} of stream {stream.ref} stopped handling it (a confirmed stop)"
            )
        stream.check_healthy()
        seqs, values = stream.take_ready(group, 1)
        if seqs:
            return Message(seqs[0], values[0], group.name)
        if stream.at_end(group):
            stream.raise_end()
        return None

    async def ack(self, message: Message[Any] | int) -> None:
        """Confirm that the group processed ``message``; the frontier advances contiguously.

        A checkpoint before anything: once the store call started, it
        completes (shielded) and the ack returns.
        """
        await anyio.lowlevel.checkpoint()
        if isinstance(message, Message):
            seq = message.seq
        elif isinstance(message, int) and not isinstance(message, bool):
            seq = message
        else:
            raise TypeError(
                f"ack takes a Message this reader received or its sequence number (an int), "
                f"got {type(message).__qualname__} {message!r}"
            )
        await self._stream._core.ack(self._group, seq)

    def __aiter__(self) -> AsyncIterator[Message[T_co]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message[T_co]]:
        while True:
            try:
                message = await self.receive()
            except anyio.EndOfStream:
                return
            yield message


# a key's type may neither be nor hold these: a stream is declared as Key(name, Stream[T])
refuse_as_key_types(ManagedStream, StreamCore, StreamReader, StreamWriter)
