"""``python -m ledger group``: an operator removes a consumer group, or moves where it reads next.

Each change is one write transaction of the ledger, made as its owner: a
ledger another process has open is refused (exit 3), and a process killed
half way leaves the group as it was or as changed, never between.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal

import anyio

from streams import CompactedHistoryError, SequenceError, UnknownStreamError, move_group, remove_group

from ._arguments import positive_int
from ._connect import connect, is_url
from ._errors import GroupChangeError, StreamNotFoundError, UnattributedBudgetsError
from ._messages import parse_ref

__all__ = ["add_group_command", "run_group_command"]


def _target(text: str) -> Literal["earliest", "latest"] | int:
    if text in ("earliest", "latest"):
        return text  # type: ignore[return-value]  # one of the two literals
    if not text.strip().lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not 'earliest', 'latest' or a sequence")
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text} is not a sequence (they start at 1)") from None


def add_group_command(commands: Any) -> None:
    """Register ``group remove`` and ``group move`` on the CLI's subcommands."""
    group = commands.add_parser(
        "group",
        help="remove a consumer group, or move where it reads next",
        description=(
            "Repair a consumer group of a stream. An LMDB ledger must not be open in another "
            "process; on PostgreSQL the change is one transaction beside running workers. "
            "Endpoints that were open on the stream must reopen it (its generation is raised)."
        ),
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    remove = actions.add_parser(
        "remove",
        help="remove a group: its frontier, state, results and budgets; free what it held back",
        description=(
            "Remove GROUP from STREAM: its frontier, explicit state, results and message budgets. "
            "Messages only it had not acknowledged may then be compacted, and writers it held at "
            "capacity have room. An application that still names the group brings it back, new."
        ),
    )
    move = actions.add_parser(
        "move",
        help="move a group's frontier: redeliver acknowledged messages, or skip some",
        description=(
            "Move GROUP of STREAM so that its next message is --to: 'earliest' (sequence 1), "
            "'latest' (after the last appended) or a sequence. Its failures, exhausted messages, "
            "budgets and stop are forgotten; say whether its explicit state and results stay."
        ),
    )
    for parser in (remove, move):
        parser.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
        parser.add_argument("stream", metavar="STREAM", help="the stream: scope/node/key")
        parser.add_argument("group", metavar="GROUP", help="the consumer group")
    move.add_argument(
        "--to", required=True, type=_target, metavar="WHERE", help="earliest, latest, or a sequence"
    )
    state = move.add_mutually_exclusive_group(required=True)
    state.add_argument("--keep-state", action="store_true", help="keep its explicit state and results")
    state.add_argument("--clear-state", action="store_true", help="clear its explicit state and results")


def run_group_command(args: argparse.Namespace) -> str:
    """Apply the change ``args`` names; the line that says what was done."""
    ref = parse_ref(args.stream)

    async def change() -> str:
        async with connect(args.path, **({} if is_url(args.path) else {"create": False})) as ledger:
            if args.action == "remove":
                await remove_group(ledger.streams, ref, args.group)
                return f"removed group {args.group!r} of {ref}"
            moved = await move_group(ledger.streams, ref, args.group, to=args.to, keep_state=args.keep_state)
            kept = "kept" if args.keep_state else "cleared"
            return (
                f"moved group {args.group!r} of {ref}: next message {moved.acked_through + 1}, state {kept}"
            )

    try:
        return anyio.run(change)
    except UnknownStreamError as exc:
        raise StreamNotFoundError(str(exc)) from None
    except (CompactedHistoryError, SequenceError, UnattributedBudgetsError) as exc:
        raise GroupChangeError(str(exc)) from None
