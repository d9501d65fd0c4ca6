"""``python -m ledger runs cancel|retry|delete``: of one run, or of every run a filter chooses.

An act names one ``RUN_ID``, or chooses runs with the filters of ``runs
list`` (``--status``, ``--graph``, ``--since``, ``--until``; at least one),
of which it takes those it applies to (:data:`APPLIES`). ``--dry-run`` says
what it would do, from the runs as ``inspect`` reads them, and changes
nothing; a run it would refuse is refused as the act would refuse it. By a
filter the act asks first on a terminal, unless ``--yes``; on a stdin that
is not a terminal it needs ``--yes``, and without it nothing is read or
changed. What each act changed is printed, or one JSON object with
``--json``: ``{"action", "dry_run", "runs": [...], "skipped": [...]}``, a
run another process changed in between listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, Final, TextIO

import anyio

from ._connect import connect, is_url, tools_for
from ._errors import RunFinishedError, RunNotEndedError, UnknownRunError
from ._ledger import Ledger
from ._runs import in_root_scope, refusal, root_scope
from ._runs_report import NOT_ENDED, add_filters, chosen, found_run

__all__ = ["APPLIES", "act_problem", "add_act_commands", "run_act"]

#: The statuses of the runs each act applies to; a filter chooses only those.
APPLIES: Final = {
    "cancel": NOT_ENDED,
    "retry": ("failed", "cancelled"),
    "delete": ("completed", "failed", "cancelled"),
}
_FILTERS: Final = ("status", "graph", "since", "until")


def add_act_commands(actions: Any) -> None:
    """Register ``runs cancel``, ``runs retry`` and ``runs delete`` on the ``runs`` actions."""
    cancel = actions.add_parser(
        "cancel",
        help="cancel a run, or the runs a filter chooses: recorded, and a worker stops each at its renewal",
        description=(
            "Record RUN_ID (or each running run the filters choose) as cancelled, with who and why. A "
            "PostgreSQL worker running it stops it at its next lease renewal; an LMDB ledger must not be "
            "open in another process (exit 3). What its nodes confirmed stays; a cancelled run is not "
            "resumed."
        ),
    )
    _act_arguments(cancel, "cancel", "cancels")
    retry = actions.add_parser(
        "retry",
        help="retry a run that failed for good or was cancelled (or each a filter chooses): fresh budgets",
        description=(
            "Record a new root attempt of RUN_ID (or of each failed or cancelled run the filters choose), "
            "with who and why: the next resume of the run (or the PostgreSQL worker that claims it) runs "
            "its graph again from the start, every node with whole budgets and new streams. The earlier "
            "attempts' records stay until the run is deleted. A running or completed run is refused; an "
            "LMDB ledger must not be open in another process (exit 3)."
        ),
    )
    _act_arguments(retry, "retry", "retries")
    delete = actions.add_parser(
        "delete",
        help="delete a run that ended (or each a filter chooses): its records and the streams it owns",
        description=(
            "Remove RUN_ID (or each ended run the filters choose) and everything of every attempt of it "
            "in one transaction: its record, its nodes' records, and the streams its nodes and its host "
            "wrote, with their messages, groups, budgets and keyed state. A running run is refused (cancel "
            "it first); the run id can then be used for a new run. An LMDB ledger must not be open in "
            "another process (exit 3)."
        ),
    )
    _act_arguments(delete, "delete", None)


def _act_arguments(parser: Any, act: str, does: str | None) -> None:
    """An act's arguments: one run or filters, who and why (cancel, retry), a dry run, the prompt."""
    parser.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    parser.add_argument("run_id", metavar="RUN_ID", nargs="?", help="the run (or choose runs by filters)")
    if does is not None:
        parser.add_argument("--reason", required=True, help=f"why, recorded with the {act}")
        parser.add_argument("--by", metavar="NAME", help=f"who {does} it (default: this host and process)")
    add_filters(parser)
    parser.add_argument("--dry-run", action="store_true", help=f"say what would {act}; change nothing")
    parser.add_argument(
        "--yes", action="store_true", help="do not ask before acting on the runs filters chose"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _filtered(args: argparse.Namespace) -> bool:
    return any(getattr(args, name) is not None for name in _FILTERS)


def act_problem(args: argparse.Namespace, stdin: TextIO) -> str | None:
    """Why the act ``args`` asks for cannot go on as asked (exit 2, nothing read or changed), if it cannot."""
    if args.run_id is not None and _filtered(args):
        return f"runs {args.action} takes a RUN_ID or filters (--status, --graph, --since, --until), not both"
    if args.run_id is None and not _filtered(args):
        return (
            f"runs {args.action} needs a RUN_ID, or at least one filter: --status, --graph, --since, --until"
        )
    if args.run_id is None and not (args.dry_run or args.yes or stdin.isatty()):
        return (
            f"runs {args.action} by filter asks before it changes anything, and stdin is not a terminal: "
            "add --yes to go on without asking, or --dry-run to list what it would do"
        )
    return None


def run_act(args: argparse.Namespace) -> tuple[str, bool]:
    """The act ``args`` asks for: what it printed, and whether it was declined at the prompt."""
    if args.run_id is not None and not args.dry_run:
        done, _ = anyio.run(_acted, args, [args.run_id])
        return _said(args, done, [], dry_run=False), False
    report = tools_for(args.path).inspect(args.path, False)
    if args.run_id is not None:
        runs = [_applies(args.action, found_run(report, args.run_id))]
    else:
        runs = [run for run in chosen(report["runs"], args) if run["status"] in APPLIES[args.action]]
    plans = [_plan(args.action, run, report["streams"]) for run in runs]
    if args.dry_run or not runs:
        return _said(args, plans, [], dry_run=True), False
    if not args.yes and not _confirmed(args.action, plans):
        print("not confirmed: nothing changed", file=sys.stderr)
        return "", True
    done, skipped = anyio.run(_acted, args, [run["run_id"] for run in runs])
    return _said(args, done, skipped, dry_run=False), False


def _applies(action: str, run: dict[str, Any]) -> dict[str, Any]:
    """``run``, if ``action`` applies to it; else the error the act would raise (a dry run is refused as
    the act would be, by the same rule: :func:`ledger._runs.refusal`)."""
    status = "running" if run["status"] in NOT_ENDED else run["status"]  # its record's, as the act reads it
    refused = refusal(action, run["run_id"], status)
    if refused is not None:
        raise refused
    return run


def _plan(action: str, run: dict[str, Any], streams: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``action`` would do to ``run``: the run as it is; for a delete, what would go with it."""
    plan = {
        "run_id": run["run_id"],
        "status": run["status"],
        "graph": run["graph"],
        "updated_at": run["updated_at"],
    }
    if action == "delete":
        roots = [root_scope(run["run_id"], n) for n in range(run["attempt"] + 1)]
        owned = [s for s in streams if any(in_root_scope(s["scope"], root) for root in roots)]
        plan["attempts"] = len(roots)
        plan["streams"] = len(owned)
        plan["messages"] = sum(s["appended"] - s["compacted_through"] for s in owned)
    return plan


def _plan_line(action: str, plan: dict[str, Any]) -> str:
    line = f"would {action} run {plan['run_id']!r} ({plan['status']}, graph {plan['graph']})"
    if "streams" in plan:
        line += (
            f": its record, the node records of its {plan['attempts']} attempt(s), {plan['streams']} "
            f"stream(s) holding {plan['messages']} message(s)"
        )
    return line


def _confirmed(action: str, plans: list[dict[str, Any]]) -> bool:
    """Ask on the terminal whether to act on the runs of ``plans``, each listed first."""
    for plan in plans:
        print(_plan_line(action, plan), file=sys.stderr)
    print(f"{action} these {len(plans)} run(s)? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


async def _acted(
    args: argparse.Namespace, run_ids: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Act on each run, in one open ledger; by a filter, a run changed since it was read is skipped."""
    act = _ACTS[args.action]
    done, skipped = [], []
    async with connect(args.path, **({} if is_url(args.path) else {"create": False})) as ledger:
        for run_id in run_ids:
            try:
                done.append(await act(ledger, run_id, args))
            except (RunFinishedError, RunNotEndedError, UnknownRunError) as refused:
                if args.run_id is not None:
                    raise
                skipped.append({"run_id": run_id, "reason": str(refused)})
    return done, skipped


async def _cancel(ledger: Ledger[Any], run_id: str, args: argparse.Namespace) -> dict[str, Any]:
    record = await ledger.cancel(run_id, reason=args.reason, by=args.by)
    assert record.cancelled is not None
    said = record.cancelled
    return {"run_id": run_id, "status": record.status, "by": said.by, "reason": said.reason, "at": said.at}


async def _retry(ledger: Ledger[Any], run_id: str, args: argparse.Namespace) -> dict[str, Any]:
    record = await ledger.retry(run_id, reason=args.reason, by=args.by)
    said = record.retries[-1]
    return {
        "run_id": run_id,
        "status": record.status,
        "attempt": record.attempt,
        "by": said.by,
        "reason": said.reason,
        "at": said.at,
        "after": said.ended,
        "error": said.error,
    }


async def _delete(ledger: Ledger[Any], run_id: str, args: argparse.Namespace) -> dict[str, Any]:
    gone = await ledger.delete(run_id)
    return {"run_id": run_id, "records": gone.records, "streams": gone.streams, "messages": gone.messages}


_ACTS: Final[dict[str, Callable[[Ledger[Any], str, argparse.Namespace], Any]]] = {
    "cancel": _cancel,
    "retry": _retry,
    "delete": _delete,
}


def _said(
    args: argparse.Namespace, runs: list[dict[str, Any]], skipped: list[dict[str, Any]], *, dry_run: bool
) -> str:
    """What an act prints: one JSON object with ``--json``, else a line per run."""
    if args.json:
        return (
            json.dumps({"action": args.action, "dry_run": dry_run, "runs": runs, "skipped": skipped}) + "\n"
        )
    if dry_run:
        lines = [_plan_line(args.action, plan) for plan in runs] or [f"no run to {args.action}"]
    else:
        lines = [_done_line(args.action, done) for done in runs]
    lines += [f"skipped run {s['run_id']!r}: {s['reason']}" for s in skipped]
    return "\n".join(lines) + "\n"


def _done_line(action: str, done: dict[str, Any]) -> str:
    name = done["run_id"]
    if action == "cancel":
        return f"cancelled run {name!r} by {done['by']} ({done['reason']})"
    if action == "retry":
        after = done["after"] + (f" with {done['error']}" if done["error"] else "")
        return (
            f"retried run {name!r} by {done['by']} ({done['reason']}): root attempt {done['attempt'] + 1}, "
            f"after it {after}; resume it to run it"
        )
    return (
        f"deleted run {name!r}: {done['records']} node record(s), {done['streams']} stream(s) "
        f"holding {done['messages']} message(s)"
    )
