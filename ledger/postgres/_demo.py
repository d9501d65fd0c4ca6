"""The demo on a PostgreSQL ledger, run by several worker processes.

The orders are split into shards, each a run of the demo's graph over its
own range of orders (``demo-shard-000``, ...; ``ID-shard-000`` for a demo run
as ``--run-id ID`` beside it), submitted once; ``workers``
worker processes (``python -m ledger worker``) claim and run them under
leases. Kill any worker, or the whole command, and run it again: it submits
nothing twice, the workers resume what the ledger confirmed, and the summary
is the uninterrupted one (billing total ``n(n+1)/2``, one invoice per order,
each audited).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Final

import anyio

from streams import Graph, Key, NodeContext

from .._demo import (
    AUDITED,
    BILLED,
    DEMO_SCOPE,
    INVOICES,
    MESSAGES,
    ORDERS,
    BillingState,
    DemoSummary,
    Order,
    add_billing_and_audit,
    of_runs,
)
from .._errors import DemoMismatchError, DemoWorkerError
from .._ledger import Ledger
from .._runs import decode_inputs
from ._inspect import inspect_postgres
from ._ledger import PgBackend, open_postgres
from ._store import describe_url

__all__ = ["GRAPHS", "SHARD_PREFIX", "run_demo_postgres", "shard_graph"]

FIRST: Final = Key("first", int)
SHARD_PREFIX: Final = f"{DEMO_SCOPE}-shard-"
#: How long a worker's lease lasts: a worker killed holding a shard delays it this long.
LEASE_SECONDS: Final = 5.0


def shard_graph(*, window: int = 1024) -> Graph:
    """The demo's graph over orders ``first`` to ``first + messages - 1``."""
    shard = Graph("demo-shard", version="1", inputs=[MESSAGES, FIRST])

    @shard.node(requires=[MESSAGES, FIRST], provides=[ORDERS], resumable=True)
    async def source(ctx: NodeContext) -> None:
        writer, first = ctx.writer(ORDERS), ctx[FIRST]
        for i in range((writer.position or 0) + 1, ctx[MESSAGES] + 1):
            order = first + i - 1
            try:
                writer.send_nowait(Order(id=order, amount=order), send_at=i)  # as the demo's source does
            except anyio.WouldBlock:
                await writer.send(Order(id=order, amount=order), send_at=i)

    add_billing_and_audit(shard, window=window)
    return shard


#: What ``python -m ledger worker --graphs ledger.postgres._demo:GRAPHS`` runs.
GRAPHS: Final = {"demo-shard": shard_graph()}
_SHARD_GRAPH: Final = "demo-shard"


def _shard_prefix(run_id: str) -> str:
    """What the run ids of the shards of the demo run as ``run_id`` start with (``demo``'s: SHARD_PREFIX)."""
    return f"{run_id}-shard-"


def _shard_ids(run_id: str) -> re.Pattern[str]:
    """The run ids of the shards of the demo run as ``run_id``: ``{run_id}-shard-000``, ..."""
    return re.compile(re.escape(_shard_prefix(run_id)) + "[0-9]{3}")


def _shards(messages: int, count: int) -> list[tuple[int, int]]:
    """``count`` ranges ``(first, size)`` covering orders 1 to ``messages``."""
    size, extra = divmod(messages, count)
    ranges, first = [], 1
    for k in range(count):
        n = size + (1 if k < extra else 0)
        if n:
            ranges.append((first, n))
        first += n
    return ranges


def _refuse_other_contents(report: dict[str, Any], where: str) -> None:
    """The demo writes only beside demos: the shards of any run id and their streams."""
    shards = {r["run_id"] for r in report["runs"] if r["graph"] == _SHARD_GRAPH}
    others = [
        *(
            f"stream {s['scope']}/{s['node']}/{s['key']}"
            for s in report["streams"]
            if not of_runs(s["scope"], shards)
        ),
        *(f"run {r['run_id']!r}" for r in report["runs"] if r["graph"] != _SHARD_GRAPH),
        *(f"graph run {r['run_id']!r}" for r in report["graph_runs"]),
    ]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise DemoMismatchError(
            f"{where} holds more than the demo ({shown}); the demo writes only into an empty database "
            "or its own ledger"
        )


async def _submitted(
    ledger: Ledger[PgBackend], messages: int, shards: int, where: str, run_id: str
) -> tuple[int, bool]:
    """Submit the shards not submitted yet; (shards, whether an earlier command had begun)."""
    graph = GRAPHS["demo-shard"]
    ids = _shard_ids(run_id)
    runs = [r for r in await ledger.runs() if ids.fullmatch(r.run_id)]
    if runs:
        total = sum(decode_inputs(graph, r)[MESSAGES] for r in runs)
        if total != messages:
            raise DemoMismatchError(
                f"{where} holds a demo of {total} orders, not {messages}; run it again with "
                f"--messages {total}, with --fresh to start a new one, or with --run-id ID beside it"
            )
        return len(runs), True
    for k, (first, size) in enumerate(_shards(messages, shards)):
        await ledger.submit(graph, {MESSAGES: size, FIRST: first}, run_id=f"{_shard_prefix(run_id)}{k:03}")
    return min(shards, messages), False


