"""The stream endpoints of an execution tree: one per stream, shared by every alias that leads to it.

A stream key of the tree (a writer node's, or a root input the host writes)
has one :class:`~streams.ManagedStream` endpoint, or one
:class:`~streams.PartitionedStream` over a stream per partition; Sub wiring
hands the same endpoint to the readers of every alias. :class:`Endpoints`
opens each one the first time an alias needs it (in checkpoint mode through
the store's stream hooks, as one reliable call each; in ordinary mode in a
:class:`~streams.MemoryStore` of its own) and keeps it for the others. A
restored Sub alias of a source whose failure is recorded gets a local,
read-only endpoint instead (:meth:`Endpoints.failed`).

It knows nothing of levels or nodes: the tree gives it the calls it needs
(a reliable hook call, the failure latch, a task to run confirmations in).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from ._aliases import StreamPlan
from ._errors import CheckpointError, SourceNotResumableError, StreamClosedError
from ._keys import Key
from ._partitions import PartitionedStream, partitions_of
from ._store._hooks import CheckpointHooks, StreamHooks
from ._store._layouts import StreamDescriptor
from ._store._memory import MemoryStore
from ._store._node_records import Terminal
from ._store._nodes import destination_template
from ._store._records import StreamOpen, StreamOpened, StreamRef
from ._stream import ManagedStream, StreamCore, core_of
from ._type_names import qualified_type_name, type_name

__all__ = [
    "Endpoints",
    "GraphStream",
    "endpoint_of",
    "parts",
    "ref_of",
    "stream_refs",
    "terminal_of",
]

T = TypeVar("T")
#: The endpoint of a stream key in the tree: a stream, or a partitioned stream over its partitions.
GraphStream = ManagedStream[Any] | PartitionedStream[Any]
#: One reliable hook call of the tree (its ``Tree.reliable``): named, accepted, shielded, latched.
Reliable = Callable[[str, Callable[[CheckpointHooks], Awaitable[Any]]], Awaitable[Any]]


class Endpoints:
    """Every stream endpoint of one execution tree; see the module docstring."""

    __slots__ = (
        "_capacity",
        "_checkpoint_scope",
        "_graph",
        "_latch",
        "_latched",
        "_memory",
        "_opening",
        "_reliable",
        "_resumable_inputs",
        "_spawn",
        "_store",
        "by_ref",
        "streams",
    )

    def __init__(
        self,
        *,
        graph: str,
        store: CheckpointHooks | None,
        checkpoint_scope: str | None,
        capacity: int,
        resumable_inputs: frozenset[Key[Any]],
        reliable: Reliable,
        latch: Callable[[CheckpointError], CheckpointError],
        latched: Callable[[], CheckpointError | None],
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None],
    ) -> None:
        self._graph = graph
        self._store = store  # checkpoint mode: the store, whose stream hooks confirm the tree's streams
        self._memory: MemoryStore | None = None  # ordinary mode: made when the first stream opens
        self._checkpoint_scope = checkpoint_scope
        self._capacity = capacity
        self._resumable_inputs = resumable_inputs
        self._reliable = reliable
        self._latch = latch
        self._latched = latched
        self._spawn = spawn
        self._opening: dict[StreamRef, anyio.Event] = {}
        self.streams: dict[StreamRef, ManagedStream[Any]] = {}  # every stream of the tree, partitions too
        self.by_ref: dict[StreamRef, GraphStream] = {}  # one endpoint per stream key of the tree

    def hooks(self) -> StreamHooks:
        """Where the tree's streams are confirmed: the store's stream hooks, or in memory in ordinary mode."""
        if self._store is not None:
            return self._store.streams
        if self._memory is None:
            self._memory = MemoryStore()
        return self._memory

    async def open(self, ref: StreamRef, plan: StreamPlan, scope: str, *, host: bool = False) -> GraphStream:
        """The one endpoint of stream ``ref`` in the tree: opened by the first alias to need it, then shared.

        ``scope`` is the checkpoint scope of the level asking ("" in ordinary
        mode). The stream is opened with its writer's promise and every
        group of the tree that reads it, the host's included. ``host``: the
        host writes it (a stream input of the root), with the promise given
        in ``resumable_inputs``, and ends it itself. A partitioned stream's
        key opens each partition (``key#p``, :func:`~streams.partition_name`)
        as a stream of its own, in order, and is one endpoint over them.
        """
        while (opening := self._opening.get(ref)) is not None:
            await opening.wait()
        existing = self.by_ref.get(ref)
        if existing is not None:
            if (existing.key.item_type, existing.key.partitions) != (plan.key.item_type, plan.key.partitions):
                raise self._latch(
                    CheckpointError(f"stream {ref} is open with {existing.key!r}, not {plan.key!r}")
                )
            return existing
        done = self._opening[ref] = anyio.Event()
        try:
            resumable = (
                plan.key in self._resumable_inputs
                if host
                else plan.writer is not None and plan.writer.resumable
            )
            key = plan.key
            writer = None if host or plan.writer is None else "/".join((*plan.path, plan.writer.name))
            opened = [
                await self._open_one(
                    _part_key(key, part), part, plan.groups, scope, resumable, writer, key.partitions or 0
                )
                for part in stream_refs(ref, key)
            ]
            stream = self.by_ref[ref] = endpoint_of(key, ref, opened)
            return stream
        finally:
            del self._opening[ref]
            done.set()

    async def _open_one(
        self,
        key: Key[Any],
        ref: StreamRef,
        groups: tuple[str, ...],
        scope: str,
        resumable: bool,
        writer: str | None,
        partitions: int,
    ) -> ManagedStream[Any]:
        """Open stream ``ref`` (a partition of a stream of ``partitions``, or 0: one of its own) for
        ``writer``, the node's path (None: the host), which a store's refusal to reopen it names."""
        request = StreamOpen(
            ref=ref,
            type_name=type_name(key.item_type),
            legacy_type_name=qualified_type_name(key.item_type),
            capacity=self._capacity,
            groups=groups,
            resumable=resumable,
            partitions=partitions,
        )
        hooks = self.hooks()

        async def open_stream(_: object = None) -> StreamOpened:
            try:
                return await hooks.open(request)
            except SourceNotResumableError as exc:
                who = "the host" if writer is None else f"node {writer!r}"
                raise SourceNotResumableError(f"{who}: {exc}") from None

        opened = await (self._reliable("open", open_stream) if scope else open_stream())
        core: StreamCore[Any] = StreamCore(
            self._confirmations,
            hooks,
            key,
            ref,
            opened,
            capacity=self._capacity,
            resumable=resumable,
            on_latch=self._latch,
            node_owned=writer is not None,
            partitions=partitions,
            template=self._template(ref),
            graph=self._graph,
        )
        stream: ManagedStream[Any] = ManagedStream(core)
        self.streams[ref] = stream
        return stream

    def _template(self, ref: StreamRef) -> str | None:
        """What the metrics of stream ``ref`` name it by: in checkpoint mode, without the run's id."""
        scope = self._checkpoint_scope
        return None if scope is None else destination_template(ref, scope)

    def failed(self, ref: StreamRef, plan: StreamPlan, held: Sequence[StreamDescriptor]) -> GraphStream:
        """A local, read-only endpoint of a source whose failure a restored Sub alias recorded.

        The store confirmed the failure of every stream in ``held`` (the
        source, or each of its partitions, see
        :func:`~streams._restore.verify_alias`). No Open is made and it holds
        no message: receiving raises :class:`StreamFailedError`, and sending
        or acknowledging is refused (its hooks are never called). An endpoint
        the tree opened for the same stream is shared instead.
        """
        existing = self.by_ref.get(ref)
        if existing is not None:
            return existing
        key = plan.key
        made: list[ManagedStream[Any]] = []
        for descriptor in held:
            part_ref = descriptor.ref
            opened = StreamOpened.empty(part_ref, plan.groups, generation=descriptor.generation, failed=True)
            core: StreamCore[Any] = StreamCore(
                self._confirmations,
                _READ_ONLY,
                _part_key(key, part_ref),
                part_ref,
                opened,
                capacity=1,
                resumable=False,
                node_owned=True,
                template=self._template(part_ref),
                graph=self._graph,
            )
            made.append(ManagedStream(core))
            self.streams[part_ref] = made[-1]
        stream = self.by_ref[ref] = endpoint_of(key, ref, made)
        return stream

    def _confirmations(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a stream's background confirmations in the execution's task group.

        A confirmation that failed latched the tree's failure, which the
        execution raises: it does not escape the task group a second time.
        """
        self._spawn(lambda: self._confirming(fn))

    async def _confirming(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await fn()
        except CheckpointError as exc:
            if self._latched() is None:  # the first failure of the tree: it ends the confirmations' task
                raise self._latch(exc) from None


class _ReadOnlyStreamHooks:
    """The hooks of a local failed endpoint: every call is refused (none should be made)."""

    async def _refuse(self, *_: object) -> Any:
        raise StreamClosedError("a restored alias of a failed stream is read-only: it takes no call")

    open = append = open_message = fail_message = commit = finish = describe = _refuse
    # a keyed handler of the failed source gets the source's failure, never a missing store: the
    # endpoint has keyed state (none), and refuses its reads as it refuses everything
    read_keyed = list_keyed = _refuse


_READ_ONLY: Any = _ReadOnlyStreamHooks()


def stream_refs(ref: StreamRef, key: Key[Any]) -> tuple[StreamRef, ...]:
    """The streams that hold stream ``ref`` of ``key`` in the store: itself, or each of its partitions."""
    return (ref,) if key.partitions is None else tuple(ref.partition(p) for p in range(key.partitions))


def _part_key(key: Key[Any], part: StreamRef) -> Key[Any]:
    """The key of one stream of ``key``'s: ``key`` itself, or a partition's (``key#p``, no partitions)."""
    return key if key.partitions is None else Key(part.key, key.type)


def endpoint_of(key: Key[Any], ref: StreamRef, opened: Sequence[ManagedStream[Any]]) -> GraphStream:
    """The tree's endpoint of ``key`` over the streams of :func:`stream_refs`, in order."""
    if key.partitions is None:
        return opened[0]
    assert key.partition_key is not None  # a partitioned key has its function
    return PartitionedStream(key, ref, tuple(opened), key.partition_key)


def parts(owned: Mapping[Key[Any], GraphStream]) -> Iterator[ManagedStream[Any]]:
    """The streams of the endpoints ``owned``: each partition of a partitioned one."""
    for stream in owned.values():
        yield from partitions_of(stream)


def ref_of(stream: GraphStream) -> StreamRef:
    """What a node record names: the stream, or a partitioned stream's own ref (its partitions follow)."""
    return stream.ref if isinstance(stream, PartitionedStream) else core_of(stream).ref


def terminal_of(stream: GraphStream) -> Terminal:
    """A source's terminal as a Sub's record names it: failed if a partition failed, finished if all did."""
    streams = partitions_of(stream)
    if any(core_of(p).failed for p in streams):
        return "failed"
    return "finished" if all(core_of(p).finished for p in streams) else ""
