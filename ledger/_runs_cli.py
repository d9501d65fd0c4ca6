"""``python -m ledger runs``: the runs of ``ledger.run`` (and of workers), listed, filtered and shown.

Read-only, through the same reads as ``inspect`` (an LMDB ledger is read
while its owner runs; PostgreSQL beside its workers): ``runs list`` with
``--status``, ``--graph``, ``--since`` and ``--limit``, newest first, and
``runs show RUN_ID`` with every node's boundary, budget and status, and on
PostgreSQL the worker holding the run's lease.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from typing import Any, Final

import anyio

from ._arguments import age_seconds, positive_float, positive_int
from ._colour import PLAIN, Colours
from ._connect import connect, is_url, tools_for
from ._errors import UnknownRunError
from ._table import aligned

__all__ = ["add_runs_command", "run_runs_command"]

STATUSES: Final = ("running", "completed", "failed", "cancelled")


def _since(text: str) -> datetime.datetime:
    """``--since``: an ISO 8601 time (UTC unless it says so), or an age: ``90s``, ``15m``, ``2h``, ``7d``."""
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


def add_runs_command(commands: Any) -> None:
    """Register ``runs list|show|follow|cancel|retry|delete`` on the CLI's subcommands."""
    runs = commands.add_parser(
        "runs",
        help="list, show and follow the runs of ledger.run and workers; cancel, retry or delete one",
        description=(
            "The runs of a ledger. list, show and follow read it as inspect does, beside its owner or "
            "workers, and write nothing; cancel, retry and delete write the run's record (each says what "
            "it changed)."
        ),
    )
    actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the runs, newest first, filtered")
    listing.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    listing.add_argument("--status", choices=STATUSES, help="only runs of this status")
    listing.add_argument("--graph", metavar="NAME", help="only runs of this graph")
    listing.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="only runs changed since: a time, or an age (15m, 2h, 7d)",
    )
    listing.add_argument("--limit", type=positive_int, metavar="N", help="at most N runs")
    listing.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="one run: its record, times, holder and every node")
    show.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    show.add_argument("run_id", metavar="RUN_ID", help="the run")
    show.add_argument("--values", action="store_true", help="also print the nodes' confirmed outputs")
    show.add_argument("--json", action="store_true", help="print JSON")
    follow = actions.add_parser(
        "follow",
        help="follow one run live: a line per change of its status or a node's, until it ends",
        description=(
            "Print RUN_ID's status, then a line each time it or one of its nodes changes, read as "
            "inspect reads the ledger every --interval seconds; end when the run does (exit 0, or 1 "
            "if it failed for good)."
        ),
    )
    follow.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    follow.add_argument("run_id", metavar="RUN_ID", help="the run")
    follow.add_argument(
        "--interval", type=positive_float, default=0.5, metavar="S", help="seconds between reads (0.5)"
    )
    cancel = actions.add_parser(
        "cancel",
        help="cancel a run: recorded, and its worker stops it at its next lease renewal",
        description=(
            "Record RUN_ID as cancelled, with who and why. A PostgreSQL worker running it stops it "
            "at its next lease renewal; an LMDB ledger must not be open in another process (exit 3). "
            "What its nodes confirmed stays; a cancelled run is not resumed."
        ),
    )
    _recorded_act(cancel, "cancel", "cancels")
    retry = actions.add_parser(
        "retry",
        help="retry a run that failed for good or was cancelled: a new root attempt, fresh budgets",
        description=(
            "Record a new root attempt of RUN_ID, with who and why: the next resume of the run (or "
            "the PostgreSQL worker that claims it) runs its graph again from the start, every node "
            "with whole budgets and new streams. The earlier attempts' records stay until the run is "
            "deleted. A running or completed run is refused; an LMDB ledger must not be open in "
            "another process (exit 3)."
        ),
    )
    _recorded_act(retry, "retry", "retries")
    delete = actions.add_parser(
        "delete",
        help="delete a run that ended: its record, its nodes' records and the streams it owns",
        description=(
            "Remove RUN_ID and everything of every attempt of it in one transaction: its record, its "
            "nodes' records, and the streams its nodes and its host wrote, with their messages, groups, "
            "budgets and keyed state. A running run is refused (cancel it first); the run id can then "
            "be used for a new run. An LMDB ledger must not be open in another process (exit 3)."
        ),
    )
    delete.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    delete.add_argument("run_id", metavar="RUN_ID", help="the run")


