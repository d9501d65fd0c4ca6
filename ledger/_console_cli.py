"""``python -m ledger console PATH|URL``: the read-only web console (:mod:`ledger.console`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ._arguments import age, port, positive_float
from ._errors import ConsoleTokenError
from ._listen import listening

__all__ = ["add_console_command", "run_console_command"]


def add_console_command(commands: Any) -> None:
    console = commands.add_parser(
        "console",
        help="serve a read-only web console of a ledger: streams, lag, runs and their nodes, live",
        description=(
            "Serve a read-only web console at http://HOST:PORT: streams and consumer groups with lag, "
            "rates and the age of the oldest unacknowledged message, plotted while it watches; runs by "
            "status; a run's graph, node timeline and failures. It reads the ledger as inspect does, "
            "every --interval seconds, beside the running programs. A group is lagging when its oldest "
            "unacknowledged message is older than --lag-age, or its lag rose at each of the last five "
            "reads; each group's health comes with its reason. On a loopback address it needs no "
            "token; on any other, --token (or STREAMLEDGER_CONSOLE_TOKEN) must be given, and every "
            "request must carry it. Ctrl-C stops it (exit 0)."
        ),
    )
    console.add_argument("path", metavar="PATH", help="ledger directory, or a postgresql:// URL")
    console.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    console.add_argument(
        "--port", type=port, default=8400, help="the port to listen on (default 8400; 0 picks a free one)"
    )
    console.add_argument(
        "--token", help="the token every request must carry (default: STREAMLEDGER_CONSOLE_TOKEN)"
    )
    console.add_argument(
        "--interval",
        type=positive_float,
        default=2.0,
        metavar="S",
        help="seconds between two reads of the ledger (default 2)",
    )
    console.add_argument(
        "--lag-age",
        type=age,
        default="30s",
        metavar="AGE",
        help=(
            "a group whose oldest unacknowledged message is older than this is lagging: 90s, 15m, 2h "
            "(default 30s)"
        ),
    )


def run_console_command(args: argparse.Namespace) -> int:
    from .console import ConsoleServer, Watcher

    token = args.token or os.environ.get("STREAMLEDGER_CONSOLE_TOKEN") or None
    watcher = Watcher(args.path, interval=args.interval, lag_age=args.lag_age)
    watcher.read()  # the ledger's own error and exit code if it is none
    if watcher.overview()["error"] is not None:
        from ._connect import tools_for

        tools_for(args.path).inspect(args.path, False)  # raised again, as the command's error
    try:
        server = listening(args.host, args.port, lambda: ConsoleServer(watcher, args.host, args.port, token))
    except ValueError as exc:
        raise ConsoleTokenError(str(exc)) from None
    watcher.start()
    # the token is the operator's own: it is never printed (output is often logged)
    asks = "; open it with ?token=TOKEN, the token given" if token else ""
    print(f"serving the console of {watcher.where} at {server.url} (Ctrl-C to stop{asks})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the way to stop serving: not an error
        return 0
    finally:
        watcher.stop()
        server.httpd.server_close()
    return 0
