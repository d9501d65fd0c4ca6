"""The implementation of :mod:`streams.testing`, which documents and exports it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol, TypeVar

import anyio

from ._store._hooks import STREAM_HOOKS, FollowHooks, KeyedHooks, StreamHooks
from ._store._layouts import StreamDescriptor
from ._store._node_records import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    NodeCheckpoint,
)
from ._store._records import (
    AppendBatch,
    KeyedEntry,
    KeyedRange,
    KeyedRead,
    MessageAttempt,
    MessageCommit,
    MessageFail,
    MessageOpen,
    StreamFinish,
    StreamOpen,
    StreamOpened,
    StreamRead,
    StreamRef,
)

__all__ = [
    "FaultyHooks",
    "FaultyNodeHooks",
    "InjectedFault",
    "PassThroughHooks",
    "PassThroughNodeHooks",
    "StoreWorld",
    "stray_cancellation",
]

A = TypeVar("A")
R = TypeVar("R")


class InjectedFault(Exception):
    """Raised by :class:`FaultyHooks` in place of a store's answer."""


class PassThroughHooks:
    """A :class:`~streams.StreamHooks` that passes every call to ``inner``: a base for wrappers."""

    def __init__(self, inner: StreamHooks) -> None:
        self.inner = inner

    async def open(self, request: StreamOpen) -> StreamOpened:
        return await self.inner.open(request)

    async def append(self, batch: AppendBatch) -> None:
        await self.inner.append(batch)

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        return await self.inner.open_message(request)

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        return await self.inner.fail_message(request)

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        await self.inner.commit(commits)

    async def finish(self, request: StreamFinish) -> None:
        await self.inner.finish(request)

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        return await self.inner.describe(ref)

    async def read_stream(self, request: StreamRead) -> StreamOpened | None:
        """Stream reads pass too (:class:`~streams.store.FollowHooks`), to an inner store that has them."""
        return await _follow(self.inner).read_stream(request)

    async def read_keyed(self, request: KeyedRead) -> tuple[bytes | None, ...]:
        """Keyed reads pass too (:class:`~streams.store.KeyedHooks`), to an inner store that has them."""
        return await _keyed(self.inner).read_keyed(request)

    async def list_keyed(self, request: KeyedRange) -> tuple[KeyedEntry, ...]:
        return await _keyed(self.inner).list_keyed(request)


def _follow(hooks: StreamHooks) -> FollowHooks:
    if not isinstance(hooks, FollowHooks):
        raise TypeError(
            f"{type(hooks).__qualname__} cannot read a stream it did not open (it is no FollowHooks)"
        )
    return hooks


def _keyed(hooks: StreamHooks) -> KeyedHooks:
    if not isinstance(hooks, KeyedHooks):
        raise TypeError(f"{type(hooks).__qualname__} keeps no keyed state (it is no KeyedHooks)")
    return hooks


class _Faults:
    """Which call of which hook fails, and how: counts calls and raises :class:`InjectedFault`."""

    def __init__(
        self,
        fail: Mapping[str, int],
        after: bool,
        hooks: frozenset[str],
        what: str,
        error: Callable[[str], BaseException] | None,
    ) -> None:
        unknown = set(fail) - hooks
        if unknown:
            raise ValueError(f"no such {what}: {sorted(unknown)}")
        self.fail = dict(fail)
        self.after = after
        self.error = error or InjectedFault
        self.calls: dict[str, int] = {}

    async def call(self, name: str, fn: Callable[[A], Awaitable[R]], arg: A) -> R:
        self.calls[name] = self.calls.get(name, 0) + 1
        due = self.fail.get(name) == self.calls[name]
        if due and not self.after:
            raise self.error(f"injected failure of {name} call {self.calls[name]} (not confirmed)")
        result = await fn(arg)
        if due:
            raise self.error(f"injected failure of {name} call {self.calls[name]} (answer lost)")
        return result


def stray_cancellation(what: str) -> BaseException:
    """The running backend's cancellation exception, made by hand: what an async driver may raise
    while nothing cancelled its caller (give it as ``error=`` to the faulty hooks)."""
    cancelled = anyio.get_cancelled_exc_class()
    try:
        return cancelled(what)
    except TypeError:  # trio's Cancelled has no public constructor: made by the metaclass's base call
        made: BaseException = type.__call__(cancelled)
        return made


_STREAM_HOOKS: Final = frozenset((*STREAM_HOOKS, "read_keyed", "list_keyed"))
_NODE_HOOKS: Final = frozenset({"open_attempt", "fail_attempt", "open_child", "commit_nodes"})