async def _deleted(ledger: Ledger[PgBackend], run_id: str) -> None:
    """``--fresh``: the shards of the demo run as ``run_id`` deleted (cancelled first if left running)."""
    ids = _shard_ids(run_id)
    for record in await ledger.runs():
        if ids.fullmatch(record.run_id):
            if record.status == "running":  # an interrupted demo: its workers were stopped
                await ledger.cancel(record.run_id, reason="demo --fresh")
            await ledger.delete(record.run_id)


async def run_demo_postgres(
    url: str, messages: int = 100_000, *, workers: int = 1, run_id: str = DEMO_SCOPE, fresh: bool = False
) -> DemoSummary:
    """Run (or resume) the demo on the PostgreSQL ledger at ``url`` with ``workers`` worker processes.

    ``run_id`` names the demo (its shards are ``{run_id}-shard-000``, ...),
    so several can run side by side; ``fresh`` deletes its shards first,
    with their records and streams, and starts it anew. A finished demo of
    ``messages`` orders runs nothing and its summary has
    ``already_finished=True``. Raises :class:`~ledger.DemoMismatchError`,
    having changed nothing, if the ledger holds a demo (finished or not) of
    another number of ``messages``, or anything but the demo; and
    :class:`~ledger.DemoWorkerError` if a worker process failed.
    """
    if messages < 1 or workers < 1:
        raise ValueError("the demo needs at least one message and one worker")
    where = describe_url(url)
    began = time.perf_counter()
    async with open_postgres(url) as ledger:
        _refuse_other_contents(await anyio.to_thread.run_sync(inspect_postgres, url), where)
        if fresh:
            await _deleted(ledger, run_id)
        shards, resumed = await _submitted(ledger, messages, 2 * workers, where, run_id)
        ids = _shard_ids(run_id)
        pending = [r for r in await ledger.runs() if ids.fullmatch(r.run_id) and r.status != "completed"]
        if pending:
            await _run_workers(url, workers)
        report = await anyio.to_thread.run_sync(inspect_postgres, url)
        mine = {r["run_id"] for r in report["runs"] if ids.fullmatch(r["run_id"])}
        streams = [s for s in report["streams"] if of_runs(s["scope"], mine)]
        keys = (ORDERS.name, INVOICES.name)
        appended = {key: sum(s["appended"] for s in streams if s["key"] == key) for key in keys}
        return await _summary(
            ledger, began, appended, ids, already_finished=not pending, resumed=resumed, shards=shards
        )


async def _run_workers(url: str, workers: int) -> None:
    command = [
        sys.executable, "-m", "ledger", "worker", url,
        "--graphs", "ledger.postgres._demo:GRAPHS",
        "--lease", str(LEASE_SECONDS), "--poll", "0.1", "--until-idle",
    ]  # fmt: skip
    with contextlib.ExitStack() as files:
        logs = [files.enter_context(tempfile.TemporaryFile()) for _ in range(workers)]
        processes = [await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=log) for log in logs]
        try:
            for process in processes:
                await process.wait()
        finally:
            with anyio.CancelScope(shield=True):
                for process in processes:  # interrupted: stop the workers; their leases run out
                    if process.returncode is None:
                        process.terminate()
                    await process.wait()
        for process, log in zip(processes, logs, strict=True):
            log.seek(0)
            err = log.read().decode(errors="replace").strip()
            if process.returncode != 0:
                last = (
                    err.splitlines()[-1].removeprefix("error: ") if err else f"exit code {process.returncode}"
                )
                raise DemoWorkerError(f"a demo worker failed: {last}")


async def _summary(
    ledger: Ledger[PgBackend],
    began: float,
    appended: dict[str, int],
    ids: re.Pattern[str],
    *,
    already_finished: bool,
    resumed: bool,
    shards: int,
) -> DemoSummary:
    graph = GRAPHS["demo-shard"]
    billed, audited, orders = BillingState(), 0, 0
    del shards  # every shard is a run: the loop below finds them all
    for record in await ledger.runs():
        if not ids.fullmatch(record.run_id):
            continue
        if record.status != "completed":
            raise DemoMismatchError(f"shard {record.run_id!r} of the demo ended {record.status}")
        result = (await ledger.resume(record.run_id, graph)).result  # a finished run: nothing runs
        billed = BillingState(billed.total + result[BILLED].total, billed.count + result[BILLED].count)
        audited += result[AUDITED].count
        orders += decode_inputs(graph, record)[MESSAGES]
    elapsed = time.perf_counter() - began
    if appended[ORDERS.name] != orders:
        raise DemoMismatchError(f"the demo's shards appended {appended[ORDERS.name]} orders, not {orders}")
    return DemoSummary(
        orders=appended[ORDERS.name],
        billing_total=billed.total,
        invoices=appended[INVOICES.name],
        audit_count=audited,
        handled=0 if already_finished else orders,
        elapsed=0.0 if already_finished else elapsed,
        already_finished=already_finished,
        resumed=resumed,
    )
