"""Whether a saved checkpoint can be resumed by this graph, and with what values.

A checkpoint is resumed only if it is one of ours (format version 1), belongs
to a graph with the same nodes, its next node still has a known input type,
and every value it holds still validates through this graph's types. If not,
the run starts over, as any at-least-once retry may, and the reason is one
of ``format``, ``graph_changed``, ``untyped`` or ``invalid`` (the last with
where and why, without values).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from pydantic import TypeAdapter, ValidationError

from .._graph_runs import GraphCheckpoint
from ._types import GraphTypes
from ._values import describe_invalid

__all__ = ["Discard", "DiscardReason", "Restore", "restore_plan"]

DiscardReason = Literal["format", "graph_changed", "untyped", "invalid"]


class Restore(msgspec.Struct, frozen=True):
    """A checkpoint to resume, with its values read back through this graph's types."""

    checkpoint: GraphCheckpoint
    state: Any
    inputs: Any
    task_inputs: Any
    output: Any


class Discard(msgspec.Struct, frozen=True):
    """Why a checkpoint is not resumed; ``error`` says where and why for ``invalid``."""

    reason: DiscardReason
    error: str | None = None


def restore_plan(saved: GraphCheckpoint | str, *, fingerprint: str, types: GraphTypes) -> Restore | Discard:
    """Resume ``saved`` or say why not (``saved`` is ``"format"`` when it was not a checkpoint)."""
    if not isinstance(saved, GraphCheckpoint) or (not saved.finished and len(saved.tasks) != 1):
        return Discard("format")
    if saved.graph_fingerprint != fingerprint:
        return Discard("graph_changed")
    task_adapter: TypeAdapter[Any] | None = None
    if saved.tasks:
        task_adapter = types.nodes.get(saved.tasks[0].node_id)
        if task_adapter is None:
            return Discard("untyped")

    def read(part: str, adapter: TypeAdapter[Any], data: bytes) -> Any:
        try:
            return adapter.validate_json(data)
        except ValidationError as exc:
            raise _Invalid(describe_invalid(part, exc, adapter)) from None

    try:
        state = read("state", types.state, saved.state)
        if saved.finished:
            return Restore(saved, state, None, None, read("output", types.output, saved.output))
        inputs = read("graph inputs", types.inputs, saved.inputs)
        assert task_adapter is not None
        task_inputs = read(f"inputs of {saved.tasks[0].node_id}", task_adapter, saved.tasks[0].inputs)
    except _Invalid as invalid:
        return Discard("invalid", str(invalid))
    return Restore(saved, state, inputs, task_inputs, None)


class _Invalid(Exception):
    pass
