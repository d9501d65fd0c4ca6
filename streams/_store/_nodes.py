"""The node hooks' rules, written once for every store, over a :class:`NodeView` of its records.

Persisted layouts:

* :class:`NodeAttemptRecord`, one per retry boundary ``(parent, node,
  position)``: its current attempt (scope and index), its limit, whether it
  is exhausted (final failure confirmed) or committed;
* :class:`ScopeRecord`, one per execution scope: the identity a Sub's child
  was opened with (none for a root scope), and whether a final failure was
  confirmed in it;
* the confirmed :class:`NodeCheckpoint` of each node of a scope.

Every operation checks everything first and writes last, so a refused call
changes nothing; a store runs each one in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import msgspec

from .._errors import CheckpointError, CheckpointScopeFailure, SequenceError, StoreDamagedError
from ._integrity import node_problems
from ._node_records import (
    COMPLETE_CHAIN,
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    NodeCheckpoint,
)
from ._records import StreamRef

__all__ = [
    "NodeAttemptRecord",
    "NodeView",
    "ScopeRecord",
    "check_confirmed",
    "child_scope",
    "commit_node",
    "destination_template",
    "enclosing_scope",
    "fail_attempt",
    "first_attempt",
    "open_attempt",
    "open_child",
    "parse_attempt_scope",
]


#: The most failures a boundary's record keeps, the latest ones (``index`` counts them all).
FAILURES_KEPT = 20


class NodeAttemptRecord(msgspec.Struct, frozen=True):
    """A retry boundary's persistent state; ``index`` counts its confirmed failures.

    ``failures`` are the latest confirmed failures (at most
    :data:`FAILURES_KEPT`), and ``started_at``/``ended_at`` when the
    committed attempt ran: what an operator reads of a node's history.
    A record may hold none of them.
    """

    parent: str
    node: str
    position: int
    limit: int
    index: int
    scope: str
    exhausted: bool = False
    committed: bool = False
    failures: tuple[AttemptFailure, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None


class ScopeRecord(msgspec.Struct, frozen=True):
    """An execution scope: the child identity it was opened with, and whether it failed for good."""

    child: CheckpointChild | None = None
    failed: bool = False


class NodeView(Protocol):
    """The records one node-hook call reads and writes, inside one store transaction."""

    def get_attempt(self, parent: str, node: str, position: int) -> NodeAttemptRecord | None: ...
    def put_attempt(self, record: NodeAttemptRecord) -> None: ...
    def get_scope(self, scope: str) -> ScopeRecord | None: ...
    def put_scope(self, scope: str, record: ScopeRecord) -> None: ...
    def nodes(self, scope: str) -> tuple[NodeCheckpoint, ...]: ...
    def get_node(self, scope: str, node: str) -> NodeCheckpoint | None: ...
    def put_node(self, scope: str, checkpoint: NodeCheckpoint) -> None: ...


def attempt_scope(parent: str, node: str, position: int, limit: int, index: int) -> str:
    """The scope of attempt ``index`` of a boundary: unique per parent attempt, node and position.

    It names the boundary's limit too, so that a first attempt needs no
    record: opening it writes nothing (a crash before its first failure or
    its commit leaves nothing to reclaim but the same scope, computed again).
    """
    return f"{parent}/{node}@{position}.{limit}.{index}"


def parse_attempt_scope(scope: str) -> tuple[str, str, int, int, int] | None:
    """``(parent, node, position, limit, index)`` of an attempt scope, or None if it is not one."""
    parent, slash, last = scope.rpartition("/")
    node, at, numbers = last.rpartition("@")
    parts = numbers.split(".")
    if not (slash and at and parent and node and len(parts) == 3 and all(p.isdigit() for p in parts)):
        return None
    position, limit, index = (int(p) for p in parts)
    return parent, node, position, limit, index


def child_scope(attempt: str, mount: str) -> str:
    """The scope of the child a Sub ``mount`` opens under its attempt ``attempt``."""
    return f"{attempt}/{mount}"


def enclosing_scope(scope: str, mount: str) -> str | None:
    """The scope of the graph level whose Sub ``mount`` opened child scope ``scope``, or None.

    None unless ``scope`` is a child scope of ``mount`` as these rules make
    one: under the mount's complete-chain attempt (position 0, limit 1,
    index 0) in that level and the attempts of the retry boundaries of its
    chain nested in it (positions rising inward, each index below its
    limit), for example ``run/src@0.1.0/src@1.3.2/src``. Which attempt it
    was is not checked: a record of an earlier attempt has this shape too.
    """
    attempt, slash, name = scope.rpartition("/")
    if not slash or name != mount:
        return None
    inner: int | None = None  # the position of the attempt nested in this one
    while (parsed := parse_attempt_scope(attempt)) is not None:
        parent, node, position, limit, index = parsed
        if node != mount or index >= limit or (inner is not None and position >= inner):
            return None
        if position == COMPLETE_CHAIN:
            return parent if limit == 1 else None
        attempt, inner = parent, position
    return None


#: What stands for the run's id in a :func:`destination_template`.
RUN_ID_PLACEHOLDER = "{run_id}"


def destination_template(ref: StreamRef, run: str) -> str | None:
    """Stream ``ref`` of run ``run`` with the run's id and its attempts taken out: ``{run_id}/node/key``.

    The low-cardinality name of the stream, the same in every run of the
    graph: ``{run_id}``, the Sub mounts down to the level that writes it (an
    attempt scope ``m@p.l.i`` of the rules above names no more than its
    mount ``m``), then its writer node and key. None if ``ref``'s scope is
    neither ``run`` nor a child scope under it as these rules make one.
    """
    scope = ref.scope
    if scope == run:
        mounts: list[str] = []
    elif scope.startswith(run + "/"):
        mounts = []
        attempts: list[str] = []  # the attempt scopes of the mount under way, before its name
        for part in scope[len(run) + 1 :].split("/"):
            parsed = parse_attempt_scope(f"{run}/{part}")
            if parsed is not None:
                if attempts and parsed[1] != attempts[-1]:
                    return None
                attempts.append(parsed[1])
            elif attempts and part == attempts[-1]:
                mounts.append(part)
                attempts = []
            else:
                return None
        if attempts:
            return None
    else:
        return None
    return "/".join((RUN_ID_PLACEHOLDER, *mounts, ref.node, ref.key))


def _attempt_of(view: NodeView, scope: str) -> NodeAttemptRecord | None:
    """The boundary whose current, superseded or final attempt ``scope`` is.

    A first attempt with no record yet (nothing failed or committed in it)
    is returned as the record it would have; the caller writes it if it
    changes it.
    """
    parsed = parse_attempt_scope(scope)
    if parsed is None:
        return None
    parent, node, position, limit, index = parsed
    record = view.get_attempt(parent, node, position)
    if record is None:
        first = index == 0 and limit > 0
        return NodeAttemptRecord(parent, node, position, limit, 0, scope) if first else None
    return record if index <= record.index and limit == record.limit else None


def open_attempt(view: NodeView, request: CheckpointAttemptRequest) -> CheckpointAttempt:
    """The boundary's current attempt; writes nothing (a store may run it in a read transaction)."""
    if request.limit < 1 or request.position < 0 or not request.parent or not request.node:
        raise CheckpointError(f"open_attempt: malformed request {request!r}")
    current = view.get_attempt(request.parent, request.node, request.position)
    if current is None:  # the first attempt: its record is written with its first failure or commit
        return first_attempt(request)
    if current.limit != request.limit:
        raise CheckpointError(
            f"open_attempt: node {request.node!r} in {request.parent!r} (position {request.position}) was "
            f"first run with a limit of {current.limit} attempts, now {request.limit}; a budget changes "
            "only with a new business version and a new run"
        )
    return CheckpointAttempt(current.scope, current.index, current.exhausted)