class FaultyHooks(PassThroughHooks):
    """A :class:`~streams.StreamHooks` wrapper that fails chosen calls.

    ``fail`` maps a hook name to the 1-based number of the call that fails
    (``{"commit": 3}`` fails the third commit). ``after=True`` lets the store
    confirm the call first, then loses the answer. ``error`` makes the
    exception raised from its message (:class:`InjectedFault` by default;
    :func:`stray_cancellation` raises a cancellation nothing asked for).
    """

    def __init__(
        self,
        inner: StreamHooks,
        *,
        fail: Mapping[str, int],
        after: bool = False,
        error: Callable[[str], BaseException] | None = None,
    ) -> None:
        self._faults = _Faults(fail, after, _STREAM_HOOKS, "hook", error)
        super().__init__(inner)
        self._call = self._faults.call

    @property
    def calls(self) -> dict[str, int]:
        """How many times each hook was called so far."""
        return self._faults.calls

    async def open(self, request: StreamOpen) -> StreamOpened:
        return await self._call("open", self.inner.open, request)

    async def append(self, batch: AppendBatch) -> None:
        await self._call("append", self.inner.append, batch)

    async def open_message(self, request: MessageOpen) -> MessageAttempt:
        return await self._call("open_message", self.inner.open_message, request)

    async def fail_message(self, request: MessageFail) -> MessageAttempt:
        return await self._call("fail_message", self.inner.fail_message, request)

    async def commit(self, commits: Sequence[MessageCommit]) -> None:
        await self._call("commit", self.inner.commit, commits)

    async def finish(self, request: StreamFinish) -> None:
        await self._call("finish", self.inner.finish, request)

    async def describe(self, ref: StreamRef) -> StreamDescriptor | None:
        return await self._call("describe", self.inner.describe, ref)

    async def read_stream(self, request: StreamRead) -> StreamOpened | None:
        return await self._call("read_stream", _follow(self.inner).read_stream, request)

    async def read_keyed(self, request: KeyedRead) -> tuple[bytes | None, ...]:
        return await self._call("read_keyed", _keyed(self.inner).read_keyed, request)

    async def list_keyed(self, request: KeyedRange) -> tuple[KeyedEntry, ...]:
        return await self._call("list_keyed", _keyed(self.inner).list_keyed, request)


class PassThroughNodeHooks:
    """A :class:`~streams.store.CheckpointHooks` that passes every call to ``inner``: a base for wrappers.

    Besides the four hooks it passes ``streams`` and the two reads a host
    resumes with, ``await node_records(scope)`` and ``await scope_failed(scope)``.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def streams(self) -> StreamHooks:
        streams: StreamHooks = self.inner.streams
        return streams

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        attempt: CheckpointAttempt = await self.inner.open_attempt(request)
        return attempt

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        attempt: CheckpointAttempt = await self.inner.fail_attempt(scope, failure)
        return attempt

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        opened: CheckpointChildOpened = await self.inner.open_child(child)
        return opened

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        await self.inner.commit_nodes(commits)

    async def node_records(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        records: tuple[NodeCheckpoint, ...] = await self.inner.node_records(scope)
        return records

    async def scope_failed(self, scope: str) -> bool:
        return bool(await self.inner.scope_failed(scope))


class FaultyNodeHooks(PassThroughNodeHooks):
    """A node-hook wrapper that fails chosen calls, as :class:`FaultyHooks` does for stream hooks.

    ``fail`` maps ``open_attempt``, ``fail_attempt``, ``open_child`` or
    ``commit_nodes`` to the 1-based number of the call that fails;
    ``after=True`` lets the store confirm it first, then loses the answer;
    ``error`` is :class:`FaultyHooks`'s.
    """

    def __init__(
        self,
        inner: Any,
        *,
        fail: Mapping[str, int],
        after: bool = False,
        error: Callable[[str], BaseException] | None = None,
    ) -> None:
        self._faults = _Faults(fail, after, _NODE_HOOKS, "node hook", error)
        super().__init__(inner)
        self._call = self._faults.call

    @property
    def calls(self) -> dict[str, int]:
        """How many times each node hook was called so far."""
        return self._faults.calls

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        return await self._call("open_attempt", super().open_attempt, request)

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        inner = super().fail_attempt
        return await self._call("fail_attempt", lambda at: inner(at, failure), scope)

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        return await self._call("open_child", super().open_child, child)

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        await self._call("commit_nodes", super().commit_nodes, commits)


class StoreWorld(Protocol):
    """A store's storage reached through sessions; each session is one process lifetime.

    ``session()`` is an async context manager giving the store's
    :class:`~streams.StreamHooks`. Leaving a session and entering a new one is
    a restart: a store that keeps its records elsewhere opens them again, an
    in-process store gives the same object again.
    """

    def session(self) -> AbstractAsyncContextManager[StreamHooks]: ...
