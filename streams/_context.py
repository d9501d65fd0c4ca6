"""What a node sees while it runs: its inputs, Set/Skip of what it provides, and the slots behind them.

A :class:`Slot` is one key of one graph level, settled once with a value or
``NoValue``; settling it wakes the nodes waiting for it. In ordinary mode
``ctx.set`` settles the slot at once. In checkpoint mode it stages the value
in the node's :class:`WriteSet`, outside the whole aspect chain, and the
slot is settled only after the node's complete record is confirmed.

A node also learns where it runs: its run id, the attempts of the Retry
boundaries around it and an idempotency key for its external effects, each
computed when asked (a node that never asks pays nothing but three fields).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import msgspec

from ._codec import codec_for
from ._errors import OutputError, SkippedInputError
from ._graph import NodeDef, SubDef
from ._handle import Handler, HandleResult, PartitionedResult, handle_messages
from ._keys import Key, NoValue, NoValueType, Stream
from ._partitions import (
    PartitionedReader,
    PartitionedStream,
    PartitionedWriter,
    check_endpoint,
    partitions_of,
)
from ._store._node_records import AttemptFailure, CheckpointAttempt
from ._stream import ManagedStream, StreamReader, StreamWriter

if TYPE_CHECKING:
    from ._execution import _Level

__all__ = ["NodeContext", "NodeSkipped", "Slot", "WriteSet"]

T = TypeVar("T")
_UNSET: Final = object()

#: The context of the Sub mount whose current attempt the running task is inside (set by the
#: mount's Retry): a child node reads the mount's attempts through it.
_MOUNT: ContextVar[NodeContext | None] = ContextVar("streamledger_mount", default=None)


class NodeSkipped(BaseException):
    """``ctx.skip_node()``: a normal skip, not a failure, so no aspect retries or catches it as one."""


class Slot:
    """One key of one graph level: settled once, with a value or ``NoValue``."""

    __slots__ = ("arrived", "listeners", "value")

    def __init__(self) -> None:
        self.arrived = anyio.Event()
        self.value: Any = _UNSET
        self.listeners: list[Callable[[Any], None]] = []

    @property
    def settled(self) -> bool:
        return self.value is not _UNSET

    def settle(self, value: Any) -> None:
        self.value = value
        self.arrived.set()
        for listener in self.listeners:
            listener(value)

    def on_settle(self, listener: Callable[[Any], None]) -> None:
        if self.settled:
            listener(self.value)
        else:
            self.listeners.append(listener)


class WriteSet:
    """A node's outputs staged in checkpoint mode: key -> (value as read back, bytes, or None if skipped)."""

    __slots__ = ("staged",)

    def __init__(self) -> None:
        self.staged: dict[Key[Any], tuple[Any, bytes | None]] = {}

    def mark(self) -> int:
        return len(self.staged)

    def rollback(self, mark: int) -> None:
        """Drop what was staged after ``mark`` (a failed retry attempt's outputs)."""
        for key in list(self.staged)[mark:]:
            del self.staged[key]


