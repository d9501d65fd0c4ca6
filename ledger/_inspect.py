"""A JSON-ready summary of the streams and graph runs a ledger holds, for ``python -m ledger inspect``."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from streams import GroupFrontier
from streams.store import NodeAttemptRecord, NodeCheckpoint, StreamDescriptor, appended_at, to_plain

from ._errors import CorruptRecordError
from ._graph_runs import GraphCheckpoint, GraphRunRecord
from ._runs import RunRecord, in_root_scope

__all__ = ["graph_runs_report", "moment", "node_runs_report", "plain", "shown_status", "stream_entry"]


#: Who holds a group's partition: its member's name and when its lease runs out (PostgreSQL).
Owner = dict[str, Any]


def stream_entry(
    desc: StreamDescriptor,
    frontiers: list[tuple[GroupFrontier, str]],
    owners: dict[tuple[str, str], Owner] | None = None,
) -> dict[str, Any]:
    """A stream as the report shows it, with its groups (each frontier with where it is kept).

    ``owners`` are the leases of group members on partitions, by (stream, group).
    """
    owners = owners or {}
    groups = [
        {
            "group": frontier.group,
            "acked_through": frontier.acked_through,
            "pending": desc.appended - frontier.acked_through - len(frontier.acked_above),
            "oldest_unacked_at": _oldest_unacked(desc, frontier),
            "exhausted": len(frontier.exhausted),
            "dead_lettered": frontier.dead_lettered,
            "active_at": moment(frontier.active_at),
            "stopped": frontier.stopped,
            "state": _state(frontier.state, where),
            "owner": owners.get((str(desc.ref), frontier.group)),
        }
        for frontier, where in frontiers
    ]
    return {
        "key": desc.ref.key,
        "scope": desc.ref.scope,
        "node": desc.ref.node,
        "type": desc.type_name,
        "generation": desc.generation,
        "appended": desc.appended,
        "finished": desc.finished,
        "failed": desc.failed,
        "capacity": desc.capacity,
        "compacted_through": desc.compacted_through,
        "retain": desc.retain,
        "partitions": desc.partitions,
        "last_appended_at": moment(appended_at(desc.marks, desc.appended) or 0) if desc.appended else None,
        "groups": groups,
    }


def _oldest_unacked(desc: StreamDescriptor, frontier: GroupFrontier) -> str | None:
    """When the group's oldest unacknowledged message was appended (UTC), or None if none waits.

    From the stream's append marks (:mod:`streams._store._marks`): at most
    about a second early, so an age from it is never less than the real
    one; None too when the stream kept no mark for it. The report holds what
    the ledger holds, never the clock's now: an age is the reader's to take.
    """
    oldest = frontier.acked_through + 1
    at = appended_at(desc.marks, oldest) if oldest <= desc.appended else None
    return None if at is None else moment(at)


def node_runs_report(
    runs: list[RunRecord],
    boundaries: list[NodeAttemptRecord],
    node_record: Callable[[str, str], NodeCheckpoint | None],
    *,
    values: bool,
    holders: Mapping[str, dict[str, Any]] | None = None,
    unowned: bool = False,
) -> list[dict[str, Any]]:
    """Business runs (ledger.run): status, times, and every retry boundary with its budget and conclusion.

    ``holders`` are the leases of runs a worker holds, by run id (``owner``,
    ``expires_at``, ``expired``): on PostgreSQL, the worker running it.
    ``unowned`` says that no process owns the ledger (LMDB): its runs
    recorded running are ``interrupted`` (:func:`shown_status`).
    """
    report = []
    for run in runs:
        holder = (holders or {}).get(run.run_id)
        scope = run.scope  # the current root attempt's: a retried run shows the nodes of its retry
        nodes = []
        for attempt in boundaries:
            if not in_root_scope(attempt.parent, scope):
                continue
            checkpoint = node_record(attempt.parent, attempt.node) if attempt.committed else None
            if attempt.committed and checkpoint is None:  # its record moved or went missing
                raise CorruptRecordError(
                    f"node {attempt.node!r} under {attempt.parent!r} was confirmed, but its record is "
                    "missing; the ledger is damaged"
                )
            status = (
                checkpoint.reason if checkpoint is not None else "failed" if attempt.exhausted else "active"
            )
            node: dict[str, Any] = {
                "path": _node_path(attempt.parent[len(scope) :], attempt.node),
                "scope": attempt.parent,
                "node": attempt.node,
                "boundary": "node" if attempt.position == 0 else f"retry at {attempt.position}",
                "failures": attempt.index,
                "limit": attempt.limit,
                "status": status,
                "started_at": moment(attempt.started_at or 0),
                "ended_at": moment(attempt.ended_at or 0),
                "seconds": _took(attempt.started_at, attempt.ended_at),
                "failed": [
                    {
                        "attempt": failure.index + 1,
                        "error_type": failure.error_type,
                        "message": failure.message,
                        "started_at": moment(failure.started_at or 0),
                        "failed_at": moment(failure.failed_at),
                        "seconds": _took(failure.started_at, failure.failed_at),
                    }
                    for failure in attempt.failures
                ],
            }
            if values and checkpoint is not None:
                node["outputs"] = {
                    o.key: None if o.value is None else plain(to_plain(o.value)) for o in checkpoint.outputs
                }
            nodes.append(node)
        nodes.sort(key=lambda n: (n["path"], n["boundary"] != "node", n["boundary"]))
        report.append(
            {
                "run_id": run.run_id,
                "graph": run.graph,
                "version": run.version,
                "status": shown_status(run, holder, unowned=unowned),
                "starts": run.starts,
                "error": run.error,
                "created_at": moment(run.created_at or 0),
                "updated_at": moment(run.updated_at or 0),
                "seconds": _seconds(run),
                "holder": holder,
                "cancelled": _cancel(run),
                "topology": run.shape,  # the graph's members and their ports, to draw it
                "attempt": run.attempt,
                "retries": [
                    {
                        "by": retry.by,
                        "reason": retry.reason,
                        "at": moment(retry.at),
                        "ended": retry.ended,
                        "error": retry.error,
                    }
                    for retry in run.retries
                ],
                "nodes": nodes,
            }
        )
    return report


def shown_status(run: RunRecord, holder: dict[str, Any] | None, *, unowned: bool) -> str:
    """A run's status as the reports show it: its record's, or ``interrupted`` for a run recorded running
    whose owner is gone: its lease expired (PostgreSQL), or no process owns the ledger (LMDB, ``unowned``).

    A run that never started (submitted, ``starts`` 0) waits for a worker: it is not interrupted. A
    resume, or the worker that claims it, continues an interrupted run.
    """
    if run.status != "running" or run.starts == 0:
        return run.status
    expired = holder is not None and bool(holder["expired"])
    return "interrupted" if expired or unowned else run.status


def _node_path(scope: str, node: str) -> str:
    """A node's mount path from its scope below the run: attempt scopes ``m@p.i`` become ``m``
    (``m#2`` for a mount's second attempt); a Retry's scope inside its own node is the node."""
    names: list[str] = []
    for part in scope.strip("/").split("/") if scope.strip("/") else []:
        name, at, numbers = part.rpartition("@")
        if at and numbers.replace(".", "").isdigit():
            index = int(numbers.rpartition(".")[2])
            names.append(name if index == 0 else f"{name}#{index + 1}")
        elif not names or names[-1].split("#")[0] != part:
            names.append(part)
    if names and names[-1].split("#")[0] == node:  # a Retry boundary inside the node's own attempt
        names.pop()
    return "/".join([*names, node])


def graph_runs_report(
    found: Iterable[tuple[GraphRunRecord, GraphCheckpoint | str | None]], *, values: bool
) -> list[dict[str, Any]]:
    """Durable pydantic-graph runs: attempts, checkpoints, the step each resumes at (values if asked)."""
    runs: list[dict[str, Any]] = []
    for record, checkpoint in found:
        saved = checkpoint if isinstance(checkpoint, GraphCheckpoint) else None
        status = "finished" if record.finished else "failed" if record.error else "open"
        run: dict[str, Any] = {
            "run_id": record.run_id,
            "graph": record.graph or None,
            "status": status,
            "attempts": record.attempt,
            "checkpoints": record.checkpoints,
            "last_step": record.last_step,
            "resumes_at": saved.tasks[0].node_id if saved is not None and saved.tasks else None,
            "error": record.error,
            "discarded": record.discarded,
            "checkpoint_format": "unknown" if isinstance(checkpoint, str) else None,
        }
        if values and saved is not None:
            run["values"] = {
                "state": _json(saved.state),
                "inputs": _json(saved.inputs),
                "next_inputs": _json(saved.tasks[0].inputs) if saved.tasks else None,
                "output": _json(saved.output) if saved.finished else None,
            }
        runs.append(run)
    return runs


def _json(data: bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return base64.b64encode(data).decode()


def _state(data: bytes | None, where: str) -> Any:
    if data is None:
        return None
    try:
        return plain(to_plain(data))
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(
            f"the committed state in {where} does not decode ({exc}); "
            "the ledger is damaged or was written by an incompatible build"
        ) from None


def plain(value: Any) -> Any:
    """``value`` with bytes, dates and extension types turned into JSON values."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, msgspec.msgpack.Ext):
        return {"ext": value.code, "data": base64.b64encode(value.data).decode()}
    return str(value)


def _cancel(run: RunRecord) -> dict[str, Any] | None:
    """Who cancelled the run, why and when; None for a run nobody cancelled."""
    cancel = run.cancelled
    if cancel is None:
        return None
    return {"by": cancel.by, "reason": cancel.reason, "at": moment(cancel.at)}


def _seconds(run: RunRecord) -> float | None:
    """How long a finished run took from its record to its end (None while it runs, or not known)."""
    if run.status == "running" or run.created_at is None or run.updated_at is None:
        return None
    return round(run.updated_at - run.created_at, 3)


def _took(start: float | None, end: float | None) -> float | None:
    """Seconds from ``start`` to ``end``, to the millisecond; None where either is not known."""
    return None if start is None or end is None else round(end - start, 3)


def moment(at: float) -> str | None:
    """A wall-clock time as UTC ISO 8601 to the second; None for never."""
    if not at:
        return None
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
