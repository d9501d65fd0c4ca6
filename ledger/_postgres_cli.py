"""The PostgreSQL ledger's own commands: ``worker URL --graphs MODULE:NAME`` and ``migrate URL``."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
from collections.abc import Mapping
from functools import partial
from typing import Any

import anyio

from streams import Graph

from ._arguments import positive_float
from ._connect import is_url
from ._errors import GraphsNotFoundError, PostgresOnlyError

__all__ = [
    "add_migrate_command",
    "add_worker_command",
    "run_migrate_command",
    "run_worker_command",
]


def add_worker_command(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="claim and run the due runs of a PostgreSQL ledger, under leases",
        description=(
            "Run as one worker of the PostgreSQL ledger at URL: claim a run that is due (submitted, or "
            "left by a worker that died or stopped renewing its lease), resume it from the ledger with "
            "the graph of its name, renew the lease while it runs. Start as many as you like, on any "
            "machines. Prints one line per claimed run and per ended run. A server that goes away is "
            "waited for (--reconnect); past that the worker stops with one line on stderr, exit code 1."
        ),
    )
    worker.add_argument("url", metavar="URL", help="the ledger: a postgresql:// URL")
    worker.add_argument(
        "--graphs",
        required=True,
        metavar="MODULE:NAME",
        help="a mapping of graph names to Graphs, a list of Graphs or one Graph, importable from here",
    )
    worker.add_argument("--owner", help="this worker's name in its leases (default host:pid)")
    worker.add_argument(
        "--lease", type=positive_float, default=10.0, metavar="SECONDS", help="lease length (default 10)"
    )
    worker.add_argument(
        "--poll", type=positive_float, default=0.5, metavar="SECONDS", help="idle poll (default 0.5)"
    )
    worker.add_argument(
        "--reconnect",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for a server that went away before giving up with an error (default 30)",
    )
    worker.add_argument("--until-idle", action="store_true", help="exit once no run of the ledger is running")
    worker.add_argument(
        "--json",
        action="store_true",
        help=(
            'one JSON object a line: {"run": ID, "outcome": ..., "at": UTC time} per claimed and per '
            'ended run, then {"ended": N}'
        ),
    )


def _graphs(spec: str) -> Mapping[str, Graph]:
    module_name, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise GraphsNotFoundError(f"--graphs {spec!r}: {exc}") from None
    if isinstance(found, Graph):
        found = [found]
    graphs = {g.name: g for g in found} if isinstance(found, list | tuple) else found
    if not isinstance(graphs, Mapping) or not all(isinstance(g, Graph) for g in graphs.values()):
        raise GraphsNotFoundError(f"--graphs {spec!r} is not a mapping of graph names to Graphs, nor Graphs")
    return graphs


def _url(args: argparse.Namespace, why: str) -> str:
    if not is_url(args.url):
        raise PostgresOnlyError(f"{args.command} takes a postgresql:// URL, not the path {args.url!r}: {why}")
    return str(args.url)


def run_worker_command(args: argparse.Namespace) -> int:
    _url(args, "the runs of an LMDB ledger are resumed by the one process that owns it")
    from .postgres import work

    graphs = _graphs(args.graphs)
    working = partial(work, report=_json_report) if args.json else work  # else a line per report
    ended = anyio.run(
        lambda: working(
            args.url,
            graphs,
            owner=args.owner,
            lease_seconds=args.lease,
            poll_seconds=args.poll,
            until_idle=args.until_idle,
            reconnect_seconds=args.reconnect,
        )
    )
    print(json.dumps({"ended": ended}) if args.json else f"worker ended {ended} run(s)", flush=True)
    return 0


def _json_report(run_id: str, outcome: str) -> None:
    """A worker's report as a JSON line: the run, its outcome, and when (UTC)."""
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    print(json.dumps({"run": run_id, "outcome": outcome, "at": at}), flush=True)


def add_migrate_command(commands: Any) -> None:
    migrate = commands.add_parser(
        "migrate",
        help="make a PostgreSQL ledger's tables, or bring an older schema to this release's",
        description=(
            "Make the ledger's tables in an empty PostgreSQL database, or migrate a ledger of an older "
            "schema to this release's, in one transaction. Opening a ledger never migrates it: stop its "
            "workers and back the database up first."
        ),
    )
    migrate.add_argument("url", metavar="URL", help="the ledger: a postgresql:// URL")
    migrate.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"ledger": ..., "from": SCHEMA (0: none), "to": SCHEMA, "changed": ...}',
    )


def run_migrate_command(args: argparse.Namespace) -> int:
    _url(args, "an LMDB ledger is made when it is first opened")
    from .postgres import describe_url, migrate_url

    where = describe_url(args.url)
    before, after = migrate_url(args.url)
    if args.json:
        print(json.dumps({"ledger": where, "from": before, "to": after, "changed": before != after}))
    elif before == 0:
        print(f"made a ledger of schema {after} in {where}")
    elif before == after:
        print(f"{where} is at schema {after}: nothing to do")
    else:
        print(f"migrated {where} from schema {before} to {after}")
    return 0
