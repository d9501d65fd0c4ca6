"""The command line, ``python -m ledger``: the demo, and the tools to inspect, read, check and copy a ledger.

Errors are one line on stderr, with an exit code per kind of failure
(:data:`_EXIT_CODES`; the table is in docs/reference.md); the ledger is left
as it was.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
import msgspec

from streams import StoreDamagedError, StreamsError, __version__

from ._arguments import positive_float, positive_int, size
from ._colour import Colours, colours_for
from ._connect import tools_for
from ._console_cli import add_console_command, run_console_command
from ._demo import DemoProgress, DemoSummary
from ._errors import (
    BackupDestinationError,
    ConsoleQueryError,
    ConsoleTokenError,
    CorruptRecordError,
    DamagedLedgerError,
    DemoMismatchError,
    GraphsNotFoundError,
    GroupChangeError,
    LedgerError,
    LedgerInUseError,
    LedgerLockedError,
    LedgerPathError,
    LedgerReadOnlyError,
    ListenAddressError,
    MapFullError,
    MissingExtraError,
    NotALedgerError,
    PostgresOnlyError,
    RunFinishedError,
    RunNotEndedError,
    SchemaVersionError,
    StreamNotFoundError,
    UnknownRunError,
)
from ._groups import add_group_command, run_group_command
from ._messages import filtered, group_rows, key_bytes, key_range, parse_ref, shown_key, with_rates
from ._messages_cli import add_messages_command, run_messages_command
from ._metrics_cli import add_metrics_command, run_metrics_command
from ._postgres_cli import (
    add_migrate_command,
    add_worker_command,
    run_migrate_command,
    run_worker_command,
)
from ._progress import as_clock, progress_on
from ._runs_acts import APPLIES, act_problem
from ._runs_cli import add_runs_command, run_runs_command
from ._table import aligned
from ._termination import Terminated, stops_as_interrupts

__all__ = ["main"]


EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1  # something failed while running
EXIT_USAGE: Final = 2  # the arguments or the input were wrong
EXIT_IN_USE: Final = 3  # another process owns the ledger (or this one has it open)
EXIT_DAMAGED: Final = 4  # a record or the data file is damaged (check found damage)
EXIT_VERSION: Final = 5  # written by another schema or codec version
EXIT_READ_ONLY: Final = 6  # the ledger cannot be written
EXIT_FULL: Final = 7  # a write did not fit the ledger's map limit (--max-map-size)
EXIT_INTERRUPTED: Final = 130  # 128 + SIGINT
EXIT_CLOSED_PIPE: Final = 141  # 128 + SIGPIPE: the reader of the output closed it
EXIT_TERMINATED: Final = 143  # 128 + SIGTERM


#: Each failure's exit code, the first class that matches; anything else of the library's is 1.
_EXIT_CODES: Final[tuple[tuple[tuple[type[BaseException], ...], int], ...]] = (
    ((LedgerLockedError, LedgerInUseError), EXIT_IN_USE),
    ((CorruptRecordError, DamagedLedgerError, StoreDamagedError), EXIT_DAMAGED),
    ((SchemaVersionError,), EXIT_VERSION),
    ((LedgerReadOnlyError,), EXIT_READ_ONLY),
    ((MapFullError,), EXIT_FULL),
    (
        (
            BackupDestinationError,
            StreamNotFoundError,
            UnknownRunError,
            RunFinishedError,
            RunNotEndedError,
            GroupChangeError,
            GraphsNotFoundError,
            PostgresOnlyError,
            ConsoleTokenError,
            ConsoleQueryError,
            ListenAddressError,
            NotALedgerError,
            LedgerPathError,
            DemoMismatchError,
            MissingExtraError,
        ),
        EXIT_USAGE,
    ),
)


def _exit_code(exc: BaseException) -> int:
    """The exit code of a failure: distinct per kind (docs/reference.md lists them)."""
    seen: BaseException | None = exc
    while seen is not None:  # a write that did not fit arrives as a CheckpointError caused by MapFullError
        for kinds, code in _EXIT_CODES:
            if isinstance(seen, kinds):
                return code
        seen = seen.__cause__
    return EXIT_FAILURE


def _add_group_target(parser: argparse.ArgumentParser) -> None:
    """PATH STREAM GROUP: the ledger, the stream and the consumer group of a keyed-state command."""
    parser.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    parser.add_argument("stream", metavar="STREAM", help="the stream: scope/node/key")
    parser.add_argument("group", metavar="GROUP", help="the consumer group")


def _add_key_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=positive_int, default=1000, metavar="N", help="at most N keys (default 1000)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ledger",
        description=(
            "streamledger's ledger, in a directory (LMDB) or on a PostgreSQL server: run the demo, "
            "inspect, read messages, check, back up and repair it"
        ),
    )
    parser.add_argument("--version", action="version", version=f"streamledger {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run (or resume) the orders → billing → invoices → audit demo",
        description=(
            "Append N orders, bill each with a running total and send one invoice per order, "
            "audit every invoice. Kill it at any moment and run it again to resume."
        ),
    )
    demo.add_argument(
        "path", metavar="PATH", help="ledger directory (created if missing), or a postgresql:// URL"
    )
    demo.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="K",
        help="on a PostgreSQL URL: worker processes sharing the demo's shards (default 1)",
    )
    demo.add_argument(
        "--messages", "-n", type=positive_int, default=100_000, metavar="N", help="orders (default 100000)"
    )
    demo.add_argument(
        "--progress-interval",
        type=positive_float,
        default=0.25,
        metavar="SECONDS",
        help="seconds between progress reports on stderr (default 0.25)",
    )
    demo.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="event loop (default asyncio)"
    )
    demo.add_argument(
        "--run-id",
        default="demo",
        metavar="ID",
        help=(
            "the demo's run id (default demo): another id runs a demo beside the first (on a URL, "
            "its shards are ID-shard-000, ...)"
        ),
    )
    demo.add_argument(
        "--fresh",
        action="store_true",
        help=(
            "delete the demo's run (of --run-id) with its records and streams, and start a new one; "
            "a ledger holding more than the demo is refused, as always"
        ),
    )
    demo.add_argument(
        "--json",
        action="store_true",
        help=(
            'print the figures as one JSON object: {"orders": ..., "billing_total": ..., "invoices": ..., '
            '"audit_count": ..., "handled": ..., "elapsed": ..., "already_finished": ..., "resumed": ...} '
            "(progress stays on stderr)"
        ),
    )
    demo.add_argument(
        "--max-map-size",
        type=size,
        default=1 << 40,
        metavar="BYTES",
        help=(
            "the most the ledger's map may grow to, in bytes or with a K, M, G or T suffix "
            "(powers of 1024; default 1T); a write that does not fit stops the demo, and the same "
            "command with a larger limit resumes it"
        ),
    )

    inspect = commands.add_parser(
        "inspect",
        help="show every stream, consumer group and graph run of a ledger",
        description=(
            "Show every stream of a ledger with its groups, and every durable graph run with its "
            "attempts, checkpoints and the step it would resume at; changes nothing."
        ),
    )
    inspect.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.add_argument(
        "--stream", metavar="PATTERN", help="only streams whose scope/node/key matches (shell-style: *, ?)"
    )
    inspect.add_argument("--group", metavar="PATTERN", help="only consumer groups whose name matches")
    inspect.add_argument(
        "--groups",
        action="store_true",
        help=(
            "one row per consumer group: acked through, appended, lag, exhausted, dead-lettered, "
            "stopped, last activity"
        ),
    )
    inspect.add_argument(
        "--watch",
        type=positive_float,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help=(
            "show it again every SECONDS (default 2) until Ctrl-C; with --groups, from the second "
            "view on, the messages per second each stream appended and each group handled"
        ),
    )
    inspect.add_argument(
        "--count", type=positive_int, metavar="N", help="with --watch: stop after showing it N times"
    )

    add_messages_command(commands)

    keys = commands.add_parser(
        "keys",
        help="print a consumer group's keyed state as JSON lines",
        description=(
            "Print the confirmed keyed state of GROUP on STREAM (scope/node/key), one JSON object per "
            "line, in key order: the key and its value as their MessagePack reads. A KEY of --from "
            'and --to is JSON when it reads as JSON (42, "42"), else a string. Reads beside a '
            "running owner; changes nothing."
        ),
    )
    _add_group_target(keys)
    keys.add_argument("--from", dest="start", metavar="KEY", help="the first key (included)")
    keys.add_argument("--to", dest="stop", metavar="KEY", help="the key to stop before (excluded)")
    _add_key_limit(keys)
    state = commands.add_parser(
        "state",
        help="print a consumer group's keyed state: one key's value, the keys under a prefix, or all",
        description=(
            "Print the confirmed keyed state of GROUP on STREAM (scope/node/key): the value of KEY, "
            "the string keys that start with --prefix, or every key (at most --limit), in key order. "
            'KEY is JSON when it reads as JSON (42, "42"), else a string. Reads what the ledger '
            "confirmed, beside a running owner, and changes nothing."
        ),
    )
    _add_group_target(state)
    state.add_argument("key", nargs="?", metavar="KEY", help="the one key to read")
    state.add_argument("--prefix", metavar="P", help="the string keys that start with P")
    _add_key_limit(state)
    state.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per key: {"key": ..., "value": ...} (and "found" for KEY)',
    )
    add_group_command(commands)
    add_runs_command(commands)
    add_worker_command(commands)
    add_migrate_command(commands)
    add_metrics_command(commands)
    add_console_command(commands)
    check = commands.add_parser(
        "check",
        help="verify every record and reference of a ledger",
        description=(
            "Verify every record of a ledger (its checksum, its layout) and every reference between "
            "records; print what was found. Exit 0 if the ledger is sound, 4 if not. Changes nothing."
        ),
    )
    check.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    check.add_argument("--json", action="store_true", help="print one JSON object")

    backup = commands.add_parser(
        "backup",
        help="write a consistent copy of a ledger, even while its owner runs",
        description=(
            "Write a consistent, compacted copy of the ledger at PATH into the new directory DEST, "
            "as of the moment it starts; the owner may keep running. A PostgreSQL ledger is dumped "
            "by pg_dump (directory format, one snapshot; restore it with pg_restore)."
        ),
    )
    backup.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    backup.add_argument("destination", metavar="DEST", help="a directory that does not exist yet")
    backup.add_argument(
        "--json",
        action="store_true",
        help=(
            'print one JSON object: {"ledger": ..., "destination": ..., "records": N, "sound": ..., '
            '"problems": [...], "note": ...}'
        ),
    )

    inspect.add_argument(
        "--values",
        action="store_true",
        help="also show the state and inputs each graph run's checkpoint holds (they may be private)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    SIGTERM stops a command as Ctrl-C does, with its own message and exit code (143).
    """
    try:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            return _main(argv)
        with stops_as_interrupts():
            return _main(argv)
    except BrokenPipeError:  # the reader went away (``view ... | head``): stop quietly, as other tools do
        _drop_stdout()
        return EXIT_CLOSED_PIPE


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a closed pipe goes nowhere, with no error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (a test's capture): nothing is left to flush
        pass


def _main(argv: Sequence[str] | None) -> int:
    after = _RESUMES  # what a command stopped by Ctrl-C or SIGTERM says
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        after = _after_stop(args)
        if args.command == "inspect" and args.count is not None and args.watch is None:
            parser.error("--count counts the views of --watch: add --watch")
        if args.command == "state" and args.key is not None and args.prefix is not None:
            parser.error("state reads one KEY or the keys under --prefix, not both")
        if args.command == "messages" and args.key_field is not None and args.key is None:
            parser.error("--key-field says which field holds the key of --key: add --key")
        colours = colours_for(sys.stdout, json=getattr(args, "json", False))
        if args.command == "demo":
            return _demo(args)
        if args.command == "check":
            return _check(args, colours)
        if args.command == "backup":
            return _backup(args, colours)
        if args.command == "messages":
            return run_messages_command(args)
        if args.command == "keys":
            return _keys(args)
        if args.command == "state":
            return _state(args)
        if args.command == "worker":
            return run_worker_command(args)
        if args.command == "migrate":
            return run_migrate_command(args)
        if args.command == "metrics":
            return run_metrics_command(args)
        if args.command == "console":
            return run_console_command(args)
        if args.command == "group":
            print(run_group_command(args))
            return EXIT_OK
        if args.command == "runs":
            problem = act_problem(args, sys.stdin) if args.action in APPLIES else None
            if problem is not None:  # one line, before anything is read or written
                print(f"error: {problem}", file=sys.stderr)
                return EXIT_USAGE
            shown, failed = run_runs_command(args, colours)
            print(shown, end="")
            return EXIT_FAILURE if failed else EXIT_OK
        return _inspect(args, colours)
    except (LedgerError, StreamsError) as exc:
        _error(exc)
        return _exit_code(exc)
    except KeyboardInterrupt as stop:
        return _interrupted(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT, after)
    except BaseExceptionGroup as errors:
        # a second Ctrl-C while the demo shuts down can arrive inside a task group
        interrupts, others = errors.split(KeyboardInterrupt)
        if interrupts is None or others is not None:
            raise
        terminated = interrupts.subgroup(Terminated) is not None
        return _interrupted(signal.SIGTERM if terminated else signal.SIGINT, after)


def _error(exc: BaseException) -> None:
    """One line: what failed, and the ledger's own cause when it says more (the disk is full)."""
    root: BaseException = exc
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, LedgerError):
            root = cause
        cause = cause.__cause__
    text = str(exc)
    if root is not exc and str(root) and str(root) not in text:
        text = f"{text} (because: {str(root).splitlines()[0]})"
    print(f"error: {' '.join(text.splitlines())}", file=sys.stderr)


