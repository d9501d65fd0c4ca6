"""``python -m ledger group``: an operator removes a consumer group, or moves where it reads next.

Each change is one write transaction of the ledger, made as its owner: a
ledger another process has open is refused (exit 3), and a process killed
half way leaves the group as it was or as changed, never between.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Literal

import anyio

from streams import (
    CompactedHistoryError,
    SequenceError,
    StreamHooks,
    StreamRef,
    UnknownStreamError,
    move_group,
    remove_group,
)
from streams.store import FollowHooks, StreamRead

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


def _partition(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition (they are numbered from 0)")
    return int(text)


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
        parser.add_argument(
            "stream",
            metavar="STREAM",
            help="the stream: scope/node/key; a partitioned stream's key alone changes every partition",
        )
        parser.add_argument("group", metavar="GROUP", help="the consumer group")
        parser.add_argument(
            "--partition",
            type=_partition,
            metavar="P",
            help="of a partitioned stream, change partition P only (the same as STREAM key#P)",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="say what the change would do, checked as it would be, and change nothing",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help=(
                'print one JSON object: {"action": ..., "stream": ..., "group": ..., "dry_run": ..., '
                '"streams": [...]}, a row per stream (or partition) changed, or that would be'
            ),
        )
    move.add_argument(
        "--to", required=True, type=_target, metavar="WHERE", help="earliest, latest, or a sequence"
    )
    state = move.add_mutually_exclusive_group(required=True)
    state.add_argument("--keep-state", action="store_true", help="keep its explicit state and results")
    state.add_argument("--clear-state", action="store_true", help="clear its explicit state and results")


def run_group_command(args: argparse.Namespace) -> str:
    """Apply the change ``args`` names; the line that says what was done (``--json``: one JSON object)."""
    ref = parse_ref(args.stream)

    async def change() -> tuple[str, list[dict[str, Any]]]:
        async with connect(args.path, **({} if is_url(args.path) else {"create": False})) as ledger:
            refs = await _streams(ledger.streams, ref, args.partition)
            if args.dry_run:
                return await _dry_run(ledger.streams, ref, refs, args)
            if len(refs) > 1 or refs[0] != ref:
                return await _change_partitions(ledger.streams, ref, refs, args)
            if args.action == "remove":
                await remove_group(ledger.streams, ref, args.group)
                return f"removed group {args.group!r} of {ref}", [{"stream": str(ref)}]
            moved = await move_group(ledger.streams, ref, args.group, to=args.to, keep_state=args.keep_state)
            kept, then = "kept" if args.keep_state else "cleared", moved.acked_through + 1
            said = f"moved group {args.group!r} of {ref}: next message {then}, state {kept}"
            return said, [{"stream": str(ref), "next": then, "state": kept}]

    try:
        said, streams = anyio.run(change)
    except UnknownStreamError as exc:
        raise StreamNotFoundError(str(exc)) from None
    except (CompactedHistoryError, SequenceError, UnattributedBudgetsError) as exc:
        raise GroupChangeError(str(exc)) from None
    if not args.json:
        return said
    shown = {"action": args.action, "stream": str(ref), "group": args.group, "dry_run": args.dry_run}
    return json.dumps({**shown, "streams": streams})


async def _streams(hooks: StreamHooks, ref: StreamRef, partition: int | None) -> list[StreamRef]:
    """The streams a change of ``ref`` means: itself, or the partitions of a partitioned stream."""
    if partition is None and await hooks.describe(ref) is not None:
        return [ref]
    first = await hooks.describe(ref.partition(0))
    if first is None or not first.partitions:
        if partition is not None:
            raise StreamNotFoundError(f"the ledger holds no partitioned stream {ref}")
        return [ref]  # the change names what the ledger lacks: the rule says so
    if partition is not None:
        if partition >= first.partitions:
            raise GroupChangeError(
                f"stream {ref} has {first.partitions} partitions: 0 to {first.partitions - 1}"
            )
        return [ref.partition(partition)]
    return [ref.partition(p) for p in range(first.partitions)]


def _one_sequence_each(ref: StreamRef, refs: list[StreamRef], args: argparse.Namespace) -> None:
    """Refuse a move of several partitions to one sequence: each partition has sequences of its own."""
    if len(refs) > 1 and args.action == "move" and isinstance(args.to, int):
        raise GroupChangeError(
            f"stream {ref} is partitioned and each partition has its own sequences: move every partition "
            "to 'earliest' or 'latest', or one with --partition P to a sequence"
        )


async def _change_partitions(
    hooks: StreamHooks, ref: StreamRef, refs: list[StreamRef], args: argparse.Namespace
) -> tuple[str, list[dict[str, Any]]]:
    """The change on each partition named, each in a transaction of its own, once every one is checked.

    A partition's sequences are its own, so a move of every partition goes to
    ``earliest`` or ``latest``; what the rule would refuse on one partition
    (a group it lacks, messages compaction removed) is refused before any
    partition changes.
    """
    many = len(refs) > 1
    _one_sequence_each(ref, refs, args)
    for part in refs:
        desc = await hooks.describe(part)
        if desc is None or args.group not in desc.groups:
            raise StreamNotFoundError(
                f"partition {part} has no consumer group {args.group!r} (nothing was changed)"
            )
        if args.action == "move" and args.to == "earliest" and desc.compacted_through:
            raise GroupChangeError(
                f"group {args.group!r} cannot start at sequence 1 of {part}: messages 1 to "
                f"{desc.compacted_through} were compacted away (nothing was changed)"
            )
    where = f"{len(refs)} partitions of {ref}" if many else str(refs[0])
    if args.action == "remove":
        for part in refs:
            await remove_group(hooks, part, args.group)
        return f"removed group {args.group!r} of {where}", [{"stream": str(part)} for part in refs]
    nexts = []
    for part in refs:
        moved = await move_group(hooks, part, args.group, to=args.to, keep_state=args.keep_state)
        nexts.append(moved.acked_through + 1)
    kept = "kept" if args.keep_state else "cleared"
    said = "next messages " + ", ".join(map(str, nexts)) if many else f"next message {nexts[0]}"
    streams = [{"stream": str(part), "next": n, "state": kept} for part, n in zip(refs, nexts, strict=True)]
    return f"moved group {args.group!r} of {where}: {said}, state {kept}", streams


async def _dry_run(
    hooks: StreamHooks, ref: StreamRef, refs: list[StreamRef], args: argparse.Namespace
) -> tuple[str, list[dict[str, Any]]]:
    """What the change would do to each stream of ``refs``, refused as the change would be; nothing changes.

    The group's frontier is read as a process that did not open the stream
    reads it (``read_stream``: no generation raised, no message read).
    """
    _one_sequence_each(ref, refs, args)
    if not isinstance(hooks, FollowHooks):
        raise GroupChangeError(f"this ledger cannot read the frontier of {ref} without opening it")
    lines, streams = [], []
    for part in refs:
        desc = await hooks.describe(part)
        if desc is None or args.group not in desc.groups:
            problem = f"{part} has no consumer group {args.group!r}"
            raise StreamNotFoundError(problem if desc is not None else f"the ledger holds no stream {part}")
        read = await hooks.read_stream(
            StreamRead(part, desc.type_name, (args.group,), desc.partitions, desc.appended)
        )
        assert read is not None  # described just now, in the same ledger
        [frontier] = [g for g in read.groups if g.group == args.group]
        now = frontier.acked_through + 1
        found = {
            "stream": str(part),
            "acked_through": now - 1,
            "appended": desc.appended,
            "exhausted": len(frontier.exhausted),
            "failing": len(frontier.failing),
        }
        if args.action == "remove":
            streams.append(found)
            lines.append(
                f"would remove group {args.group!r} of {part}: acknowledged through {now - 1} of "
                f"{desc.appended}, {len(frontier.exhausted)} exhausted, {len(frontier.failing)} failing; its "
                "state, results and budgets go"
            )
            continue
        to = 1 if args.to == "earliest" else desc.appended + 1 if args.to == "latest" else args.to
        if to <= desc.compacted_through:
            raise GroupChangeError(
                f"group {args.group!r} cannot start at sequence {to} of {part}: messages 1 to "
                f"{desc.compacted_through} were compacted away (nothing was changed)"
            )
        if to > desc.appended + 1:
            raise GroupChangeError(
                f"group {args.group!r} cannot start at sequence {to} of {part}: it has {desc.appended} "
                "messages (nothing was changed)"
            )
        effect = (
            f"{now - to} acknowledged messages handled again"
            if to < now
            else f"{to - now} messages skipped unhandled"
            if to > now
            else "no message handled again or skipped"
        )
        kept = "kept" if args.keep_state else "cleared"
        again, skipped = max(now - to, 0), max(to - now, 0)
        streams.append({**found, "next": to, "handled_again": again, "skipped": skipped, "state": kept})
        lines.append(
            f"would move group {args.group!r} of {part}: next message {now} -> {to} ({effect}), "
            f"{len(frontier.exhausted)} exhausted and {len(frontier.failing)} failing forgotten, state {kept}"
        )
    return "\n".join([*lines, "dry run: nothing was changed"]), streams
