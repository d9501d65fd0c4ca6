"""A worker, or a program, on a PostgreSQL ledger that pauses once at a named point: for the fault tests.

::

    python -m tests.ledger.pg_fault_child DIR POINT worker URL [worker options...]
    python -m tests.ledger.pg_fault_child DIR POINT program URL N
    python -m tests.ledger.pg_fault_child DIR POINT member URL NAME LEASE_SECONDS

``worker`` is ``python -m ledger worker URL --graphs tests.ledger.pool_graphs:GRAPHS ...``;
``program`` opens the ledger with ``ledger.connect(URL)``, runs the summing
graph over ``N`` itself as run ``program`` and prints ``answer A``;
``member`` is ``python examples/customer_members.py member URL NAME LEASE_SECONDS``.

POINT is where it pauses, the first time it gets there:

- ``schema``: the ledger's tables were made in the open transaction, not committed;
- ``write``: a call's transaction read its records and is about to send its write of messages;
- ``transaction``: a fenced transaction holds the run's lease row (its third);
  here the process stops itself with SIGSTOP, a frozen worker;
- ``run-commit``: a worker's fenced transaction ran every statement and is
  about to send its COMMIT (its third such transaction); it stops itself
  there, as a frozen worker past its pipelines;
- ``partition``: a member's fenced transaction holds its partition's lease
  row (its third such transaction), with the statements of its commit still
  to send; the process stops itself with SIGSTOP, a frozen member;
- ``commit``: a member's fenced transaction ran every statement and is about
  to send its COMMIT (its third such transaction); it stops itself there;
- ``none``: nowhere.

With ``partition`` and ``commit`` the file ``DIR/paused`` holds the
partition whose lease the stopped transaction checked.

It pauses by writing ``DIR/paused`` and waiting for ``DIR/go`` (the test
stops and restarts the server meanwhile); with ``transaction`` the test
sends SIGCONT instead. The fault is injected here, in the child, by
wrapping the functions named: nothing in the library knows of it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg

#: How long a paused child waits for the test before it gives up (a test that died).
PATIENCE = 120.0


def command(directory: Path, point: str, mode: str, url: str, *rest: str) -> list[str]:
    """The command line of a child pausing at ``point`` (run it from the repository's root)."""
    return [sys.executable, "-m", "tests.ledger.pg_fault_child", str(directory), point, mode, url, *rest]


def _pause(directory: Path) -> None:
    (directory / "paused").write_text(str(os.getpid()))
    deadline = time.monotonic() + PATIENCE
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the test never said go")
        time.sleep(0.01)


def _install(directory: Path, point: str) -> None:
    done: list[bool] = []

    def once() -> bool:
        if done:
            return False
        done.append(True)
        return True

    if point == "schema":
        from ledger.postgres import _schema

        create = _schema._create

        def create_then_pause(conn: Any) -> None:
            create(conn)
            if once():
                _pause(directory)

        _schema._create = create_then_pause
    elif point == "write":
        execute = psycopg.Cursor.execute

        def pause_then_execute(cur: Any, query: Any, params: Any = None, **options: Any) -> Any:
            idle = cur.connection.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if not idle and "INSERT INTO streamledger_messages" in str(query) and once():
                _pause(directory)
            return execute(cur, query, params, **options)

        psycopg.Cursor.execute = pause_then_execute  # type: ignore[method-assign, assignment]
    elif point == "transaction":
        from ledger.postgres import _leases

        check = _leases.Lease.check
        checks: list[int] = []

        def check_then_stop(lease: Any, conn: Any) -> None:
            check(lease, conn)  # holds the lease row FOR SHARE until the transaction ends
            checks.append(1)
            if len(checks) == 3 and once():
                (directory / "paused").write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)

        _leases.Lease.check = check_then_stop  # type: ignore[method-assign, assignment]
    elif point == "run-commit":
        _stop_before_commit(directory, "ledger.postgres._leases", "Lease", once)
    elif point in ("partition", "commit"):
        _stop_member_at(directory, point, once)
    elif point != "none":
        raise SystemExit(f"no pause point {point!r}")


def _stop_here(directory: Path, what: object) -> None:
    """Stop the process at this thread's point: sent to the process, another thread may take the signal
    and this one runs on until its next system call (into the statements after this point)."""
    (directory / "paused").write_text(str(what))
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def _stop_before_commit(directory: Path, module: str, lease_class: str, once: Any) -> None:
    """Stop at the COMMIT of the first fenced transaction after the second: every statement sent."""
    import importlib

    cls = getattr(importlib.import_module(module), lease_class)
    check = cls.check
    checks: list[int] = []
    fenced: dict[int, object] = {}  # a connection whose open transaction checked a lease: what it holds

    def check_then_mark(lease: Any, conn: Any) -> None:
        check(lease, conn)  # holds the lease row FOR SHARE until the transaction ends
        checks.append(1)
        if len(checks) >= 3:
            fenced[id(conn)] = getattr(lease, "partition", getattr(lease, "run_id", None))

    cls.check = check_then_mark
    leave = psycopg.Transaction.__exit__

    def stop_then_commit(tx: Any, kind: Any, exc: Any, tb: Any) -> bool:
        if not tx.savepoint_name:  # the outermost block: ending without an error, it sends COMMIT
            held = fenced.pop(id(tx.connection), None)
            if kind is None and held is not None and once():
                _stop_here(directory, held)
        return leave(tx, kind, exc, tb)

    psycopg.Transaction.__exit__ = stop_then_commit  # type: ignore[method-assign]


def _stop_member_at(directory: Path, point: str, once: Any) -> None:
    if point == "commit":
        _stop_before_commit(directory, "ledger.postgres._members", "PartitionLease", once)
        return
    from ledger.postgres import _members

    check = _members.PartitionLease.check
    checks: list[int] = []

    def check_then_stop(lease: Any, conn: Any) -> None:
        check(lease, conn)  # holds the lease row FOR SHARE until the transaction ends
        checks.append(1)
        if len(checks) == 3 and once():
            _stop_here(directory, lease.partition)

    _members.PartitionLease.check = check_then_stop  # type: ignore[method-assign, assignment]


async def _member(url: str, name: str, lease_seconds: float) -> int:
    import customer_members  # from examples/, on the path main made

    handled: int = await customer_members.member(url, name, lease_seconds)
    return handled


async def _program(url: str, n: int) -> None:
    import ledger

    from .pool_graphs import ANSWER, N, summing

    async with ledger.connect(url) as opened:
        outcome = await opened.run(summing(), {N: n}, run_id="program")
    print(f"answer {outcome.result[ANSWER]}", flush=True)


def main(argv: list[str]) -> int:
    directory, point, mode, url, *rest = argv
    _install(Path(directory), point)
    if mode == "program":
        anyio.run(_program, url, int(rest[0]))
        return 0
    if mode == "member":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
        print(f"handled {anyio.run(_member, url, rest[0], float(rest[1]))}", flush=True)
        return 0
    from ledger._cli import main as cli

    return cli(["worker", url, "--graphs", "tests.ledger.pool_graphs:GRAPHS", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