#: What a command that stopped at a confirmed point says after Ctrl-C or SIGTERM.
_RESUMES: Final = "run the same command again to resume"


def _after_stop(args: argparse.Namespace) -> str:
    """What the command ``args`` asks for says once Ctrl-C or SIGTERM stopped it.

    A command that writes stopped at a confirmed point and resumes; ``runs
    follow`` only read, and the run it followed goes on without it.
    """
    if args.command == "runs" and args.action == "follow":
        return f"stopped following run {args.run_id!r}; the run goes on"
    return _RESUMES


def _interrupted(signum: int, after: str = _RESUMES) -> int:
    """Say why the command stopped, and ``after`` it what that means; its exit code."""
    if signum == signal.SIGTERM:
        print(f"terminated; {after}", file=sys.stderr)
        return EXIT_TERMINATED
    print(f"interrupted; {after}", file=sys.stderr)
    return EXIT_INTERRUPTED


# -- demo -----------------------------------------------------------------------------------


class _ProgressLine:
    """Writes progress to a stream: a rewritten bar with rate and ETA on a terminal, plain lines otherwise.

    The bar follows the last stage (audited orders), which ends the demo;
    the ETA divides what is left by this run's billing rate.
    """

    WIDTH: Final = 24

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._open = False

    def __call__(self, p: DemoProgress) -> None:
        text = (
            f"orders {p.orders:,}/{p.messages:,}  billed {p.billed:,}  invoices {p.invoices:,}  "
            f"audited {p.audited:,}  {p.rate:,.0f} msgs/s"
        )
        if self._tty:
            done = p.audited / p.messages if p.messages else 1.0
            filled = int(done * self.WIDTH)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            left = p.messages - p.audited
            eta = "--:--" if p.rate <= 0 else as_clock(left / p.rate)
            self._out.write(f"\r[{bar}] {done:4.0%}  {text}  ETA {eta}\x1b[K")
            self._open = True
        else:
            self._out.write(f"progress: {text}\n")
        self._out.flush()

    def end(self) -> None:
        if self._open:
            self._out.write("\n")
            self._out.flush()
            self._open = False


