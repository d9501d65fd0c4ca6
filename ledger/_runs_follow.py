"""``python -m ledger runs follow``: a run's changes as they are read, each stamped with when it happened.

The ledger is read as ``inspect`` reads it, every ``--interval`` seconds;
each change found since the read before is an event: the run's status (its
start, its end, its owner gone), a node's status or budget, and each failed
attempt. An event's time is the one the ledger keeps for it (the run's
``updated_at``, its cancel's time, a node's ``ended_at``, a failure's
``failed_at``), never the moment it was read: events of a run that ended
long ago read as they happened. An event the ledger keeps no time for (a
run's owner found gone on LMDB) has none: ``-``, ``null`` in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ._colour import Colours
from ._connect import tools_for
from ._runs_report import NOT_ENDED, found_run, one_line, retried

__all__ = ["follow"]

#: An event: what happened, when (the ledger's time, None if it keeps none), and its line of text.
Event = tuple[dict[str, Any], str]


def follow(args: argparse.Namespace, colours: Colours) -> tuple[str, bool]:
    """Print the run's changes as they are read; once it ended, its last event and whether it failed."""
    tools = tools_for(args.path)
    seen = _Seen()
    while True:
        run = found_run(tools.inspect(args.path, False), args.run_id)
        events = [*seen.node_events(run, colours), *seen.run_events(run, colours)]
        ended = run["status"] not in NOT_ENDED
        last = events.pop() if ended else None  # the run's end: the command's last line
        for event in sorted(events, key=lambda e: e[0]["at"] or ""):
            print(_said(event, args.json), flush=True)
        if last is not None:
            return _said(last, args.json) + "\n", run["status"] == "failed"
        time.sleep(args.interval)


def _said(event: Event, as_json: bool) -> str:
    fields, text = event
    return json.dumps(fields) if as_json else f"{fields['at'] or '-'} {text}"


class _Seen:
    """What a follow printed so far: each boundary's status and budget, its failures, the run's status."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[str, str], str] = {}
        self._told: dict[tuple[str, str], int] = {}  # the last failed attempt printed of each boundary
        self._status: str | None = None

    def node_events(self, run: dict[str, Any], colours: Colours) -> list[Event]:
        """Each boundary whose status or budget changed, then each of its attempts that failed since."""
        events: list[Event] = []
        has_retry = retried(run["nodes"])
        for node in run["nodes"]:
            where = (node["path"], node["boundary"])
            said = f"{node['status']}, {node['failures']} of {node['limit']} attempt(s) failed"
            if self._nodes.get(where) == said:
                continue
            self._nodes[where] = said
            boundary = "" if node["boundary"] == "node" else f", {node['boundary']}"
            shown = f"{colours.status(node['status'])}{said[len(node['status']) :]}"
            fields = {
                "at": _node_time(node),
                "run_id": run["run_id"],
                "event": "node",
                "path": node["path"],
                "boundary": node["boundary"],
                "status": node["status"],
                "failures": node["failures"],
                "limit": node["limit"],
            }
            events.append((fields, f"node {node['path']}{boundary}: {shown}"))
            own = node["boundary"] == "node" and node["path"] in has_retry  # said by its Retry's last
            failures = [] if own else node["failed"]
            for failure in [f for f in failures if f["attempt"] > self._told.get(where, 0)]:
                fields = {
                    "at": failure["failed_at"],
                    "run_id": run["run_id"],
                    "event": "attempt_failed",
                    "path": node["path"],
                    "boundary": node["boundary"],
                    "attempt": failure["attempt"],
                    "error_type": failure["error_type"],
                    "message": failure["message"],
                }
                text = (
                    f"node {node['path']}{boundary}: attempt {failure['attempt']} failed: "
                    f"{failure['error_type']}: {one_line(failure['message'])}"
                )
                events.append((fields, text))
            self._told[where] = max([self._told.get(where, 0), *(f["attempt"] for f in node["failed"])])
        return events

    def run_events(self, run: dict[str, Any], colours: Colours) -> list[Event]:
        """The run's status, if it changed: its start, its owner gone, or its end (always last)."""
        status = run["status"]
        if status == self._status:
            return []
        self._status = status
        fields: dict[str, Any] = {
            "at": _run_time(run),
            "run_id": run["run_id"],
            "event": "run",
            "status": status,
            "starts": run["starts"],
            "error": run["error"],
            "cancelled": run["cancelled"],
        }
        text = f"run {run['run_id']}: {colours.status(status)}"
        if status == "running":
            text += f", started {run['starts']} time(s)"
        elif status == "interrupted":
            text += " (its owner is gone: resume it to continue); following on"
        elif run["cancelled"] is not None:
            text += f" by {run['cancelled']['by']} ({run['cancelled']['reason']})"
        elif run["error"]:
            text += f" ({run['error']})"
        return [(fields, text)]


def _node_time(node: dict[str, Any]) -> str | None:
    """When a boundary's change happened: its confirmed attempt's end, else its last failure."""
    if node["ended_at"] is not None:
        return str(node["ended_at"])
    failed = [f["failed_at"] for f in node["failed"] if f["failed_at"] is not None]
    return max(failed) if failed else None


def _run_time(run: dict[str, Any]) -> str | None:
    """When the run's status changed: its cancel, its lease's end (its owner gone), else its record's."""
    if run["cancelled"] is not None:
        return str(run["cancelled"]["at"])
    if run["status"] == "interrupted":
        holder = run["holder"]
        return None if holder is None else str(holder["lease_expires"])
    return None if run["updated_at"] is None else str(run["updated_at"])
