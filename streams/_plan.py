"""Recovery plans: confirmed node records checked as a whole against a graph before anything is restored.

A plan is accepted only if every record names a node of the graph once,
concludes ``completed`` or ``skipped``, has an output for exactly the keys
the node provides (``ready`` with a value that reads back as the key's type,
``skipped``, or for a stream port the descriptor of the node's own stream),
and is closed over ordinary dependencies: a restored node
that requires an ordinary key produced by another node of the graph comes
with that node's record too. A stream is not such a dependency: it recovers
through its own records (descriptor, frontiers, tail), so a reader confirmed
while its writer was still active is restored, and the writer resumes. (A
Sub mount's inlets are wiring, not a gate: a restored mount needs nothing
else restored.) One bad record rejects the plan whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._codec import codec_for
from ._errors import RecordDecodeError, RestorePlanError
from ._graph import Graph, NodeDef, SubDef, members_of
from ._keys import Key, NoValue
from ._store._node_records import CheckpointOutput, Conclusion, NodeCheckpoint, Terminal
from ._store._records import StreamRef

__all__ = ["RestoredNode", "check_plan", "encode_outputs"]


@dataclass(frozen=True)
class RestoredNode:
    """A confirmed node, decoded: its conclusion and the value (or ``NoValue``) of each key it provides.

    For a stream port the value is the record's :class:`CheckpointOutput`: the
    source's reference and the terminal known when the record was made.
    """

    reason: Conclusion
    outputs: Mapping[Key[Any], Any]


def check_plan(graph: Graph, records: Iterable[NodeCheckpoint], *, where: str) -> dict[str, RestoredNode]:
    """The plan as restored nodes by name, or :class:`RestorePlanError` naming the first problem."""
    members = {member.name: member for member in members_of(graph)}
    plan: dict[str, RestoredNode] = {}
    for record in records:
        if not isinstance(record, NodeCheckpoint):
            raise RestorePlanError(f"{where}: a recovery plan holds NodeCheckpoint records, got {record!r}")
        member = members.get(record.node)
        if member is None:
            raise RestorePlanError(f"{where}: graph {graph.name!r} has no node {record.node!r}")
        if record.node in plan:
            raise RestorePlanError(f"{where}: node {record.node!r} has two records")
        if record.reason not in ("completed", "skipped"):
            raise RestorePlanError(
                f"{where}: node {record.node!r} concluded {record.reason!r}; only completed or skipped "
                "is a confirmed result"
            )
        plan[record.node] = RestoredNode(record.reason, _outputs(member, record, where))
    producers = {key: member.name for member in members_of(graph) for key in member.provides}
    for name in plan:
        member = members[name]
        if isinstance(member, SubDef):
            continue
        for key in member.requires:
            if key.is_stream:  # a stream recovers through its own records, whatever its writer's state
                continue
            producer = producers.get(key)
            if producer is not None and producer not in plan:
                raise RestorePlanError(
                    f"{where}: node {name!r} is restored but node {producer!r}, which produces its input "
                    f"{key!r}, is not: a plan is closed over the values its nodes read"
                )
    return plan


def _outputs(member: NodeDef | SubDef, record: NodeCheckpoint, where: str) -> dict[Key[Any], Any]:
    provided = {key.name: key for key in member.provides}
    names = [output.key for output in record.outputs]
    if sorted(names) != sorted(provided) or len(set(names)) != len(names):
        raise RestorePlanError(
            f"{where}: node {record.node!r} has outputs {sorted(names)}, but provides {sorted(provided)}: "
            "a record covers every key its node provides, exactly once"
        )
    outputs: dict[Key[Any], Any] = {}
    for output in record.outputs:
        key = provided[output.key]
        if key.is_stream or output.state == "stream":
            if not (key.is_stream and output.state == "stream" and output.stream is not None):
                raise RestorePlanError(
                    f"{where}: output {output.key!r} of node {record.node!r} is {output.state!r}; a stream "
                    "port's output is the descriptor of its stream, and only a stream port has one"
                )
            if output.partitions != (key.partitions or 0):
                raise RestorePlanError(
                    f"{where}: output {output.key!r} of node {record.node!r} names stream {output.stream} "
                    f"of {output.partitions} partitions, not {key!r}"
                )
            own = isinstance(member, NodeDef)  # a writer names its own stream; a Sub, the source it exposes
            if own and output.terminal == "failed":
                raise RestorePlanError(
                    f"{where}: node {record.node!r} presents its failed stream {output.stream} as a "
                    "confirmed result; only a Sub alias may carry a failed source"
                )
            if output.value is not None or (
                own and (output.stream.key != key.name or output.stream.node != record.node)
            ):
                raise RestorePlanError(
                    f"{where}: output {output.key!r} of node {record.node!r} names stream {output.stream}, "
                    "not the node's own (or carries a value beside it)"
                )
            outputs[key] = output  # the reference: the source and its terminal as recorded
        elif output.state == "skipped" and output.value is None:
            outputs[key] = NoValue
        elif output.state == "ready" and output.value is not None:
            try:
                outputs[key] = codec_for(key.type).decode(
                    output.value, what=f"{key!r} of node {record.node!r}"
                )
            except RecordDecodeError as exc:
                raise RestorePlanError(f"{where}: {exc}") from None
        else:
            raise RestorePlanError(
                f"{where}: output {output.key!r} of node {record.node!r} is {output.state!r}; a confirmed "
                "output is ready with a value, or skipped without one"
            )
    return outputs


def encode_outputs(
    provides: Iterable[Key[Any]],
    staged: Mapping[Key[Any], bytes | None],
    streams: Mapping[Key[Any], tuple[StreamRef, Terminal]] | None = None,
) -> tuple[CheckpointOutput, ...]:
    """The record's outputs: each provided key ready with its encoded value, skipped, or its stream."""
    return tuple(_output(key, staged, streams or {}) for key in provides)


def _output(
    key: Key[Any],
    staged: Mapping[Key[Any], bytes | None],
    streams: Mapping[Key[Any], tuple[StreamRef, Terminal]],
) -> CheckpointOutput:
    if key.is_stream:
        ref, terminal = streams[key]
        partitions = key.partitions or 0
        return CheckpointOutput(key.name, "stream", stream=ref, terminal=terminal, partitions=partitions)
    payload = staged.get(key)
    return (
        CheckpointOutput(key.name, "skipped")
        if payload is None
        else CheckpointOutput(key.name, "ready", payload)
    )