def _demo(args: argparse.Namespace) -> int:
    tools = tools_for(args.path)
    line = _ProgressLine(sys.stderr)
    outcome: list[DemoSummary] = []
    failure: list[Exception] = []
    stopped_by: list[int] = []  # the signal that cancelled the demo

    async def run() -> None:
        with anyio.CancelScope() as cancel:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_signal, cancel, stopped_by)
                try:
                    demo = tools.demo(
                        args.path,
                        args.messages,
                        args.workers,
                        line,
                        args.progress_interval,
                        args.max_map_size,
                        run_id=args.run_id,
                        fresh=args.fresh,
                    )
                    outcome.append(await demo)
                except Exception as exc:  # raised again outside the event loop, unwrapped
                    failure.append(exc)
                finally:
                    tg.cancel_scope.cancel()

    try:
        anyio.run(run, backend=args.backend)
    finally:
        line.end()
    if failure:
        raise failure[0]
    if not outcome:
        return _interrupted(stopped_by[0] if stopped_by else signal.SIGINT)
    summary = outcome[0]
    if args.json:
        print(json.dumps(msgspec.to_builtins(summary)))
        return EXIT_OK
    if summary.already_finished:
        where = tools.describe(args.path)  # never a password
        print(f"the demo in {where} already finished; nothing changed: {_figures(summary)}")
        return EXIT_OK
    resumed = f" (resumed; {summary.handled:,} billed by this run)" if summary.resumed else ""
    print(f"demo finished: {_figures(summary)}; {summary.elapsed:.2f} s, {summary.rate:,.0f} msgs/s{resumed}")
    return EXIT_OK