def _recorded_act(parser: Any, act: str, does: str) -> None:
    """The arguments of an act on a run that is recorded with who and why: cancel, retry."""
    parser.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    parser.add_argument("run_id", metavar="RUN_ID", help="the run")
    parser.add_argument("--reason", required=True, help=f"why, recorded with the {act}")
    parser.add_argument("--by", metavar="NAME", help=f"who {does} it (default: this host and process)")


def run_runs_command(args: argparse.Namespace, colours: Colours = PLAIN) -> tuple[str, bool]:
    """What ``args`` asks for: the text to print, and whether it says a followed run failed for good."""
    if args.action == "cancel":
        return _cancel(args), False
    if args.action == "retry":
        return _retry(args), False
    if args.action == "delete":
        return _delete(args), False
    if args.action == "follow":
        return _follow(args, colours)
    report = tools_for(args.path).inspect(args.path, getattr(args, "values", False))
    runs: list[dict[str, Any]] = report["runs"]
    if args.action == "show":
        found = [run for run in runs if run["run_id"] == args.run_id]
        if not found:
            raise UnknownRunError(f"{report['path']} has no run {args.run_id!r}")
        return (json.dumps(found[0]) + "\n" if args.json else _shown(found[0], colours)), False
    chosen = [
        run
        for run in runs
        if (args.status is None or run["status"] == args.status)
        and (args.graph is None or run["graph"] == args.graph)
        and (args.since is None or _changed_since(run, args.since))
    ]
    chosen.sort(key=lambda run: (run["updated_at"] or "", run["run_id"]), reverse=True)
    if args.limit is not None:
        chosen = chosen[: args.limit]
    listed = [{k: v for k, v in run.items() if k not in ("nodes", "topology")} for run in chosen]
    return (json.dumps(listed) + "\n" if args.json else _listed(listed, colours)), False


def _changed_since(run: dict[str, Any], since: datetime.datetime) -> bool:
    if run["updated_at"] is None:  # a record from before runs kept times: it is not known to be recent
        return False
    return datetime.datetime.fromisoformat(run["updated_at"].replace("Z", "+00:00")) >= since


def _listed(runs: list[dict[str, Any]], colours: Colours) -> str:
    if not runs:
        return "no runs\n"
    rows = [
        ("RUN", "GRAPH", "VERSION", "STATUS", "STARTS", "CREATED", "UPDATED", "SECONDS", "HOLDER", "ERROR")
    ]
    rows += [
        (
            run["run_id"],
            run["graph"],
            run["version"],
            run["status"],
            str(run["starts"]),
            run["created_at"] or "-",
            run["updated_at"] or "-",
            "-" if run["seconds"] is None else f"{run['seconds']:g}",
            _holder(run["holder"]),
            run["error"] or "-",
        )
        for run in runs
    ]
    status = rows[0].index("STATUS")

    def paint(row: int, column: int, cell: str) -> str:
        return colours.status(cell) if row > 0 and column == status else cell

    lines = aligned(rows, left=len(rows[0]), paint=paint)
    return "\n".join([colours.header(lines[0]), *lines[1:]]) + "\n"


