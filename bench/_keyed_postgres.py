"""Per-key totals on the PostgreSQL ledger, run by 1, 2, 4 worker processes on one server.

A PostgreSQL ledger's only parallelism is whole runs claimed by worker
processes (``python -m ledger worker``). So the keyed workload is split the
only way it can be: into ``shards`` runs of graph ``keyed-shard``, run ``k``
owning the customers with ``crc32(customer) % shards == k``. In each run
node ``source`` appends that shard's orders of the N (resumable, ``send_at``
the order's number) and node ``totals`` keeps the shard's per-customer
totals as explicit state, seeded with every customer it owns at 0, as the
LMDB figures do. The number of shards stays the same for every number of
workers, so every configuration does the same work.

Per configuration, on a new database of the server:

* the runs are submitted, then ``workers`` worker processes are started
  with ``--until-idle`` and waited for; wall time from their start to the
  last one's exit;
* CPU: user + system time of the worker processes
  (``getrusage(RUSAGE_CHILDREN)`` around them), and the same for one worker
  started on an empty ledger of the same server (its start-up, one claim
  that finds nothing, and its exit: median of three), so the figure per
  message can leave the fixed cost of each process out;
* rollbacks: ``xact_rollback`` and ``xact_commit`` of the database in
  ``pg_stat_database`` across the workers' run, read once no session is
  left on it (a session's counts reach the view when it ends). The ledger
  runs every call in a serializable transaction and runs it again when
  PostgreSQL aborts it for a conflict with another worker's: each such
  retry is one rollback, and so is any other transaction that ends in
  ``ROLLBACK``;
* for a private server, the server's CPU: user + system time of the
  postmaster and all its processes, read from ``/proc``.

Verified: every run completed, and the union of the shards' totals equals
the totals recomputed from the N orders.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import psycopg

from ledger.postgres import open_postgres
from streams import Graph, Key, MessageTx, NodeContext, Stream

from ._keyed import CustomerOrder, Totals, customer_order, expected_totals, member_of, seeded_totals
from ._shape import BenchError

__all__ = [
    "GRAPHS",
    "PgKeyedRun",
    "database_of",
    "keyed_shard_graph",
    "measured",
    "run_keyed_workers",
    "run_processes",
    "server_cpu",
    "transactions",
    "worker_startup_cpu",
]

MESSAGES: Final = Key("messages", int)
KEYS: Final = Key("keys", int)
SHARD: Final = Key("shard", int)
SHARDS: Final = Key("shards", int)
SHARD_ORDERS: Final = Key("orders", Stream[CustomerOrder])
TOTALS: Final = Key("totals", Totals)
SHARD_PREFIX: Final = "keyed-shard-"
#: How long a worker's lease lasts (as the demo's workers).
LEASE_SECONDS: Final = 5.0
#: How often an idle worker asks for a run.
POLL_SECONDS: Final = 0.1


def keyed_shard_graph(*, window: int = 1024) -> Graph:
    """One shard: the orders of its customers, and their totals as explicit state."""
    shard = Graph("keyed-shard", version="1", inputs=[MESSAGES, KEYS, SHARD, SHARDS])

    @shard.node(requires=[MESSAGES, KEYS, SHARD, SHARDS], provides=[SHARD_ORDERS], resumable=True)
    async def source(ctx: NodeContext) -> None:
        writer = ctx.writer(SHARD_ORDERS)
        keys, mine, shards = ctx[KEYS], ctx[SHARD], ctx[SHARDS]
        for i in range((writer.position or 0) + 1, ctx[MESSAGES] + 1):
            order = customer_order(i, keys)
            if member_of(order.customer, shards) != mine:
                continue
            try:
                writer.send_nowait(order, send_at=i)
            except anyio.WouldBlock:
                await writer.send(order, send_at=i)

    @shard.node(requires=[SHARD_ORDERS, KEYS, SHARD, SHARDS], provides=[TOTALS])
    async def totals(ctx: NodeContext) -> None:
        async def add(tx: MessageTx[Totals], order: CustomerOrder) -> None:
            state = tx.state
            state[order.customer] += order.amount
            tx.set_state(state)

        seeded = seeded_totals(ctx[KEYS], ctx[SHARD], ctx[SHARDS])
        result = await ctx.handle_messages(
            SHARD_ORDERS, add, initial_state=seeded, state_type=Totals, window=window
        )
        ctx.set(TOTALS, result.state)

    return shard


#: What ``python -m ledger worker --graphs bench._keyed_postgres:GRAPHS`` runs.
GRAPHS: Final = {"keyed-shard": keyed_shard_graph()}


@dataclass(frozen=True)
class PgKeyedRun:
    """One verified configuration: ``workers`` processes through every shard."""

    workers: int
    messages: int
    seconds: float
    #: User + system CPU seconds of the worker processes, start-up and exit included.
    worker_cpu: float
    commits: int
    rollbacks: int
    #: User + system CPU seconds of the server's processes (a private server only).
    server_cpu: float | None

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    @property
    def rollbacks_per_1k_txns(self) -> float:
        return 1000 * self.rollbacks / max(self.commits + self.rollbacks, 1)


def _worker_command(url: str) -> list[str]:
    return [
        sys.executable, "-m", "ledger", "worker", url,
        "--graphs", "bench._keyed_postgres:GRAPHS",
        "--lease", str(LEASE_SECONDS), "--poll", str(POLL_SECONDS), "--until-idle",
    ]  # fmt: skip


def _worker_env() -> dict[str, str]:
    """The bench's environment, with the bench package importable by the workers wherever they start."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def _children_cpu() -> float:
    """User + system CPU seconds of this process's children that ended and were waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def _run_workers(url: str, workers: int) -> tuple[float, float]:
    """Start ``workers`` worker processes and wait for them: (wall seconds, their CPU seconds)."""
    return run_processes(_worker_command(url), workers)


def run_processes(command: list[str], count: int) -> tuple[float, float]:
    """Start ``count`` processes of ``command`` and wait for them: (wall seconds, their CPU seconds)."""
    with ExitStack() as files:
        logs = [files.enter_context(tempfile.TemporaryFile()) for _ in range(count)]
        cpu = _children_cpu()
        started = time.perf_counter()
        processes = [
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=_worker_env())
            for log in logs
        ]
        try:
            for process in processes:
                process.wait()
        finally:
            for process in processes:  # interrupted: stop the workers; their leases run out
                if process.poll() is None:
                    process.terminate()
                    process.wait()
        seconds = time.perf_counter() - started
        cpu = _children_cpu() - cpu
        for process, log in zip(processes, logs, strict=True):
            if process.returncode != 0:
                log.seek(0)
                err = log.read().decode(errors="replace").strip()
                last = err.splitlines()[-1] if err else f"exit code {process.returncode}"
                raise BenchError(f"a keyed process failed: {last}")
    return seconds, cpu


def database_of(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def transactions(server_url: str, database: str) -> tuple[int, int]:
    """``(xact_commit, xact_rollback)`` of ``database``, once no session is left on it."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        for _ in range(200):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            time.sleep(0.05)
        else:
            raise BenchError(f"sessions stayed on database {database} after its workers ended")
        row = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    if row is None:
        raise BenchError(f"pg_stat_database has no row for database {database}")
    return int(row[0]), int(row[1])