def _figures(s: DemoSummary) -> str:
    return (
        f"{s.orders} orders, billing total {s.billing_total}, "
        f"{s.invoices} invoices, audit count {s.audit_count}"
    )


async def _cancel_on_signal(scope: anyio.CancelScope, received: list[int]) -> None:
    """Ctrl-C or SIGTERM: cancel the demo, which stops at a confirmed point and can be resumed."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            received.append(signum)
            scope.cancel()
            return


# -- check and backup -----------------------------------------------------------------------


def _check(args: argparse.Namespace, colours: Colours) -> int:
    with progress_on(sys.stderr, quiet=args.json) as progress:
        report = tools_for(args.path).check(args.path, progress=progress)  # beside a running owner
    if args.json:
        print(json.dumps(msgspec.to_builtins(report) | {"sound": report.sound}))
    else:
        total = sum(report.records.values())
        if report.sound:
            print(f"ledger {report.path}: {total} records checked, {colours.status('sound')}")
        else:
            problems = colours.status(f"{len(report.problems)} problems", "failed")
            print(f"ledger {report.path}: {total} records checked, {problems}")
            for problem in report.problems:
                print(f"  {problem}")
    return EXIT_OK if report.sound else EXIT_DAMAGED


def _backup(args: argparse.Namespace, colours: Colours) -> int:
    destination = Path(args.destination)
    if destination.exists():
        raise BackupDestinationError(f"{destination} exists; name a directory that does not exist yet")
    tools = tools_for(args.path)
    with progress_on(sys.stderr, quiet=args.json) as progress:
        report = tools.backup(args.path, destination, progress=progress)
    if args.json:
        copied = {
            "ledger": tools.describe(args.path),
            "destination": str(destination),
            "records": sum(report.records.values()),
            "sound": report.sound,
            "problems": list(report.problems),
            "note": tools.backup_note or None,
        }
        print(json.dumps(copied))
    if not report.sound:  # the source was damaged: say so, keep the copy for a closer look
        print(f"error: the copy in {destination} is not sound: {report.problems[0]}", file=sys.stderr)
        return EXIT_DAMAGED
    if args.json:
        return EXIT_OK
    note = f" ({tools.backup_note})" if tools.backup_note else ""
    print(
        f"ledger {tools.describe(args.path)} copied to {destination}: "
        f"{sum(report.records.values())} records, {colours.status('sound')}{note}"
    )
    return EXIT_OK


# -- inspect --------------------------------------------------------------------------------


def _inspect(args: argparse.Namespace, colours: Colours) -> int:
    if args.watch is None:
        print(_inspection(args, colours, None), end="")
        return EXIT_OK
    earlier: _Sample | None = None  # the view before: rates are counted from it
    shown = 0
    try:
        while True:
            sample = _Sample(time.monotonic(), _report(args))
            text = _inspection(args, colours, (sample, earlier))
            if sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: the view is redrawn in place
            print(f"every {args.watch:g} s, Ctrl-C to stop: {time.strftime('%H:%M:%S')}")
            print(text, end="", flush=True)
            shown += 1
            if shown == args.count:
                return EXIT_OK
            earlier = sample
            time.sleep(args.watch)
    except KeyboardInterrupt:  # the way to stop watching: not an error
        return EXIT_OK


class _Sample(msgspec.Struct, frozen=True):
    """One view of a watch: when it was read (the monotonic clock) and what it found."""

    at: float
    report: dict[str, Any]


def _report(args: argparse.Namespace) -> dict[str, Any]:
    # read-only: no owner lock, so a ledger can be inspected while its owner runs
    found = tools_for(args.path).inspect(args.path, args.values)
    return filtered(found, stream=args.stream, group=args.group)


def _inspection(
    args: argparse.Namespace, colours: Colours, watched: tuple[_Sample, _Sample | None] | None
) -> str:
    """What ``inspect`` shows; ``watched``, a watch's sample and the one before it, adds the rates."""
    report = _report(args) if watched is None else watched[0].report
    if not args.groups:
        return json.dumps(report) + "\n" if args.json else _table(report, colours)
    rows = group_rows(report)
    if watched is not None:
        sample, earlier = watched
        before = None if earlier is None else group_rows(earlier.report)
        rows = with_rates(rows, before, sample.at - earlier.at if earlier is not None else 0.0)
    return json.dumps(rows) + "\n" if args.json else _groups_table(rows, colours)


