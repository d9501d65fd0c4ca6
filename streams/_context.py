"""What a node sees while it runs: its inputs, Set/Skip of what it provides, and the slots behind them.

A :class:`Slot` is one key of one graph level, settled once with a value or
``NoValue``; settling it wakes the nodes waiting for it. In ordinary mode
``ctx.set`` settles the slot at once. In checkpoint mode it stages the value
in the node's :class:`WriteSet`, outside the whole aspect chain, and the
slot is settled only after the node's complete record is confirmed.

A node also learns where it runs: its run id, the attempts of the Retry
boundaries around it and an idempotency key for its external effects, each
computed when asked (a node that never asks pays nothing but three fields).

An aspect that runs the rest of the chain more than once makes a retry
boundary of its place in the chain with :meth:`NodeContext.retry_boundary`:
a :class:`RetryBoundary` counts its attempts (in the store, in checkpoint
mode), runs each one as an attempt of its own and confirms each failure.
:class:`~streams.Retry` is built on it, and so can a user's own aspect be.

The context knows its level only through :class:`NodeSite` (the execution
tree's levels implement it) and its node only through :class:`Member`: this
module imports neither the graph nor the engine.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final, Protocol, TypeVar

import anyio
import msgspec

from ._codec import codec_for
from ._errors import ConfirmedFailureError, OutputError, SkippedInputError
from ._handle import Handler, HandleResult, PartitionedResult, handle_messages
from ._keys import Key, NoValue, NoValueType, Stream
from ._outcome import interrupted
from ._partitions import (
    PartitionedReader,
    PartitionedStream,
    PartitionedWriter,
    check_endpoint,
    partitions_of,
)
from ._store._node_records import AttemptFailure, CheckpointAttempt
from ._stream import ManagedStream, StreamReader, StreamWriter, core_of

__all__ = [
    "Member",
    "NodeContext",
    "NodeSite",
    "NodeSkipped",
    "RetryBoundary",
    "Slot",
    "WriteSet",
    "attempt_scope",
    "enter_link",
    "expose",
]

T = TypeVar("T")
_UNSET: Final = object()

#: The context of the Sub mount whose current attempt the running task is inside (set by the
#: mount's Retry): a child node reads the mount's attempts through it.
_MOUNT: ContextVar[NodeContext | None] = ContextVar("streamledger_mount", default=None)


class NodeSkipped(BaseException):
    """``ctx.skip_node()``: a normal skip, not a failure, so no aspect retries or catches it as one."""


class Slot:
    """One key of one graph level: settled once, with a value or ``NoValue``.

    Its event exists only once someone waits for it (most keys of a wide
    graph are settled before anyone looks, or read only once settled).
    """

    __slots__ = ("_arrived", "listeners", "value")

    def __init__(self) -> None:
        self._arrived: anyio.Event | None = None
        self.value: Any = _UNSET
        self.listeners: list[Callable[[Any], None]] = []

    @property
    def settled(self) -> bool:
        return self.value is not _UNSET

    @property
    def arrived(self) -> anyio.Event:
        """Set once the slot is settled."""
        if self._arrived is None:
            self._arrived = anyio.Event()
            if self.settled:
                self._arrived.set()
        return self._arrived

    def settle(self, value: Any) -> None:
        self.value = value
        if self._arrived is not None:
            self._arrived.set()
        for listener in self.listeners:
            listener(value)

    def on_settle(self, listener: Callable[[Any], None]) -> None:
        if self.settled:
            listener(self.value)
        else:
            self.listeners.append(listener)


class _Output:
    """What a refused value was for, as an error names it: made into text only if it is refused."""

    __slots__ = ("key", "node")

    def __init__(self, key: Key[Any], node: str) -> None:
        self.key, self.node = key, node

    def __str__(self) -> str:
        return f"{self.key!r} of node {self.node!r}"


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


class Member(Protocol):
    """What a context knows of its node: a :class:`~streams._graph.NodeDef` or a Sub mount's ``SubDef``."""

    @property
    def name(self) -> str: ...

    @property
    def requires(self) -> tuple[Key[Any], ...]: ...

    @property
    def provides(self) -> tuple[Key[Any], ...]: ...


class NodeSite(Protocol):
    """What a context needs of the level (one graph of the execution tree) its node runs in."""

    @property
    def path(self) -> tuple[str, ...]:
        """The mount names from the root to the level's graph."""
        ...

    @property
    def slots(self) -> Mapping[Key[Any], Slot]:
        """The level's keys."""
        ...

    @property
    def run_id(self) -> str | None:
        """The durable run's checkpoint scope; ``None`` in ordinary mode."""
        ...

    @property
    def tree(self) -> object:
        """The execution tree the level belongs to (compared by identity)."""
        ...

    async def open_attempt(self, parent: str, node: str, position: int, limit: int) -> CheckpointAttempt:
        """Checkpoint mode: open (or reclaim) the attempt of a retry boundary, through the store."""
        ...

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        """Checkpoint mode: confirm attempt ``scope``'s failure; the boundary's next attempt."""
        ...