class NodeContext:
    """What a node's function and aspects see: its inputs, and Set/Skip for what it provides."""

    __slots__ = ("_attempts", "_level", "_member", "_mount", "_position", "_scopes", "_token", "_writes")

    def __init__(
        self, level: _Level, member: NodeDef | SubDef, *, writes: WriteSet | None = None, scope: str = ""
    ) -> None:
        self._level = level
        self._member = member
        self._writes = writes
        self._scopes = [scope] if scope else []  # the attempt scopes enclosing the running link
        self._attempts: tuple[int, ...] = ()  # the indices of the Retry attempts this chain is inside
        self._mount = _MOUNT.get()  # the retried mount this node runs under, if any
        self._token: str | None = None  # ordinary mode: this run of the node, drawn when a key is asked
        self._position = 0  # the aspect-chain position of the aspect being entered

    @property
    def node(self) -> str:
        return self._member.name

    @property
    def path(self) -> tuple[str, ...]:
        """The mount names from the root execution to this node's graph."""
        return self._level.path

    def __repr__(self) -> str:
        return f"NodeContext({'/'.join((*self.path, self.node))})"

    # -- where the node runs ----------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The durable run: the execution's checkpoint scope (``ledger.run``'s ``run_id``, and
        ``<run_id>/retry.<n>`` in the attempt ``ledger.retry`` gave a run, which is another attempt).

        ``None`` in ordinary mode, which has no durable run (a process-local
        execution is no identity anything could resume).
        """
        checkpoint = self._level.execution._checkpoint
        return None if checkpoint is None else checkpoint.scope

    @property
    def attempts(self) -> tuple[int, ...]:
        """The attempt index of every Retry boundary around this code, from the outermost in.

        0-based, as ``MessageTx.attempt``: the number of failures the boundary
        confirmed before this attempt. The boundaries of a Sub mount's chain
        come before those of the node's own chain (the execution's aspects,
        then the node's); ``()`` under none. In checkpoint mode the ledger
        assigns them, so a crash inside an attempt and a resume see the same
        indices again; in ordinary mode they are the Retry loops' counters.
        """
        mount = self._mount
        if mount is not None and mount._level.execution is self._level.execution:
            return (*mount.attempts, *self._attempts)
        return self._attempts

    @property
    def attempt(self) -> int:
        """The attempt index of the innermost Retry boundary around this code (0-based); 0 under none."""
        attempts = self.attempts
        return attempts[-1] if attempts else 0

    @property
    def idempotency_key(self) -> str:
        """A key for this attempt's external effects: pass it to the services the node calls.

        In checkpoint mode it is the same on every run of the same attempt (a
        crash and a resume, in this process or another) and differs for every
        other attempt: a Retry's next one, a retried Sub mount's next one,
        another node, another run id. It is 32 hex digits of a SHA-256 over
        the run id, the node's group (:attr:`group`) and the innermost
        attempt scope the store assigned, so it carries no business data and
        has the same length however deep the node is mounted. In ordinary
        mode nothing is durable: the key is unique to this attempt of this
        execution and never comes again.
        """
        run_id = self.run_id
        scope = self._scopes[-1] if self._scopes else ""
        if run_id is None:
            if self._token is None:
                self._token = secrets.token_hex(16)
            run_id = self._token
        identity = msgspec.msgpack.encode((run_id, self.group, scope))  # unambiguous, and stable
        return hashlib.sha256(identity).hexdigest()[:32]

    def __getitem__(self, key: Key[T]) -> T:
        """The value of a required key; :class:`SkippedInputError` if it was skipped."""
        value = self.get(key)
        if value is NoValue:
            raise SkippedInputError(f"node {self.node!r}: input {key!r} was skipped")
        return value  # type: ignore[return-value]

    def get(self, key: Key[T]) -> T | NoValueType:
        """The value of a required key, or ``NoValue`` if it was skipped."""
        if key not in self._member.requires:
            raise KeyError(f"node {self.node!r} does not require {key!r}")
        slot = self._level.slots[key]
        if not slot.settled:  # a Sub mount reads its inlets live; a node never gets here
            raise KeyError(f"node {self.node!r}: {key!r} has not arrived yet")
        value: T | NoValueType = slot.value
        return value

    def set(self, key: Key[T], value: T) -> None:
        """Set ``key`` (read back as its type; downstream sees the copy): published at once in ordinary mode,
        after the node's record is confirmed in checkpoint mode."""
        self._writable(key, "set")
        copy, payload = codec_for(key.type).prepare(value, what=f"{key!r} of node {self.node!r}")
        self._put(key, copy, payload)

    def skip(self, key: Key[Any]) -> None:
        """Skip ``key``: nodes requiring it see ``NoValue``."""
        self._writable(key, "skip")
        self._put(key, NoValue, None)

    # -- streams --------------------------------------------------------------------------

    @property
    def group(self) -> str:
        """This node's consumer group on the streams it reads: its path from the root."""
        return "/".join((*self.path, self.node))

    def writer(self, key: Key[Stream[T]]) -> StreamWriter[T]:
        """The writer of stream ``key``, which this node provides; the stream ends with the node."""
        stream = self._written(key, partitioned=False)
        assert isinstance(stream, ManagedStream)
        return stream.writer()

    def partitioned_writer(self, key: Key[Stream[T]]) -> PartitionedWriter[T]:
        """The writer of partitioned stream ``key``, which this node provides: each message goes to its
        key's partition (:class:`~streams.PartitionedWriter`); every partition ends with the node."""
        stream = self._written(key, partitioned=True)
        assert isinstance(stream, PartitionedStream)
        return stream.writer()

    def reader(self, key: Key[Stream[T]]) -> StreamReader[T]:
        """A reader of stream ``key``, which this node requires, in the node's own consumer group."""
        stream = self._read(key, partitioned=False)
        assert isinstance(stream, ManagedStream)
        return stream.reader(self.group)

    def partitioned_reader(self, key: Key[Stream[T]]) -> PartitionedReader[T]:
        """The readers of partitioned stream ``key``, which this node requires, one per partition, in the
        node's own consumer group: give it to :func:`~streams.handle_messages`."""
        stream = self._read(key, partitioned=True)
        assert isinstance(stream, PartitionedStream)
        return stream.reader(self.group)

    def _written(self, key: Key[Any], *, partitioned: bool) -> ManagedStream[Any] | PartitionedStream[Any]:
        if not key.is_stream or key not in self._member.provides:
            raise OutputError(f"node {self.node!r} does not write stream {key!r}: it is not in its provides")
        check_endpoint(key, partitioned, "ctx.writer", "ctx.partitioned_writer")
        stream: ManagedStream[Any] | PartitionedStream[Any] = self._level.slots[key].value
        return stream

    def _read(self, key: Key[Any], *, partitioned: bool) -> ManagedStream[Any] | PartitionedStream[Any]:
        if not key.is_stream or key not in self._member.requires:
            raise KeyError(f"node {self.node!r} does not read stream {key!r}: it is not in its requires")
        check_endpoint(key, partitioned, "ctx.reader", "ctx.partitioned_reader")
        stream: ManagedStream[Any] | PartitionedStream[Any] = self._level.slots[key].value
        return stream

    async def handle_messages(
        self, key: Key[Stream[T]], handler: Handler[Any, T], **options: Any
    ) -> HandleResult[Any]:
        """:func:`~streams.handle_messages` on stream ``key`` in this node's group, under its attempt.

        Message budgets, the group's state and its results belong to this
        attempt of the node (a failed attempt's never reach the next one);
        the ordinary results the handler sets (``tx.set``) become this
        node's outputs: published at once in ordinary mode, with the node's
        record in checkpoint mode. ``options`` are ``handle_messages``'s;
        ``dead_letter`` may name a stream key this node provides (its writer).
        A partitioned stream is handled with :meth:`handle_partitions`.
        """
        parent = self._handle_options(options)
        if key.partitions is not None:
            check_endpoint(key, False, "ctx.handle_messages", "ctx.handle_partitions")
        reader = self.reader(key)
        result: HandleResult[Any] = await handle_messages(reader, handler, parent_attempt=parent, **options)
        provided = {k.name: k for k in self._member.provides if not k.is_stream}
        for name in result.result_names():
            if name not in provided:
                raise OutputError(
                    f"node {self.node!r}: its message handler set result {name!r}, which the node does not "
                    "provide"
                )
            out = provided[name]
            value, payload = codec_for(out.type).prepare(result.result(out), what=name)
            if self._writes is not None:
                self._writes.staged[out] = (value, payload)  # the latest confirmed result of the key
            elif not self._level.slots[out].settled:
                self._put(out, value, payload)
        return result

    async def handle_partitions(
        self,
        key: Key[Stream[T]],
        handler: Handler[Any, T],
        *,
        concurrency: int | None = None,
        **options: Any,
    ) -> PartitionedResult[Any]:
        """:meth:`handle_messages` on partitioned stream ``key``: every partition at once, in order each.

        ``concurrency=K`` makes K members of this node's group, member ``m``
        handling the partitions ``p % K == m`` one message at a time (as
        :func:`~streams.handle_messages` does); the default is a member per
        partition. Each partition keeps its own frontier, budgets, state and
        keyed state, owned by this attempt of the node. Partitions have no
        order among them, so the handler sets no node results (``tx.set``
        ends the node with :class:`~streams.OutputError`): keep what is per
        key in keyed state (``keyed=``), and set the node's outputs from the
        partitions' states (``result.partitions[p].state``) once it returns.
        """
        parent = self._handle_options(options)
        reader = self.partitioned_reader(key)
        result: PartitionedResult[Any] = await handle_messages(
            reader, handler, parent_attempt=parent, concurrency=concurrency, **options
        )
        for part in result.partitions:
            names = part.result_names()
            if names:
                raise OutputError(
                    f"node {self.node!r}: its message handler set result {names[0]!r} on partitioned "
                    f"stream {key!r}, whose partitions have no order among them: set the node's outputs "
                    "once handle_partitions returns, from the partitions' states"
                )
        return result

    def _handle_options(self, options: dict[str, Any]) -> str:
        """Check a handle call's ``options`` (a dead-letter key becomes its writer); the parent attempt."""
        for name in ("node", "parent_attempt"):
            if name in options:
                raise TypeError(f"ctx.handle_messages supplies {name}= itself")
        if isinstance(options.get("dead_letter"), Key):
            options["dead_letter"] = self.writer(options["dead_letter"])
        return self._scopes[-1] if self._scopes else ""

    def skip_node(self) -> None:
        """End the node here as skipped (not failed): what it did not set is skipped."""
        raise NodeSkipped

    def _writable(self, key: Key[Any], what: str) -> None:
        if key not in self._member.provides:
            raise OutputError(f"node {self.node!r} cannot {what} {key!r}: it does not provide it")
        if self._writes is not None and key in self._writes.staged:
            raise OutputError(f"node {self.node!r} cannot {what} {key!r}: this attempt settled it already")
        if self._level.slots[key].settled:
            raise OutputError(
                f"node {self.node!r} cannot {what} {key!r}: it was already published (in ordinary mode "
                "a key is published when set, and a retried attempt cannot set it again)"
            )

    def _put(self, key: Key[Any], value: Any, payload: bytes | None) -> None:
        if self._writes is None:
            self._level.slots[key].settle(value)
        else:
            self._writes.staged[key] = (value, payload)

    # -- what Retry uses in checkpoint mode ------------------------------------------------

    @property
    def _checkpointing(self) -> bool:
        return self._writes is not None

    async def _open_attempt(self, position: int, limit: int) -> CheckpointAttempt:
        return await self._level.open_attempt(self._scopes[-1], self.node, position, limit)

    async def _fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        return await self._level.fail_attempt(scope, failure)

    def _mark(self) -> int:
        assert self._writes is not None
        return self._writes.mark()

    def _rollback(self, mark: int) -> None:
        assert self._writes is not None
        self._writes.rollback(mark)

    def _local_attempt(self, position: int, attempt: int) -> str:
        """Ordinary mode: the identity of try ``attempt`` of the Retry at ``position`` (no store keeps it)."""
        parent = self._scopes[-1] if self._scopes else self.group
        return f"{parent}/{position}#{attempt}"

    async def _settle_streams(self) -> None:
        """Before a retried attempt: what the failed one sent is confirmed, or the tree's failure raised.

        A writer's ``position`` is then what its stream keeps, so the next
        attempt continues after the last message kept and sends none twice.
        """
        if isinstance(self._member, NodeDef):
            for key in self._member.streams:
                stream = self._level.slots[key].value
                if isinstance(stream, (ManagedStream, PartitionedStream)):
                    for part in partitions_of(stream):
                        await part._core.flush()

    async def _within(self, scope: str, proceed: Callable[[], Awaitable[None]], *, index: int) -> None:
        """Run ``proceed`` as attempt ``scope`` (index ``index`` of its boundary): what it opens (inner
        retries, Sub children) is under it."""
        self._scopes.append(scope)
        attempts = self._attempts
        self._attempts = (*attempts, index)
        mount = _MOUNT.set(self) if isinstance(self._member, SubDef) else None  # the child's nodes see it
        try:
            await proceed()
        finally:
            if mount is not None:
                _MOUNT.reset(mount)
            self._attempts = attempts
            self._scopes.pop()