#: The columns of ``inspect --groups`` coloured when their row's field is not 0 or false: its status word.
_GROUP_WARNINGS: Final = {
    "LAG": ("lag", "lagging"),  # behind what its stream appended
    "EXHAUSTED": ("exhausted", "exhausted"),  # a message out of budget holds it back
    "STOPPED": ("stopped", "stopped"),  # its handler stopped it
}


def _groups_table(rows: list[dict[str, Any]], colours: Colours) -> str:
    """One line per group; a watch's rows (:func:`with_rates`) add the rates after the lag."""
    rated = bool(rows) and "handled_per_s" in rows[0]
    now = datetime.datetime.now(datetime.UTC)
    header = (
        "GROUP",
        "STREAM",
        "ACKED",
        "APPENDED",
        "LAG",
        "AGE",
        *(("APPENDED/S", "HANDLED/S") if rated else ()),
        "EXHAUSTED",
        "DEAD",
        "STOPPED",
        "LAST-ACTIVITY",
        "PARTITION",
        "OWNER",
    )
    cells = [header] + [
        (
            r["group"],
            r["stream"],
            str(r["acked_through"]),
            str(r["appended"]),
            str(r["lag"]),
            _age(r["oldest_unacked_at"], now),
            *((_per_second(r["appended_per_s"]), _per_second(r["handled_per_s"])) if rated else ()),
            str(r["exhausted"]),
            str(r["dead_lettered"]),
            "yes" if r["stopped"] else "no",
            r["last_activity"] or "-",
            r["partition"] or "-",
            _owner(r["owner"]),
        )
        for r in rows
    ]

    def paint(row: int, column: int, cell: str) -> str:
        warning = _GROUP_WARNINGS.get(header[column])
        if row == 0 or warning is None or not rows[row - 1][warning[0]]:
            return cell
        return colours.status(cell, warning[1])

    lines = aligned(cells, left=2, ragged_last=True, paint=paint)
    return "\n".join([colours.header(lines[0]), *lines[1:]]) + "\n"