class NodeContext:
    """What a node's function and aspects see: its inputs, and Set/Skip for what it provides."""

    __slots__ = (
        "_attempts",
        "_is_mount",
        "_member",
        "_mount",
        "_position",
        "_scopes",
        "_site",
        "_token",
        "_writes",
    )

    def __init__(
        self,
        site: NodeSite,
        member: Member,
        *,
        writes: WriteSet | None = None,
        scope: str = "",
        mount: bool = False,
    ) -> None:
        self._site = site
        self._member = member
        self._is_mount = mount  # a Sub mount's context: its attempts are its child nodes' too
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
        return self._site.path

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
        return self._site.run_id

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
        if mount is not None and mount._site.tree is self._site.tree:
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
        slot = self._site.slots[key]
        if not slot.settled:  # a Sub mount reads its inlets live; a node never gets here
            raise KeyError(f"node {self.node!r}: {key!r} has not arrived yet")
        value: T | NoValueType = slot.value
        return value

    def set(self, key: Key[T], value: T) -> None:
        """Set ``key`` (read back as its type; downstream sees the copy): published at once in ordinary mode,
        after the node's record is confirmed in checkpoint mode."""
        self._writable(key, "set")
        copy, payload = codec_for(key.type).prepare(value, what=_Output(key, self.node))
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
        stream: ManagedStream[Any] | PartitionedStream[Any] = self._site.slots[key].value
        return stream

    def _read(self, key: Key[Any], *, partitioned: bool) -> ManagedStream[Any] | PartitionedStream[Any]:
        if not key.is_stream or key not in self._member.requires:
            raise KeyError(f"node {self.node!r} does not read stream {key!r}: it is not in its requires")
        check_endpoint(key, partitioned, "ctx.reader", "ctx.partitioned_reader")
        stream: ManagedStream[Any] | PartitionedStream[Any] = self._site.slots[key].value
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
            elif not self._site.slots[out].settled:
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
        if self._site.slots[key].settled:
            raise OutputError(
                f"node {self.node!r} cannot {what} {key!r}: it was already published (in ordinary mode "
                "a key is published when set, and a retried attempt cannot set it again)"
            )

    def _put(self, key: Key[Any], value: Any, payload: bytes | None) -> None:
        if self._writes is None:
            self._site.slots[key].settle(value)
        else:
            self._writes.staged[key] = (value, payload)

    # -- retry boundaries ------------------------------------------------------------------

    async def retry_boundary(self, limit: int) -> RetryBoundary:
        """Make the aspect being run a retry boundary of at most ``limit`` attempts: its current attempt.

        Call it in the aspect, before ``proceed``: the boundary is keyed by
        the aspect's position in the chain. In checkpoint mode its attempts
        are counted in the store, under the attempt enclosing it: a restart
        reclaims the current attempt, and a budget used up earlier stays used
        up (:attr:`RetryBoundary.exhausted`). In ordinary mode they are
        counted here. See :class:`RetryBoundary` for running the attempts.
        """
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a retry boundary needs at least one attempt, got {limit!r}")
        position = self._position
        if self._writes is None:
            parent = self._scopes[-1] if self._scopes else self.group
            return RetryBoundary(self, position, limit, local=parent)
        opened = await self._site.open_attempt(self._scopes[-1], self.node, position, limit)
        return RetryBoundary(self, position, limit, opened=opened)

    async def _settle_streams(self) -> None:
        """Before a retried attempt: what the failed one sent is confirmed, or the tree's failure raised.

        A writer's ``position`` is then what its stream keeps, so the next
        attempt continues after the last message kept and sends none twice.
        """
        if self._is_mount:
            return
        for key in self._member.provides:
            stream = self._site.slots[key].value if key.is_stream else None
            if isinstance(stream, (ManagedStream, PartitionedStream)):
                for part in partitions_of(stream):
                    await core_of(part).flush()

    async def _within(self, scope: str, proceed: Callable[[], Awaitable[None]], *, index: int) -> None:
        """Run ``proceed`` as attempt ``scope`` (index ``index`` of its boundary): what it opens (inner
        retries, Sub children) is under it."""
        self._scopes.append(scope)
        attempts = self._attempts
        self._attempts = (*attempts, index)
        mount = _MOUNT.set(self) if self._is_mount else None  # the child's nodes see it
        try:
            await proceed()
        finally:
            if mount is not None:
                _MOUNT.reset(mount)
            self._attempts = attempts
            self._scopes.pop()


