"""pydantic-graph tasks as the ledger saves them (:class:`ledger._graph_runs.SavedTask`), and back."""

from __future__ import annotations

from typing import Any

from pydantic_graph import GraphTaskRequest
from pydantic_graph.id_types import ForkStackItem, NodeID, NodeRunID

from .._graph_runs import SavedForkFrame, SavedTask

__all__ = ["saved_task", "task_request"]


def saved_task(task: GraphTaskRequest, inputs: bytes) -> SavedTask:
    """``task`` with its inputs as written down."""
    frames = tuple(SavedForkFrame(f.fork_id, f.node_run_id, f.thread_index) for f in task.fork_stack)
    return SavedTask(task.node_id, inputs, frames)


def task_request(saved: SavedTask, inputs: Any, *, attempt: int) -> GraphTaskRequest:
    """The task to send a fresh run, its fork-run ids prefixed with the attempt.

    A new run numbers its node runs afresh (``task:0``, ``task:1`` …), so ids
    carried over from an earlier run get a prefix no fresh id has.
    """
    stack = tuple(
        ForkStackItem(NodeID(f.fork_id), NodeRunID(f"a{attempt}.{f.node_run_id}"), f.thread_index)
        for f in saved.fork_stack
    )
    return GraphTaskRequest(NodeID(saved.node_id), inputs, stack)