def server_cpu(data: Path | None) -> float | None:
    """User + system CPU seconds of a server's postmaster, its ended processes and its live ones."""
    if data is None:
        return None
    try:
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        pid, ppid = int(entry.name), int(fields[1])
        if pid == postmaster:  # its own time, and that of every process of it that ended
            total += sum(int(f) for f in fields[11:15]) / tick
        elif ppid == postmaster:
            total += sum(int(f) for f in fields[11:13]) / tick
    return total


async def _prepare(url: str, n: int, keys: int, shards: int) -> None:
    graph = GRAPHS["keyed-shard"]
    async with open_postgres(url) as ledger:
        if await ledger.runs():
            raise BenchError("the keyed bench's database is not fresh")
        for k in range(shards):
            inputs = {MESSAGES: n, KEYS: keys, SHARD: k, SHARDS: shards}
            await ledger.submit(graph, inputs, run_id=f"{SHARD_PREFIX}{k:03}")


async def _verify(url: str, n: int, keys: int, shards: int) -> None:
    graph = GRAPHS["keyed-shard"]
    merged: Totals = {}
    async with open_postgres(url) as ledger:
        runs = [r for r in await ledger.runs() if r.run_id.startswith(SHARD_PREFIX)]
        if len(runs) != shards or any(r.status != "completed" for r in runs):
            raise BenchError(f"the shards ended {sorted((r.run_id, r.status) for r in runs)}")
        for record in runs:
            totals = (await ledger.resume(record.run_id, graph)).result[TOTALS]  # finished: nothing runs
            merged.update(totals)
    if merged != expected_totals(n, keys):
        raise BenchError(f"the shards' totals differ from the {n} orders' ({keys} keys, {shards} shards)")


def run_keyed_workers(
    server_url: str, url: str, *, n: int, keys: int, shards: int, workers: int, data: Path | None = None
) -> PgKeyedRun:
    """``shards`` runs over ``n`` orders on the new database ``url``, run by ``workers`` processes."""
    anyio.run(_prepare, url, n, keys, shards)
    run = measured(server_url, url, _worker_command(url), workers=workers, messages=n, data=data)
    anyio.run(_verify, url, n, keys, shards)
    return run


def measured(
    server_url: str, url: str, command: list[str], *, workers: int, messages: int, data: Path | None
) -> PgKeyedRun:
    """``workers`` processes of ``command`` on database ``url``, measured: time, CPU, transactions."""
    database = database_of(url)
    commits, rollbacks = transactions(server_url, database)
    server_before = server_cpu(data)
    seconds, cpu = run_processes(command, workers)
    commits_after, rollbacks_after = transactions(server_url, database)
    server_after = server_cpu(data)
    return PgKeyedRun(
        workers=workers,
        messages=messages,
        seconds=seconds,
        worker_cpu=cpu,
        commits=commits_after - commits,
        rollbacks=rollbacks_after - rollbacks,
        server_cpu=None if server_before is None or server_after is None else server_after - server_before,
    )


async def _make_ledger(url: str) -> None:
    async with open_postgres(url):
        pass


def worker_startup_cpu(url: str, *, repeat: int = 3) -> float:
    """CPU seconds of one worker started on the empty ledger ``url``: it claims nothing and exits."""
    anyio.run(_make_ledger, url)
    return statistics.median(_run_workers(url, 1)[1] for _ in range(repeat))