def _per_second(rate: float | None) -> str:
    """A rate as the watch shows it: ``-`` until there is one to show."""
    if rate is None:
        return "-"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}"


def _age(at: str | None, now: datetime.datetime) -> str:
    """How long before ``now`` the group's oldest unacknowledged message was appended; ``-`` if none waits."""
    if at is None:
        return "-"
    whole = max(0, int((now - datetime.datetime.fromisoformat(at.replace("Z", "+00:00"))).total_seconds()))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _owner(owner: dict[str, Any] | None) -> str:
    """A partition's holder as the table shows it: its member and its lease's end (or that it ran out)."""
    if owner is None:
        return "-"
    ends = "lease expired" if owner["expired"] else f"until {owner['lease_expires']}"
    return f"{owner['member']} ({ends})"


def _keys(args: argparse.Namespace) -> int:
    ref = parse_ref(args.stream)
    start = b"" if args.start is None else key_bytes(args.start)
    stop = None if args.stop is None else key_bytes(args.stop)
    shown = tools_for(args.path).keys(args.path, ref, args.group, start, stop, args.limit)
    for entry in shown["keys"]:
        print(json.dumps(entry))
    return EXIT_OK


def _state(args: argparse.Namespace) -> int:
    """``state``: one key (``found`` says whether it is held), or the keys under a prefix, or all."""
    ref = parse_ref(args.stream)
    start, stop = key_range(args.key, args.prefix)
    limit = 1 if args.key is not None else args.limit
    entries = tools_for(args.path).keys(args.path, ref, args.group, start, stop, limit)["keys"]
    if args.key is not None:
        value = entries[0]["value"] if entries else None
        entry = {"key": shown_key(start), "value": value, "found": bool(entries)}
        print(json.dumps(entry) if args.json else _state_line(entry))
        return EXIT_OK
    for entry in entries:
        print(json.dumps(entry) if args.json else _state_line(entry))
    return EXIT_OK


def _state_line(entry: dict[str, Any]) -> str:
    """``KEY: VALUE``, each as JSON; a key the group does not hold says so."""
    if entry.get("found") is False:
        return f"{json.dumps(entry['key'])}: no value"
    return f"{json.dumps(entry['key'])}: {json.dumps(entry['value'])}"