class RetryBoundary:
    """The attempts of one retry boundary of a node's chain (from :meth:`NodeContext.retry_boundary`).

    An aspect runs the rest of the chain as the current attempt with
    :meth:`run`; when that raises an error it would try again, it tells the
    boundary with :meth:`fail`, which confirms the failure and says whether
    another attempt follows. Each attempt has its own ``ctx.attempt``,
    ``ctx.idempotency_key`` and message budgets; in checkpoint mode what an
    attempt set or skipped is dropped when it fails (its outputs never
    reach the node's record), and every message it sent is confirmed
    before the next one starts, so a writer continuing from
    ``writer.position`` sends nothing twice::

        boundary = await ctx.retry_boundary(3)
        while True:
            try:
                await boundary.run(proceed)
                return
            except ConnectionError as error:
                if not await boundary.fail(error):
                    raise

    A failure raised after a cancellation reached the chain is no failure:
    :meth:`fail` confirms nothing and spends no budget (in checkpoint mode the
    cancellation goes on from it, in ordinary mode it answers ``False``).
    """

    __slots__ = ("_ctx", "_local", "_mark", "_opened", "_started", "limit", "position")

    def __init__(
        self,
        ctx: NodeContext,
        position: int,
        limit: int,
        *,
        opened: CheckpointAttempt | None = None,
        local: str = "",
    ) -> None:
        self._ctx = ctx
        self.position = position  #: the boundary's position in the node's chain (1: the outermost aspect)
        self.limit = limit  #: the most attempts it runs
        self._opened = opened  # checkpoint mode: the current attempt, as the store gave it
        self._local: tuple[str, int] = (local, 0)  # ordinary mode: the parent scope, the attempt's index
        self._mark = 0
        self._started = 0.0

    def __repr__(self) -> str:
        return f"RetryBoundary(position={self.position}, limit={self.limit}, index={self.index})"

    @property
    def index(self) -> int:
        """The current attempt's index, 0-based: the failures the boundary confirmed before it."""
        return self._local[1] if self._opened is None else self._opened.index

    @property
    def exhausted(self) -> bool:
        """Checkpoint mode: every attempt failed (confirmed earlier); :meth:`run` then refuses to run."""
        return self._opened is not None and self._opened.exhausted

    @property
    def scope(self) -> str:
        """The current attempt's identity: the store's attempt scope, or a local one in ordinary mode."""
        if self._opened is not None:
            return self._opened.scope
        parent, index = self._local
        return f"{parent}/{self.position}#{index}"

    async def run(self, proceed: Callable[[], Awaitable[None]]) -> None:
        """Run ``proceed`` (the rest of the chain) as the current attempt; what it raises goes on.

        An exhausted boundary runs nothing and raises
        :class:`~streams.ConfirmedFailureError`.
        """
        ctx = self._ctx
        if self.exhausted:
            raise ConfirmedFailureError(
                f"node {ctx.node!r}: the retry boundary at position {self.position} of its chain used its "
                f"{self.limit} attempts (confirmed earlier); its budget is not refilled"
            )
        if ctx._writes is not None:
            self._mark = ctx._writes.mark()
        self._started = time.time()
        await ctx._within(self.scope, proceed, index=self.index)

    async def fail(self, error: Exception) -> bool:
        """The current attempt failed with ``error``: confirm it; whether another attempt follows.

        In checkpoint mode the failure is confirmed in the store
        (``fail_attempt``) and what the attempt staged is dropped; ``False``
        once the budget is used up (for good: a restart does not refill it).
        Before it answers ``True``, every message the failed attempt sent is
        confirmed. Call it once per failed :meth:`run`.
        """
        ctx = self._ctx
        if self._opened is None:
            parent, index = self._local
            if index + 1 >= self.limit or interrupted():  # a cancelled chain is not retried
                return False
            self._local = (parent, index + 1)
        else:
            assert ctx._writes is not None
            ctx._writes.rollback(self._mark)
            # refused (the cancellation goes on) if the chain was cancelled: no budget is spent
            failure = AttemptFailure.of(error, index=self._opened.index, started_at=self._started)
            self._opened = await ctx._site.fail_attempt(self._opened.scope, failure)
            if self._opened.exhausted:
                return False
        await ctx._settle_streams()
        return True


def enter_link(ctx: NodeContext, position: int) -> None:
    """The chain enters its aspect at ``position``: a boundary the aspect makes is keyed by it."""
    ctx._position = position


def attempt_scope(ctx: NodeContext) -> str:
    """The innermost attempt scope around the running link ("" in ordinary mode under no boundary)."""
    return ctx._scopes[-1] if ctx._scopes else ""


def expose(ctx: NodeContext, key: Key[Any], value: Any) -> None:
    """A Sub mount's outlet ``key`` of its level takes ``value``, as the child set it: the mount's output."""
    ctx._writable(key, "set")
    payload = None if value is NoValue else codec_for(key.type).encode(value)  # read back in the child
    ctx._put(key, value, payload)
