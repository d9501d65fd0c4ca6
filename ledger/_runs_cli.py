"""``python -m ledger runs``: the runs of ``ledger.run`` (and of workers), listed, filtered and shown.

``runs list``, ``runs show`` and ``runs follow`` read the ledger as
``inspect`` does (an LMDB ledger beside its owner; PostgreSQL beside its
workers) and write nothing: ``runs list`` with ``--status``, ``--graph``,
``--since``, ``--until`` and pages of ``--limit`` continued ``--after`` a
cursor, newest first; ``runs show RUN_ID`` with every node's boundaries,
budget, status and progress, and on PostgreSQL the worker holding the run's
lease; ``runs follow`` in :mod:`ledger._runs_follow`. ``runs cancel``,
``retry`` and ``delete``, of one run or of the runs a filter chooses, are
:mod:`ledger._runs_acts`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

from ._arguments import positive_float, positive_int
from ._colour import PLAIN, Colours
from ._connect import tools_for
from ._runs_acts import add_act_commands, run_act
from ._runs_follow import follow
from ._runs_report import NOT_ENDED, STATUSES, add_filters, chosen, found_run, one_line, order, progress
from ._table import aligned

__all__ = ["STATUSES", "add_runs_command", "run_runs_command"]


def _cursor(text: str) -> tuple[str, str]:
    """``--after``: the cursor ``runs list`` printed, ``UPDATED_AT/RUN_ID`` of the last run listed."""
    updated, slash, run_id = text.partition("/")
    if not slash or not run_id or (updated and not updated.endswith("Z")):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cursor of runs list (UPDATED_AT/RUN_ID, as its last page said)"
        )
    return updated, run_id


def add_runs_command(commands: Any) -> None:
    """Register ``runs list|show|follow|cancel|retry|delete`` on the CLI's subcommands."""
    runs = commands.add_parser(
        "runs",
        help="list, show and follow the runs of ledger.run and workers; cancel, retry or delete them",
        description=(
            "The runs of a ledger. list, show and follow read it as inspect does, beside its owner or "
            "workers, and write nothing; cancel, retry and delete write the run's record (each says what "
            "it changed, and --dry-run what it would change)."
        ),
    )
    actions = runs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the runs, newest first, filtered, a page at a time")
    listing.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    add_filters(listing)
    listing.add_argument(
        "--limit", type=positive_int, metavar="N", help="at most N runs; a cursor on stderr if more remain"
    )
    listing.add_argument(
        "--after", type=_cursor, metavar="CURSOR", help="the runs after the cursor a --limit page printed"
    )
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
            "Print RUN_ID's status, then a line each time it or one of its nodes changes, stamped with "
            "when it happened, read as inspect reads the ledger every --interval seconds; end when the "
            "run does (exit 0, or 1 if it failed for good)."
        ),
    )
    follow.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    follow.add_argument("run_id", metavar="RUN_ID", help="the run")
    follow.add_argument(
        "--interval", type=positive_float, default=0.5, metavar="S", help="seconds between reads (0.5)"
    )
    follow.add_argument("--json", action="store_true", help="print a JSON object per event, a line each")
    add_act_commands(actions)


def run_runs_command(args: argparse.Namespace, colours: Colours = PLAIN) -> tuple[str, bool]:
    """What ``args`` asks for: the text to print, and whether it says a followed run failed for good."""
    if args.action in ("cancel", "retry", "delete"):
        return run_act(args)
    if args.action == "follow":
        return follow(args, colours)
    report = tools_for(args.path).inspect(args.path, getattr(args, "values", False))
    if args.action == "show":
        run = found_run(report, args.run_id)
        run["progress"] = progress(run, report["streams"])
        return (json.dumps(run) + "\n" if args.json else _shown(run, colours)), False
    return _list(report, args, colours), False