def _table(report: dict[str, Any], colours: Colours) -> str:
    lines = [f"ledger {report['path']}"]
    owner = report.get("owner")
    if owner is not None:
        gone = {False: ", no longer running", None: ""}.get(owner["running"], "")
        lines.append(f"owned by process {owner['pid']} on {owner['host']} since {owner['since']}{gone}")
    streams = report["streams"]
    if not streams:
        lines.append("no streams")
    for s in streams:
        status = "failed" if s["failed"] else "finished" if s["finished"] else "active"
        lines.append("")
        lines.append(
            f"stream {s['scope']}/{s['node']}/{s['key']}  generation {s['generation']}  "
            f"appended {s['appended']}  {colours.status(status)}"
        )
        rows = [("group", "acked_through", "pending", "exhausted", "state")]
        for g in s["groups"]:
            rows.append(
                (
                    str(g["group"]),
                    str(g["acked_through"]),
                    str(g["pending"]),
                    str(g["exhausted"]),
                    json.dumps(g["state"]),
                )
            )

        def paint(row: int, column: int, cell: str, groups: list[dict[str, Any]] = s["groups"]) -> str:
            exhausted = row > 0 and column == 3 and groups[row - 1]["exhausted"]
            return colours.status(cell, "exhausted") if exhausted else cell

        table = aligned(rows, left=1, ragged_last=True, paint=paint)
        lines.extend("  " + line for line in [colours.header(table[0]), *table[1:]])
    lines.extend(_node_runs_table(report["runs"], colours))
    lines.extend(_runs_table(report["graph_runs"], colours))
    return "\n".join(lines) + "\n"


def _node_runs_table(runs: list[dict[str, Any]], colours: Colours) -> list[str]:
    """Runs of ledger.run: one line each, then each node's boundary, budget and conclusion."""
    if not runs:
        return []
    lines = ["", colours.header("runs")]
    for run in runs:
        status = colours.status(run["status"])
        if run["error"]:  # its status said once: "failed with E", or "cancelled, failed with E"
            failed = run["status"] == "failed"
            status += f" with {run['error']}" if failed else f", failed with {run['error']}"
        lines.append(
            f"  {run['run_id']}: graph {run['graph']} version {run['version']}, "
            f"{status}, started {run['starts']} time(s)"
        )
        for node in run["nodes"]:
            budget = f"{node['failures']} of {node['limit']} attempt(s) failed"
            if node["boundary"] == "node":
                outputs = f"  {json.dumps(node['outputs'])}" if "outputs" in node else ""
                lines.append(f"    {node['path']}: {colours.status(node['status'])}, {budget}{outputs}")
            else:
                exhausted = f", {colours.status('exhausted')}" if node["status"] == "failed" else ""
                lines.append(f"    {node['path']}, {node['boundary']}: {budget}{exhausted}")
    return lines


def _runs_table(runs: list[dict[str, Any]], colours: Colours) -> list[str]:
    if not runs:
        return ["no graph runs"]
    lines = ["", colours.header("graph runs")]
    rows = [("run", "graph", "status", "attempts", "checkpoints", "resumes at", "notes")]
    for run in runs:
        notes = []
        if run["error"]:
            notes.append(f"failed with {run['error']}")
        if run["discarded"]:
            notes.append(f"a checkpoint was discarded: {run['discarded']}")
        if run["checkpoint_format"]:
            notes.append("its checkpoint is of an unknown format")
        resumes = "-" if run["status"] == "finished" else run["resumes_at"] or "the start"
        rows.append(
            (
                run["run_id"],
                run["graph"] or "-",
                run["status"],
                str(run["attempts"]),
                str(run["checkpoints"]),
                resumes,
                "; ".join(notes),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for r, row in enumerate(rows):
        cells = [
            " " * (w - len(cell)) + cell if i in (3, 4) else _padded(colours, r, i, cell, w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        line = "  " + "  ".join(cells).rstrip()
        lines.append(colours.header(line) if r == 0 else line)
    for run in runs:
        if "values" in run:
            lines.append(f"  {run['run_id']}: {json.dumps(run['values'])}")
    return lines


def _padded(colours: Colours, row: int, column: int, cell: str, width: int) -> str:
    """A left-aligned cell of the graph runs table; its status (column 2) in its colour."""
    shown = colours.status(cell) if row > 0 and column == 2 else cell
    return shown + " " * (width - len(cell))
