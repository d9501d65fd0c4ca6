"""What the ``runs`` commands share: a run's statuses, the filters that choose runs, and one run found.

Every ``runs`` action reads the runs of ``inspect``'s report; these are the
rules it reads them by, written once for ``list``, ``show``, ``follow`` and
the acts (:mod:`ledger._runs_acts`).
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any, Final

from ._arguments import age_seconds
from ._errors import UnknownRunError
from ._runs import in_root_scope, root_scope

__all__ = [
    "NOT_ENDED",
    "STATUSES",
    "add_filters",
    "chosen",
    "found_run",
    "one_line",
    "order",
    "progress",
    "retried",
]

#: A run's statuses as the reports give them: its record's, or ``interrupted`` for a run recorded
#: running that nothing runs any more (its owner is gone).
STATUSES: Final = ("running", "interrupted", "completed", "failed", "cancelled")
#: The statuses of a run that has not ended: it may still be cancelled, and is not retried or deleted.
NOT_ENDED: Final = ("running", "interrupted")


def _when(text: str) -> datetime.datetime:
    """``--since``, ``--until``: an ISO 8601 time (UTC unless it says so), or an age: ``90s``, ``2h``."""
    ago = age_seconds(text)
    now = datetime.datetime.now(datetime.UTC)
    if ago is not None:
        return now - datetime.timedelta(seconds=ago)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a time (2026-12-01T09:30:00Z) nor an age (90s, 15m, 2h, 7d)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def add_filters(parser: Any) -> None:
    """The filters of the runs an action chooses: ``--status``, ``--graph``, ``--since``, ``--until``."""
    parser.add_argument("--status", choices=STATUSES, help="only runs of this status")
    parser.add_argument("--graph", metavar="NAME", help="only runs of this graph")
    parser.add_argument(
        "--since", type=_when, metavar="WHEN", help="only runs changed since: a time, or an age (15m, 2h, 7d)"
    )
    parser.add_argument(
        "--until", type=_when, metavar="WHEN", help="only runs last changed before: a time, or an age"
    )


def found_run(report: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Run ``run_id`` of ``inspect``'s report, or :class:`UnknownRunError`."""
    for run in report["runs"]:
        if run["run_id"] == run_id:
            found: dict[str, Any] = run
            return found
    raise UnknownRunError(f"{report['path']} has no run {run_id!r}")


def chosen(runs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs ``args``'s filters choose, newest first (the latest change; equal times by run id)."""
    found = [
        run
        for run in runs
        if (args.status is None or run["status"] == args.status)
        and (args.graph is None or run["graph"] == args.graph)
        and (args.since is None or _changed(run, args.since, since=True))
        and (args.until is None or _changed(run, args.until, since=False))
    ]
    return sorted(found, key=order, reverse=True)


def order(run: dict[str, Any]) -> tuple[str, str]:
    """Where a run comes in a listing, reversed: its last change (a record without one first), its id."""
    return (run["updated_at"] or "", run["run_id"])


def _changed(run: dict[str, Any], when: datetime.datetime, *, since: bool) -> bool:
    """Whether the run last changed at or after ``when`` (``since``), or before it."""
    if run["updated_at"] is None:  # a record from before runs kept times: it is not known when
        return False
    at = datetime.datetime.fromisoformat(run["updated_at"].replace("Z", "+00:00"))
    return at >= when if since else at < when


def retried(nodes: list[dict[str, Any]]) -> set[str]:
    """The paths of the nodes that have a Retry boundary: the failure that ends such a node's own attempt
    is the last attempt of its Retry, so it is said there, once."""
    return {node["path"] for node in nodes if node["boundary"] != "node"}


def progress(run: dict[str, Any], streams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What each node of the run's current attempt read and wrote so far, by its path, from the streams.

    ``reads``: each stream its consumer group (named by the node's path)
    reads, with the messages it handled (``acked_through``), the stream's
    appended and the ``lag`` between, from the group's frontier; ``writes``:
    each stream it writes, with its appended messages and whether it
    finished. A node is here from its first message, before any attempt of
    it is confirmed or failed.
    """
    scope = root_scope(run["run_id"], run["attempt"])
    nodes: dict[str, dict[str, Any]] = {}

    def of(path: str) -> dict[str, Any]:
        return nodes.setdefault(path, {"path": path, "reads": [], "writes": []})

    for stream in streams:
        if not in_root_scope(stream["scope"], scope):
            continue
        writer = [*_mount_path(stream["scope"][len(scope) :]), stream["node"]]
        of("/".join(writer))["writes"].append(
            {"stream": _name(stream), "appended": stream["appended"], "finished": stream["finished"]}
        )
        for group in stream["groups"]:
            of(group["group"])["reads"].append(
                {
                    "stream": _name(stream),
                    "group": group["group"],
                    "handled": group["acked_through"],
                    "appended": stream["appended"],
                    "lag": group["pending"],
                }
            )
    return sorted(nodes.values(), key=lambda node: node["path"])


def _mount_path(scope: str) -> list[str]:
    """The mounts of a scope below a run's, as a node's path names them: ``sub@0.1/inner@2`` is
    ``sub/inner`` (a consumer group is named by that path)."""
    parts = [part for part in scope.split("/") if part]
    return [name if at else part for part in parts for name, at, _ in [part.rpartition("@")]]


def _name(stream: dict[str, Any]) -> str:
    return f"{stream['scope']}/{stream['node']}/{stream['key']}"


def one_line(message: str) -> str:
    """A failure's message on one line of the listing: its first line, marked when more follow."""
    first, _, rest = message.partition("\n")
    return first + (" [...]" if rest else "")