def first_attempt(request: CheckpointAttemptRequest) -> CheckpointAttempt:
    """What :func:`open_attempt` answers for a boundary the store holds no record of: its first attempt.

    An execution whose scope the store holds nothing under (a run created
    in the same call, ``ExecCheckpoint(..., new_scope=True)``) knows this
    answer without asking: every boundary it opens is new.
    """
    scope = attempt_scope(request.parent, request.node, request.position, request.limit, 0)
    return CheckpointAttempt(scope, 0, False)


def fail_attempt(view: NodeView, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
    current = _attempt_of(view, scope)
    if current is None:
        raise SequenceError(f"fail_attempt: no attempt {scope!r} was opened")
    if current.scope != scope or current.exhausted or current.committed:
        state = "exhausted" if current.exhausted else "committed" if current.committed else "superseded"
        raise SequenceError(f"fail_attempt: attempt {scope!r} is {state}; its failure was not recorded again")
    index = current.index + 1
    if failure is not None:
        kept = (*current.failures, msgspec.structs.replace(failure, index=current.index))
        current = msgspec.structs.replace(current, failures=kept[-FAILURES_KEPT:])
    if index >= current.limit:
        failed = msgspec.structs.replace(current, index=index, exhausted=True)
        if current.position == COMPLETE_CHAIN:  # the node failed for good: so did its scope
            record = view.get_scope(current.parent) or ScopeRecord()
            view.put_scope(current.parent, msgspec.structs.replace(record, failed=True))
        view.put_attempt(failed)
        return CheckpointAttempt(failed.scope, index, True)
    scope = attempt_scope(current.parent, current.node, current.position, current.limit, index)
    nxt = msgspec.structs.replace(current, index=index, scope=scope)
    view.put_attempt(nxt)
    return CheckpointAttempt(nxt.scope, index, False)


def open_child(view: NodeView, child: CheckpointChild) -> CheckpointChildOpened:
    parent = _attempt_of(view, child.parent)
    if parent is None or parent.scope != child.parent:
        raise SequenceError(f"open_child: {child.parent!r} is not a current attempt")
    scope = child_scope(child.parent, child.mount)
    record = view.get_scope(scope)
    kept = msgspec.structs.replace(child, legacy_fingerprint=None)  # the identity, as it is kept
    if record is None:
        view.put_scope(scope, ScopeRecord(kept))
        return CheckpointChildOpened(scope)
    if not _same_child(record.child, child):
        differences = _differences(record.child, kept)
        raise CheckpointError(
            f"open_child: scope {scope!r} holds results of another child ({differences}); "
            "change the business version (and the run) when a graph's meaning changes"
        )
    if record.failed:
        raise CheckpointScopeFailure(child.parent)  # the signal names the attempt that asked
    return CheckpointChildOpened(scope, view.nodes(scope))


def _same_child(recorded: CheckpointChild | None, asked: CheckpointChild) -> bool:
    """Whether the scope was opened for the child ``asked`` names: the same identity, its fingerprint
    the one asked for or the legacy one (types named with their modules)."""
    if recorded is None:
        return False
    if recorded.fingerprint == asked.legacy_fingerprint:
        recorded = msgspec.structs.replace(recorded, fingerprint=asked.fingerprint)
    return recorded == msgspec.structs.replace(asked, legacy_fingerprint=None)


def _differences(before: CheckpointChild | None, now: CheckpointChild) -> str:
    if before is None:
        return "a root scope"
    fields = ("graph", "version", "fingerprint", "fixed", "bindings")
    return ", ".join(f"{name} differs" for name in fields if getattr(before, name) != getattr(now, name))


def commit_node(view: NodeView, commit: CheckpointCommit) -> None:
    current = _attempt_of(view, commit.scope)
    checkpoint = commit.checkpoint
    if current is None or current.scope != commit.scope:
        raise SequenceError(f"commit: {commit.scope!r} is not a current attempt")
    if (
        current.position != COMPLETE_CHAIN
        or current.parent != commit.parent
        or current.node != checkpoint.node
    ):
        raise CheckpointError(
            f"commit: {commit.scope!r} is not the complete-chain attempt of node {checkpoint.node!r} "
            f"in {commit.parent!r}"
        )
    if current.exhausted:
        raise SequenceError(f"commit: node {checkpoint.node!r} failed for good in {commit.parent!r}")
    if current.committed:
        if view.get_node(commit.parent, checkpoint.node) == checkpoint:
            return  # the same record again: its first answer was lost
        raise SequenceError(f"commit: node {checkpoint.node!r} in {commit.parent!r} was committed already")
    if view.get_node(commit.parent, checkpoint.node) is not None:
        raise StoreDamagedError(
            f"commit: node {checkpoint.node!r} in {commit.parent!r} has a record its attempt does not know"
        )
    check_owned_streams(commit)
    view.put_node(commit.parent, checkpoint)
    ran = {"started_at": commit.started_at, "ended_at": commit.ended_at}
    view.put_attempt(msgspec.structs.replace(current, committed=True, **ran))


def check_confirmed(
    scope: str, records: Iterable[NodeCheckpoint], boundaries: Iterable[NodeAttemptRecord]
) -> None:
    """Every node of ``scope`` whose complete-chain attempt was committed has its record among ``records``.

    :func:`commit_node` writes both in one transaction, so a committed
    attempt without its record is a record lost or moved: resumed, the node
    would run again although it was confirmed. A store runs this on the
    records a resume reads (``node_records``), before anything is written.
    """
    kept = {record.node for record in records}
    mine = [b for b in boundaries if b.parent == scope and b.position == COMPLETE_CHAIN]
    problems = node_problems(mine, lambda parent, node: node in kept)
    if problems:
        raise StoreDamagedError(
            f"{problems[0]} from the store; the store is damaged: restore it from a copy "
            "(nothing was changed)"
        )


def check_owned_streams(commit: CheckpointCommit) -> None:
    """A commit's stream terminals are successes of streams its record names as the node's own."""
    checkpoint = commit.checkpoint
    owned: set[StreamRef] = set()
    for output in checkpoint.outputs:
        ref = output.stream
        if output.state != "stream" or ref is None:
            continue
        if ref.scope != commit.parent or ref.node != checkpoint.node:
            continue
        if output.partitions:  # a partitioned stream: its partitions are the streams that end
            owned.update(ref.partition(p) for p in range(output.partitions))
        else:
            owned.add(ref)
    for finish in commit.streams:
        if finish.failed:
            raise CheckpointError(
                f"commit: node {checkpoint.node!r} confirms stream {finish.ref} as failed; a node commit "
                "confirms only its streams' successful ends (a failure is confirmed with finish)"
            )
        if finish.ref not in owned:
            raise CheckpointError(
                f"commit: node {checkpoint.node!r} in {commit.parent!r} does not write stream {finish.ref}; "
                "a node commit ends only the streams it owns"
            )
