"""Restored members: what a confirmed node record gives back without running anything.

A member of a level's recovery plan runs no body, no aspect and no commit:
its ordinary outputs are published as its record holds them, and the
streams it provided are reopened, never written again, so their readers
get the endpoint, its terminal and the unacknowledged tail
(:func:`reopen_streams`). A writer's record names its own stream; a Sub's
names the source of each stream it exposes, which must be the stream the
tree's wiring leads to, and is verified against the store before it is used
(:func:`verify_alias`). Anything else is a latched :class:`CheckpointError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from ._aliases import StreamPlan
from ._endpoints import stream_refs
from ._errors import CheckpointError
from ._graph import Member, NodeDef
from ._level import Level
from ._partitions import partitions_of
from ._plan import RestoredNode
from ._store._hooks import CheckpointHooks
from ._store._layouts import StreamDescriptor
from ._store._node_records import CheckpointOutput
from ._store._nodes import enclosing_scope
from ._store._records import StreamRef
from ._stream import core_of
from ._type_names import qualified_type_name, type_name

__all__ = ["reopen_streams", "verify_alias"]


async def reopen_streams(level: Level, member: Member, restored: RestoredNode) -> None:
    """A restored member's streams: reopened (never written again) so readers get endpoint, Done and tail."""
    tree = level.tree
    for key in member.provides:
        if not key.is_stream:
            continue
        reference: CheckpointOutput = restored.outputs[key]
        ref, plan = reference.stream, level.stream_plan(key)
        assert ref is not None  # check_plan saw to it
        own = StreamRef(level.stream_scope, member.name, key.name) if isinstance(member, NodeDef) else None
        if (own is not None and ref != own) or (
            plan.writer is None or ref.node != plan.writer.name or ref.key != plan.key.name
        ):
            raise tree.latch(
                CheckpointError(
                    f"the record of {'/'.join((*level.path, member.name))!r} names stream {ref}, which is "
                    "not the stream its wiring leads to"
                )
            )
        held = None if own is not None else await verify_alias(level, member, reference, plan)
        if held is not None and reference.terminal == "failed":  # no Open, no messages
            level.slots[key].settle(tree.endpoints.failed(ref, plan, held))
            continue
        stream = await tree.endpoints.open(ref, plan, level.scope)
        if reference.terminal == "finished" and not all(core_of(p).finished for p in partitions_of(stream)):
            raise tree.latch(
                CheckpointError(
                    f"stream {ref} was recorded finished by {'/'.join((*level.path, member.name))!r} but "
                    "reopened unfinished: a known terminal never regresses"
                )
            )
        level.slots[key].settle(stream)


async def verify_alias(
    level: Level, member: Member, reference: CheckpointOutput, plan: StreamPlan
) -> tuple[StreamDescriptor, ...]:
    """The descriptors of the stream a restored Sub's record names, once verified; else a latched error.

    One descriptor, or one per partition of a partitioned stream (each
    partition is verified as a stream would be).

    Its scope must be one the wiring leads to: the scope of the level
    its writer lives in, a child scope (of some attempt of each mount in
    between, :func:`~streams.store.enclosing_scope`) of the level this
    level and the writer's have in common. The store must hold it
    (asked with ``describe``, which raises no generation: a failed
    source is never opened), with the item type of the wiring's key, a
    generation no older than an endpoint of it in this tree, and the
    terminal the record knew: a recorded failure is a failure in the
    store, a recorded finish a finish.
    """
    tree = level.tree
    ref, where = reference.stream, "/".join((*level.path, member.name))
    assert ref is not None and plan.writer is not None  # checked by the caller
    recorded = reference.terminal or "unfinished"

    def refused(what: str) -> CheckpointError:
        return tree.latch(
            CheckpointError(f"the record of {where!r} names stream {ref} (recorded {recorded}), {what}")
        )

    path = level.path
    common = 0
    while common < min(len(path), len(plan.path)) and path[common] == plan.path[common]:
        common += 1
    above, mounts = _level_scope(level.scope, path[common:]), plan.path[common:]
    if above is None or _level_scope(ref.scope, mounts) != above:
        expected = f"a child scope of {above!r} through Sub {'/'.join(mounts)!r}" if mounts else repr(above)
        raise refused(
            f"but scope {ref.scope!r} is not one the wiring leads to: its writer {plan.writer.name!r} "
            f"is in {'/'.join(plan.path) or 'the root graph'!r}, whose scope is {expected}"
            if above is not None
            else f"but this level's scope {level.scope!r} is not a child scope the store's rules give"
        )
    hooks = tree.endpoints.hooks()
    key = plan.key
    found: list[StreamDescriptor] = []
    for part in stream_refs(ref, key):

        def describe(_: CheckpointHooks, part: StreamRef = part) -> Awaitable[StreamDescriptor | None]:
            return hooks.describe(part)

        # an endpoint of it in this tree, as it was when the store was asked: an open of the tree's own
        # (the resumed writer's) that lands while the answer is on its way raises it past what was read
        endpoint = tree.endpoints.streams.get(part)
        generation = None if endpoint is None else core_of(endpoint).generation
        held = await tree.reliable("describe", describe)
        which = "which" if part == ref else f"whose partition {part}"
        if held is None:
            raise refused(f"{which} the store never had")
        if held.type_name not in (type_name(key.item_type), qualified_type_name(key.item_type)):
            raise refused(f"{which} holds {held.type_name} messages, not the {key!r} of its wiring")
        if held.partitions != (key.partitions or 0):
            raise refused(f"{which} the store holds as a partition of {held.partitions}, not as {key!r}")
        if generation is not None and held.generation < generation:
            raise refused(
                f"{which} the store holds at generation {held.generation}, older than the "
                f"{generation} this execution has it open at"
            )
        state = "failed" if held.failed else "finished" if held.finished else "active"
        if (reference.terminal == "failed" and not held.failed) or (
            reference.terminal == "finished" and not held.finished
        ):
            raise refused(
                f"{which} the store holds {state} (generation {held.generation}): a failed reference "
                "must be its source's confirmed failure, and a known terminal never regresses"
            )
        found.append(held)
    return tuple(found)


def _level_scope(scope: str, mounts: Sequence[str]) -> str | None:
    """The scope of the level ``len(mounts)`` Sub layers above a level of ``scope`` (None: not a child's).

    ``mounts`` are the mounts between them, outermost first.
    """
    for mount in reversed(mounts):
        enclosing = enclosing_scope(scope, mount)
        if enclosing is None:
            return None
        scope = enclosing
    return scope
