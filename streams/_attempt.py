"""A node attempt: one member of a level, from waiting for its inputs to its terminal status.

:func:`run_member` is what a level runs for each of its members. A restored
member republishes its record (:mod:`streams._restore`). Any other waits for
the keys it requires, opens the attempt of its complete chain (checkpoint
mode: ``open_attempt`` at position 0, limit 1: a confirmed final failure
stays final) and the streams it writes, and is skipped without running if
every key it requires was skipped. Then its aspect chain runs around its
body (a node's function, or a Sub mount's child level, :func:`run_sub`)
with a :class:`~streams.NodeContext`, and the attempt concludes:

- completed or skipped: in ordinary mode it finishes at once; in checkpoint
  mode its streams' messages are confirmed and its complete record is
  staged for the node commits, which publish its outputs once it landed;
- failed while nothing cancelled it (a business failure): confirmed with
  ``fail_attempt``, its streams fail, and its level fails;
- ended in any way after a cancellation reached it: nothing is confirmed
  and no budget spent; it ends cancelled, its attempt active for recovery.

Every way it ends is classified once, by :mod:`streams._outcome`.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel

from ._aspects import chain
from ._codec import codec_for
from ._context import NodeContext, NodeSkipped, Slot, WriteSet, attempt_scope, expose
from ._endpoints import GraphStream, parts, ref_of, terminal_of
from ._errors import (
    CheckpointError,
    CheckpointScopeFailure,
    ConfirmedFailureError,
    OutputError,
    RestorePlanError,
    StrayCancellationError,
)
from ._events import Child, Running, Waiting
from ._graph import Member, NodeDef, SubDef
from ._inline import settled
from ._keys import Key, NoValue
from ._level import Level, slots_for
from ._node_commits import StagedNode
from ._node_spans import node_attempt
from ._outcome import accept, interrupted
from ._plan import RestoredNode, check_plan, encode_outputs
from ._restore import reopen_streams
from ._store._node_records import (
    COMPLETE_CHAIN,
    AttemptFailure,
    CheckpointChild,
    CheckpointCommit,
    Conclusion,
    NodeCheckpoint,
    Terminal,
)
from ._store._records import StreamFinish, StreamRef
from ._stream import ManagedStream, core_of

__all__ = ["run_member", "run_sub"]


async def run_member(level: Level, member: Member) -> None:
    """Run ``member`` of ``level`` to its terminal status; see the module docstring."""
    tree, where = level.tree, (*level.path, member.name)
    restored = level.plan.get(member.name)
    if restored is not None:  # no body, no aspects, no commit: its outputs, and Finished once
        try:
            await reopen_streams(level, member, restored)  # endpoint, Done, tail: before Finished
        except CheckpointError:
            level.finish(member, "failed", settle=False)
            return
        level.publish(member, {k: v for k, v in restored.outputs.items() if not k.is_stream})
        level.finish(member, restored.reason)
        return
    tree.emit(Waiting(level.path, member.name))
    waited = False
    if isinstance(member, NodeDef) and member.requires:
        pending: list[Slot] | None = None
        for key in member.requires:
            slot = level.slots[key]
            if not slot.settled:  # no yield for a key already there
                pending = [slot] if pending is None else [*pending, slot]
        if pending is not None:  # parked by the level's queue: no task of its own
            await settled(pending)
            waited = True
        if not waited and not level.scope:  # as a wait would: a cancelled level's member goes no further
            await anyio.lowlevel.checkpoint_if_cancelled()  # (checkpoint mode: open_attempt accepts first)
    attempt = ""
    if level.scope:
        try:
            # the finding of the node before it in this step of the level's queue, if it holds
            # (no wait since, nothing disturbed the tree): one check of anyio per node, not two
            checked = not waited and level.still_clear()
            opened = await tree.open_attempt(level.scope, member.name, COMPLETE_CHAIN, 1, checked=checked)
        except CheckpointError:
            level.finish(member, "failed", settle=False)
            return
        if opened.exhausted:
            level.finish(member, "failed", settle=False)
            level.fail(_confirmed_failure(member, level.scope), where)
            return
        attempt = opened.scope
    try:
        owned = await _open_streams(level, member)
    except CheckpointError:
        level.finish(member, "failed", settle=False)
        return
    inputs = member.requires if isinstance(member, NodeDef) else ()
    if inputs and all(level.slots[k].value is NoValue for k in inputs):  # skipped without running
        try:
            await _conclude(level, member, attempt, "skipped", {}, owned)
        except anyio.get_cancelled_exc_class():
            level.cancelled(member)
            raise
        return
    level.set_status(member, "running")
    tree.emit(Running(level.path, member.name))
    started = time.time()
    writes = WriteSet() if level.scope else None
    if writes is not None and isinstance(member, NodeDef):
        _restore_values(writes, member, level.slots, where, attempt)
    ctx = NodeContext(level, member, writes=writes, scope=attempt, mount=isinstance(member, SubDef))
    graph = level.graph.name
    if isinstance(member, NodeDef):
        fn = member.fn

        async def body() -> None:
            with node_attempt(ctx, graph):
                try:
                    await fn(ctx)
                except anyio.get_cancelled_exc_class() as exc:
                    await anyio.lowlevel.checkpoint_if_cancelled()  # really cancelled: raised again here
                    raise StrayCancellationError(
                        f"node {'/'.join(where)!r} raised a cancellation while its execution was not "
                        "cancelled: a failure of the node, not an interruption"
                    ) from exc

    else:
        mount = member

        async def body() -> None:
            with node_attempt(ctx, graph):
                await run_sub(level, mount, ctx)

    aspects = (*level.ambient, *member.aspects)
    try:
        await chain(aspects, ctx, body)()
    except NodeSkipped:
        reason: Conclusion = "skipped"
    except anyio.get_cancelled_exc_class():
        level.finish(member, "cancelled", settle=False)  # its attempt stays active for recovery
        raise
    except Exception as exc:
        if interrupted():  # raised after a cancellation reached it: an interruption, not a failure
            await _interrupted(level, member)
            return
        confirmed = not attempt
        if attempt and tree.latched is None:  # a real failure: confirmed, and final
            failure = AttemptFailure.of(exc, index=0, started_at=started)
            with contextlib.suppress(CheckpointError):
                await level.fail_attempt(attempt, failure)
                confirmed = True
        if confirmed and tree.latched is None:
            await _fail_streams(owned)  # readers get the writer's failure after the tail
        level.finish(member, "failed", settle=False)
        level.fail(exc, where)
        return
    else:
        reason = "completed"
    if level.scope:
        if interrupted():  # returned or skipped after a cancellation reached it: no record
            # (ordinary mode confirms nothing and published what the node set at once: it completed)
            await _interrupted(level, member)
            return
        level.clear()  # what the next member of this step takes for its own check
    try:
        await _conclude(
            level, member, attempt, reason, writes.staged if writes is not None else {}, owned, started
        )
    except anyio.get_cancelled_exc_class():  # waiting for its streams' confirmations or sources
        level.cancelled(member)
        raise


async def _interrupted(level: Level, member: Member) -> None:
    """``member``'s chain ended after a cancellation reached it: it confirms nothing and spends no
    budget, whatever its code did; its attempt stays active for recovery."""
    level.cancelled(member)
    await accept()  # the cancellation goes on


async def _conclude(
    level: Level,
    member: Member,
    attempt: str,
    reason: Conclusion,
    staged: Mapping[Key[Any], tuple[Any, bytes | None]],
    owned: Mapping[Key[Any], GraphStream],
    started: float | None = None,
) -> None:
    """Ordinary mode: the node is done. Checkpoint mode: stage its record for the node commits.

    In checkpoint mode the node's outputs are published key by key in
    :meth:`Level.landed`, once its record is confirmed
    (:mod:`streams._node_commits`). The streams the node writes end with
    it: every message it sent is confirmed first, and in checkpoint mode
    their successful ends are confirmed in the node's own record.
    """
    tree = level.tree
    if not attempt:
        try:
            for stream in parts(owned):
                await core_of(stream).end(failed=False)
        except Exception as exc:
            level.finish(member, "failed", settle=False)
            level.fail(exc, (*level.path, member.name))
            return
        level.finish(member, reason)
        return
    refs: dict[Key[Any], tuple[StreamRef, Terminal]] = {}
    ends: tuple[StreamFinish, ...] = ()
    if owned or any(key.is_stream for key in member.provides):  # (most nodes write no stream)
        try:
            for stream in parts(owned):
                await core_of(stream).flush()
        except CheckpointError:
            level.finish(member, "failed", settle=False)
            return
        for key, endpoint in owned.items():  # ends with this record
            refs[key] = (ref_of(endpoint), "finished")
        for key in member.provides:  # a Sub's record names the source of each stream it exposes
            if key.is_stream and key not in refs:
                if not level.slots[key].settled:  # opened by its source, which may still be running
                    await level.slots[key].arrived.wait()
                source: GraphStream = level.slots[key].value
                refs[key] = (ref_of(source), terminal_of(source))
        if interrupted():
            await _interrupted(level, member)  # cancelled while its streams settled: no record is staged
            return
        level.clear()  # what the streams' confirmations ran (a store's code) is behind this finding
        ends = tuple(
            StreamFinish(core_of(s).ref, core_of(s).generation, failed=False)
            for s in parts(owned)
            if not core_of(s).done
        )
    payloads: dict[Key[Any], bytes | None] = {}
    values: dict[Key[Any], Any] = {}
    for key, (value, payload) in staged.items():  # one pass: what is recorded, what is published
        payloads[key] = payload
        values[key] = value
    record = NodeCheckpoint(member.name, reason, encode_outputs(member.provides, payloads, refs))
    commit = CheckpointCommit(level.scope, attempt, record, ends, started_at=started, ended_at=time.time())
    try:
        if tree.latched is not None:
            raise tree.latched
        await tree.node_commits.stage(StagedNode(level, member, commit, owned, values, reason))
    except CheckpointError:
        level.finish(member, "failed", settle=False)


async def _open_streams(level: Level, member: Member) -> dict[Key[Any], GraphStream]:
    """Open the streams ``member`` writes and hand their endpoints to the readers."""
    if not isinstance(member, NodeDef) or not member.streams:
        return {}
    owned: dict[Key[Any], GraphStream] = {}
    for key in member.streams:
        ref = StreamRef(level.stream_scope, member.name, key.name)
        owned[key] = await level.tree.endpoints.open(ref, level.stream_plan(key), level.scope)
        level.slots[key].settle(owned[key])
    return owned


def _restore_values(
    writes: WriteSet, member: NodeDef, slots: Mapping[Key[Any], Slot], where: tuple[str, ...], attempt: str
) -> None:
    """The seed's ``CheckpointAttempt.values``: what messages confirmed under this very attempt set.

    A reader's complete attempt, reclaimed after a crash, gets back the
    ordinary results its handlers' confirmed messages set, into its write
    set before its chain runs: published only with the node's commit. Only
    results committed under this attempt count (not a Retry's nested
    attempts, not a failed attempt's), and no key gets a value without one.
    """
    provided: dict[str, Key[Any]] | None = None  # made for a node that reads a stream, the rare one
    for key in member.requires:
        stream = slots[key].value if key.is_stream else None
        if not isinstance(stream, ManagedStream):
            continue
        if provided is None:
            provided = {out.name: out for out in member.provides if not out.is_stream}
        frontier = core_of(stream).group("/".join(where))  # the reader's group: the node's path
        if frontier.attempt != attempt:
            continue
        for name, payload in frontier.results.items():
            out = provided.get(name)
            if out is not None:
                writes.staged[out] = (codec_for(out.type).decode(payload, what=f"result {name!r}"), payload)


async def _fail_streams(owned: Mapping[Key[Any], GraphStream]) -> None:
    """Confirm a failed writer's streams as failed (a failure to do so is latched by the stream).

    Their readers are told once every end is confirmed, all at once: the
    writer's failure reaches its level before a reader's failure to read
    (a partitioned stream's partitions end one by one in the store).
    """
    ended: list[ManagedStream[Any]] = []
    try:
        for stream in parts(owned):
            with contextlib.suppress(CheckpointError):
                if await core_of(stream).confirm_end(failed=True):
                    ended.append(stream)
    finally:
        for stream in ended:
            core_of(stream).confirmed_end(failed=True)


def _confirmed_failure(member: Member, scope: str) -> ConfirmedFailureError:
    return ConfirmedFailureError(
        f"node {member.name!r} failed for good in scope {scope!r} in an earlier attempt (confirmed); "
        "its budget is not refilled: a new run of this work needs a new run id"
    )


# -- Sub mounts --------------------------------------------------------------------------------


async def run_sub(level: Level, mount: SubDef, ctx: NodeContext) -> None:
    """The body of a Sub mount's attempt: its child graph, run as a level of the tree.

    Inlets feed the child's inputs as the wired keys arrive, fixed values are
    there from the start, and outlets publish the child's keys in the parent
    as the child sets them (a stream outlet: its endpoint, as soon as its
    source opened it). In checkpoint mode the child's scope and recovery plan
    come from ``open_child`` under the mount's current attempt.
    """
    path = (*level.path, mount.name)
    for _, parent_key in mount.outlets:
        inside = parent_key.is_stream and level.stream_plan(parent_key).path[: len(path)] == path
        if inside and level.slots[parent_key].settled:
            raise OutputError(
                f"Sub {'/'.join(path)!r} runs again after a failed attempt, but the stream "
                f"{parent_key!r} its child writes was already handed to readers outside it, who would "
                "keep reading the failed attempt's stream: retry the writer inside the Sub, not the Sub"
            )
    level.tree.emit(Child(level.path, mount.name))
    scope, plan = "", dict[str, RestoredNode]()
    if level.scope:
        scope, plan = await _open_child(level, mount, attempt_scope(ctx), path)
    slots = slots_for(mount.graph)
    for key, value in mount.fixed:
        slots[key].settle(value)
    for child_key, parent_key in mount.inlets:
        level.slots[parent_key].on_settle(_feed(slots[child_key]))
    for child_key, parent_key in mount.outlets:
        if parent_key.is_stream:  # live: the endpoint, as soon as its source opens it
            slots[child_key].on_settle(_feed(level.slots[parent_key]))
        else:
            slots[child_key].on_settle(_expose(ctx, parent_key))
    ambient = () if mount.without_aspects else level.ambient
    child = Level(level.tree, mount.graph, path, ambient, slots, runner=level.runner, scope=scope, plan=plan)
    await child.run()


async def _open_child(
    level: Level, mount: SubDef, parent: str, path: tuple[str, ...]
) -> tuple[str, dict[str, RestoredNode]]:
    topology = mount.graph.topology()
    child = CheckpointChild(
        parent,
        mount.name,
        mount.graph.name,
        mount.graph.version,
        topology.fingerprint,
        _fixed_fingerprint(mount),
        tuple(sorted((c.name, p.name) for c, p in mount.inlets)),
        topology.legacy_fingerprint,
    )
    try:
        opened = await level.tree.reliable(
            "open_child", lambda hooks: hooks.open_child(child), scope_failure=parent
        )
    except CheckpointScopeFailure:
        raise ConfirmedFailureError(
            f"Sub {'/'.join(path)!r}: its child failed for good under attempt {parent!r} (confirmed)"
        ) from None
    try:
        plan = check_plan(mount.graph, opened.nodes, where=f"Sub {'/'.join(path)!r}")
    except RestorePlanError as exc:
        raise level.tree.latch(CheckpointError(f"open_child returned an invalid plan: {exc}")) from exc
    return opened.scope, plan


def _feed(slot: Slot) -> Callable[[Any], None]:
    def feed(value: Any) -> None:
        if not slot.settled:
            slot.settle(value)

    return feed


def _expose(ctx: NodeContext, key: Key[Any]) -> Callable[[Any], None]:
    def expose_value(value: Any) -> None:
        expose(ctx, key, value)

    return expose_value


def _fixed_fingerprint(mount: SubDef) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(mount.fixed, key=lambda item: item[0].name):
        digest.update(key.name.encode() + b"\0" + codec_for(key.type).encode(value) + b"\0")
    return digest.hexdigest()