def _list(report: dict[str, Any], args: argparse.Namespace, colours: Colours) -> str:
    """``runs list``: a page of the chosen runs; the cursor of the next on stderr, if more remain."""
    runs = chosen(report["runs"], args)
    if args.after is not None:
        runs = [run for run in runs if order(run) < args.after]
    if args.limit is not None and len(runs) > args.limit:
        runs = runs[: args.limit]
        last = runs[-1]
        print(
            f"more runs: continue with --after '{last['updated_at'] or ''}/{last['run_id']}'", file=sys.stderr
        )
    listed = [{k: v for k, v in run.items() if k not in ("nodes", "topology")} for run in runs]
    return json.dumps(listed) + "\n" if args.json else _listed(listed, colours)


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
    status = colours.status(run["status"])
    said = f"{status} with {run['error']}" if run["error"] else status  # the status said once
    took = "" if run["seconds"] is None else f", took {run['seconds']:g} s"
    lines = [
        f"run {run['run_id']}: graph {run['graph']} version {run['version']}, {said}",
        f"  started {run['starts']} time(s); created {run['created_at'] or '-'}, updated "
        f"{run['updated_at'] or '-'}{took}",
        f"  held by {_holder(run['holder'])}" if run["holder"] is not None else "  held by no worker",
        *(
            ["  nothing runs it any more (its owner is gone): resume it to continue, or cancel it"]
            if run["status"] == "interrupted"
            else []
        ),
        *(
            f"  retried {retry['at']} by {retry['by']} ({retry['reason']}), after it {retry['ended']}"
            + (f" with {retry['error']}" if retry["error"] else "")
            for retry in run["retries"]
        ),
        "  nodes:" if run["nodes"] or run["progress"] else "  no node attempt yet",
    ]
    moved = {node["path"]: node for node in run["progress"]}
    for path, boundaries in itertools.groupby(run["nodes"], key=lambda node: node["path"]):
        lines.extend(_node_lines(list(boundaries), colours))  # its own boundary first, then its Retry's
        lines.extend(_progress_lines(moved.pop(_unnumbered(path), None)))
    for path, node in moved.items():  # read or wrote, with no attempt confirmed or failed yet
        status = run["status"] if run["status"] in NOT_ENDED else "stopped with the run"
        lines.append(f"    {path}: {colours.status(status)}")
        lines.extend(_progress_lines(node))
    return "\n".join(lines) + "\n"


def _unnumbered(path: str) -> str:
    """A node's path as its consumer group names it: without a retried mount's attempt (``m#2``)."""
    return "/".join(part.split("#")[0] for part in path.split("/"))


def _node_lines(boundaries: list[dict[str, Any]], colours: Colours) -> list[str]:
    """One node: its own attempt's status, then each Retry boundary inside it with its attempts.

    The node's own boundary fails once, when the failure escapes its Retry
    boundaries: that failure is the last of their attempts, so it is listed
    there only, and the node's attempts read as they ran.
    """
    own = next((b for b in boundaries if b["boundary"] == "node"), None)
    retries = [b for b in boundaries if b["boundary"] != "node"]
    path = boundaries[0]["path"]
    if own is None:  # its Retry boundary was written before the node's own record
        lines = [f"    {path}: {colours.status('active')}"]
    else:
        budget = "" if retries else f", {own['failures']} of {own['limit']} attempt(s) failed"
        ran = ""
        if own["ended_at"] is not None:
            took = "" if own["seconds"] is None else f", {own['seconds']:g} s"
            ran = f", ran {own['started_at'] or '-'} to {own['ended_at']}{took}"
        outputs = f"  {json.dumps(own['outputs'])}" if "outputs" in own else ""
        lines = [f"    {path}: {colours.status(own['status'])}{budget}{ran}{outputs}"]
        if not retries:
            lines.extend(_failure_lines(own, "      "))
    for retry in retries:
        exhausted = f", {colours.status('exhausted')}" if retry["status"] == "failed" else ""
        lines.append(
            f"      {retry['boundary']}: {retry['failures']} of {retry['limit']} attempt(s) failed{exhausted}"
        )
        lines.extend(_failure_lines(retry, "        "))
    return lines


def _progress_lines(node: dict[str, Any] | None) -> list[str]:
    """What a node read and wrote: handled and lag of each stream it reads, appended of each it writes."""
    if node is None:
        return []
    lines = [
        f"      reads {read['stream']}: {read['handled']} of {read['appended']} handled, lag {read['lag']}"
        for read in node["reads"]
    ]
    for write in node["writes"]:
        finished = ", finished" if write["finished"] else ""
        lines.append(f"      writes {write['stream']}: {write['appended']} appended{finished}")
    return lines


def _failure_lines(boundary: dict[str, Any], indent: str) -> list[str]:
    lines = []
    for failure in boundary["failed"]:
        took = "" if failure["seconds"] is None else f" after {failure['seconds']:g} s"
        lines.append(
            f"{indent}attempt {failure['attempt']} failed {failure['failed_at']}{took}: "
            f"{failure['error_type']}: {one_line(failure['message'])}"
        )
    return lines
