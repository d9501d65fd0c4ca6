"""``python -m ledger messages PATH|URL STREAM``: a stream's confirmed messages as JSON lines, and a follow.

Where to start is a sequence (``--from SEQ``), after the last confirmed
message (``--from latest``: with ``--follow``, only what is confirmed after)
or the last N (``--tail N``); ``--key K`` reads the partition of a
partitioned stream that holds key K (:class:`~ledger._messages.KeyFilter`).
It reads one snapshot at a time beside the running owner and changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import time
from typing import Any, Literal, TextIO

from ._arguments import positive_float, positive_int
from ._connect import tools_for
from ._messages import KeyFilter, parse_ref, typed_key
from ._progress import progress_on

__all__ = ["add_messages_command", "run_messages_command"]


def _start(text: str) -> Literal["latest"] | int:
    """``--from``: a sequence, or ``latest`` (after the last confirmed message)."""
    if text == "latest":
        return "latest"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a sequence (a whole number from 1) nor 'latest'"
        ) from None


def _count(text: str) -> int:
    """``--tail``: a whole number of messages, 0 or more."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of messages (0 or more)")
    return int(text)


def add_messages_command(commands: Any) -> None:
    """Register ``messages`` on the CLI's subcommands."""
    messages = commands.add_parser(
        "messages",
        help="print a stream's confirmed messages as JSON lines",
        description=(
            "Print the confirmed messages of STREAM (scope/node/key, as inspect shows it), one JSON "
            "object per line (the output is always JSON lines): its sequence number and its value as "
            "its MessagePack reads (a Struct is an object, bytes are base64). Messages every group "
            "acknowledged may have been compacted away. Reads beside a running owner; changes nothing."
        ),
    )
    messages.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    messages.add_argument("stream", metavar="STREAM", help="the stream: scope/node/key")
    where = messages.add_mutually_exclusive_group()
    where.add_argument(
        "--from",
        dest="start",
        type=_start,
        default=1,
        metavar="SEQ|latest",
        help="the first sequence (default 1), or 'latest': after the last confirmed message",
    )
    where.add_argument(
        "--tail", type=_count, metavar="N", help="the last N confirmed messages (of key K, with --key)"
    )
    messages.add_argument("--limit", type=positive_int, metavar="N", help="at most N messages")
    messages.add_argument(
        "--key",
        metavar="K",
        help=(
            "of a partitioned stream (STREAM without #p), the partition that holds the messages of "
            'partition key K (JSON when it reads as JSON: 42, "42"; else a string)'
        ),
    )
    messages.add_argument(
        "--key-field",
        metavar="FIELD",
        help="with --key: only the messages whose field FIELD is K (the ledger keeps no key of a message)",
    )
    messages.add_argument(
        "--follow",
        action="store_true",
        help="then print each message confirmed after, until the stream ends (or Ctrl-C)",
    )
    messages.add_argument(
        "--interval", type=positive_float, default=0.5, metavar="S", help="--follow reads every S seconds"
    )


def run_messages_command(args: argparse.Namespace) -> int:
    """Print what ``args`` asks for; the exit code (errors are raised, one line each)."""
    ref = parse_ref(args.stream)
    key = None if args.key is None else KeyFilter(typed_key(args.key), args.key_field)
    start, last = (1, 0) if args.start == "latest" else (args.start, args.tail)
    tools = tools_for(args.path)
    with progress_on(sys.stderr) as progress:  # erased before anything else is shown
        shown = tools.messages(args.path, ref, start, args.limit, last=last, key=key, progress=progress)
    wanted = start if last is None else max(start, shown["appended"] - last + 1)
    if last != 0 and wanted <= shown["compacted_through"]:
        print(
            f"messages 1 to {shown['compacted_through']} were acknowledged by every group and compacted "
            "away; showing what is kept",
            file=sys.stderr,
        )
    if key is not None and key.field is None:
        print(
            f"showing {shown['stream']}, the partition of key {json.dumps(key.key)}: it also holds the "
            "messages of other keys that fall there; --key-field FIELD keeps those whose FIELD is the key",
            file=sys.stderr,
        )
    # while they are written, only into a file: a terminal, or a pipe's reader (less, jq), shares the screen
    with progress_on(sys.stderr, quiet=not _is_file(sys.stdout)) as progress:
        progress.phase("writing", len(shown["messages"]), unit="messages")
        for message in shown["messages"]:
            print(json.dumps(message), flush=args.follow)
            progress.advance()
    if not args.follow:
        return 0
    with contextlib.suppress(KeyboardInterrupt):  # the way to stop following: not an error
        _follow(args, key, shown)
    return 0


def _is_file(out: TextIO) -> bool:
    """Whether ``out`` is a regular file (``> messages.jsonl``)."""
    try:
        return stat.S_ISREG(os.fstat(out.fileno()).st_mode)
    except (OSError, ValueError):  # no file descriptor: a test's capture
        return False


def _follow(args: argparse.Namespace, key: KeyFilter | None, shown: dict[str, Any]) -> None:
    """Print what is confirmed after ``shown``, read every ``--interval`` seconds, until the stream ends."""
    tools = tools_for(args.path)
    ref = parse_ref(args.stream)
    seen = shown["read_through"]
    while True:
        if shown["finished"] or shown["failed"]:
            if seen >= shown["appended"]:
                ended = "failed" if shown["failed"] else "finished"
                print(f"stream {shown['stream']} {ended}", file=sys.stderr)
                return
        else:
            time.sleep(args.interval)
        shown = tools.messages(args.path, ref, seen + 1, None, key=key)
        if shown["compacted_through"] > seen:
            print(
                f"messages {seen + 1} to {shown['compacted_through']} were compacted before they were shown",
                file=sys.stderr,
            )
        for message in shown["messages"]:
            print(json.dumps(message), flush=True)
        seen = max(seen, shown["read_through"])