def _holder(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "-"
    return (
        f"{holder['owner']} (lease {'expired' if holder['expired'] else 'until'} {holder['lease_expires']})"
    )


def _shown(run: dict[str, Any], colours: Colours) -> str:
    failed = f", failed with {run['error']}" if run["error"] else ""
    took = "" if run["seconds"] is None else f", took {run['seconds']:g} s"
    status = colours.status(run["status"])
    lines = [
        f"run {run['run_id']}: graph {run['graph']} version {run['version']}, {status}{failed}",
        f"  started {run['starts']} time(s); created {run['created_at'] or '-'}, updated "
        f"{run['updated_at'] or '-'}{took}",
        f"  held by {_holder(run['holder'])}" if run["holder"] is not None else "  held by no worker",
        *(
            f"  retried {retry['at']} by {retry['by']} ({retry['reason']}), after it {retry['ended']}"
            + (f" with {retry['error']}" if retry["error"] else "")
            for retry in run["retries"]
        ),
        "  nodes:" if run["nodes"] else "  no node attempt yet",
    ]
    for node in run["nodes"]:
        budget = f"{node['failures']} of {node['limit']} attempt(s) failed"
        where = node["path"] if node["boundary"] == "node" else f"{node['path']}, {node['boundary']}"
        ran = ""
        if node["ended_at"] is not None:
            took = "" if node["seconds"] is None else f", {node['seconds']:g} s"
            ran = f", ran {node['started_at'] or '-'} to {node['ended_at']}{took}"
        outputs = f"  {json.dumps(node['outputs'])}" if "outputs" in node else ""
        lines.append(f"    {where}: {colours.status(node['status'])}, {budget}{ran}{outputs}")
        for failure in node["failed"]:
            took = "" if failure["seconds"] is None else f" after {failure['seconds']:g} s"
            lines.append(
                f"      attempt {failure['attempt']} failed {failure['failed_at']}{took}: "
                f"{failure['error_type']}: {_one_line(failure['message'])}"
            )
    return "\n".join(lines) + "\n"


def _one_line(message: str) -> str:
    """A failure's message on one line of the listing: its first line, marked when more follow."""
    first, _, rest = message.partition("\n")
    return first + (" [...]" if rest else "")


def _cancel(args: argparse.Namespace) -> str:
    async def cancel() -> str:
        async with connect(args.path, **({} if is_url(args.path) else {"create": False})) as ledger:
            record = await ledger.cancel(args.run_id, reason=args.reason, by=args.by)
        assert record.cancelled is not None
        return f"cancelled run {record.run_id!r} by {record.cancelled.by} ({record.cancelled.reason})\n"

    return anyio.run(cancel)


def _retry(args: argparse.Namespace) -> str:
    async def retry() -> str:
        async with connect(args.path, **({} if is_url(args.path) else {"create": False})) as ledger:
            record = await ledger.retry(args.run_id, reason=args.reason, by=args.by)
        said = record.retries[-1]
        return (
            f"retried run {record.run_id!r} by {said.by} ({said.reason}): root attempt {record.attempt + 1}, "
            f"after it {said.ended}{f' with {said.error}' if said.error else ''}; resume it to run it\n"
        )

    return anyio.run(retry)


def _delete(args: argparse.Namespace) -> str:
    async def delete() -> str:
        async with connect(args.path, **({} if is_url(args.path) else {"create": False})) as ledger:
            gone = await ledger.delete(args.run_id)
        return (
            f"deleted run {gone.run_id!r}: {gone.records} node record(s), {gone.streams} stream(s) "
            f"holding {gone.messages} message(s)\n"
        )

    return anyio.run(delete)


def _follow(args: argparse.Namespace, colours: Colours) -> tuple[str, bool]:
    """Print the run's changes as they are read; once it ended, its last line and whether it failed."""
    tools = tools_for(args.path)
    seen: dict[tuple[str, str], str] = {}
    told: dict[tuple[str, str], int] = {}  # the last failed attempt printed of each boundary
    status = None
    while True:
        report = tools.inspect(args.path, False)
        found = [run for run in report["runs"] if run["run_id"] == args.run_id]
        if not found:
            raise UnknownRunError(f"{report['path']} has no run {args.run_id!r}")
        run = found[0]
        for node in run["nodes"]:
            where = (node["path"], node["boundary"])
            said = f"{node['status']}, {node['failures']} of {node['limit']} attempt(s) failed"
            if seen.get(where) != said:
                seen[where] = said
                boundary = "" if node["boundary"] == "node" else f", {node['boundary']}"
                shown = f"{colours.status(node['status'])}{said[len(node['status']) :]}"
                print(f"{_now()} node {node['path']}{boundary}: {shown}", flush=True)
                for failure in [f for f in node["failed"] if f["attempt"] > told.get(where, 0)]:
                    print(
                        f"{_now()} node {node['path']}{boundary}: attempt {failure['attempt']} failed: "
                        f"{failure['error_type']}: {_one_line(failure['message'])}",
                        flush=True,
                    )
                told[where] = max([told.get(where, 0), *(f["attempt"] for f in node["failed"])])
        if run["status"] != status:
            status = run["status"]
            if status == "running":
                running = colours.status("running")
                print(f"{_now()} run {args.run_id}: {running}, started {run['starts']} time(s)", flush=True)
        if status != "running":
            why = f" ({run['error']})" if run["error"] else ""
            if run["cancelled"] is not None:
                why = f" by {run['cancelled']['by']} ({run['cancelled']['reason']})"
            return f"{_now()} run {args.run_id}: {colours.status(run['status'])}{why}\n", status == "failed"
        time.sleep(args.interval)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%H:%M:%SZ")
