"""Durable pydantic-graph runs against plain pydantic-graph, a raw py-lmdb commit loop and durable peers.

Every figure runs the same loop of N small steps: the state is a
:class:`Counter`, the graph's input is N, step ``bump`` adds one to the
counter and returns its input minus one, and decision ``loop`` routes a
positive number back to ``bump`` and zero to the end. Every ``bump`` ends at
a quiescent, typed boundary (the decision's input type is ``bump``'s return
annotation), so :class:`~ledger.graphs.DurableGraph` saves a checkpoint after
every step and one at the end: N + 1 checkpoints, each one durable ledger
commit before the next step starts.

* ``plain``: ``graph.run`` with no ledger;
* ``durable``: ``DurableGraph(graph, ledger).run`` on ``open_ledger(path)``
  (durable sync), checked through the result and through
  ``DurableGraph.status`` on the reopened ledger;
* ``*_concurrent``: R runs in one task group (distinct run ids, one ledger);
* ``raw_lmdb``: plain py-lmdb, one write transaction (one put of a sealed
  checkpoint-like record, one fsync) per step: the physical limit;
* peers, each in a child process so their globals, threads and tracing
  set-up stay out of ours: LangGraph on its SQLite checkpointer
  (``durability="sync"``, WAL, ``synchronous=FULL``) and DBOS on SQLite
  (one workflow, N ``DBOS.step`` calls). A peer whose packages are not
  importable is skipped.

A run whose result is not exactly the expected one raises :class:`BenchError`.
"""

# mypy cannot read pydantic-graph's infer_variance type variables, so to mypy Graph and
# StepContext take no type arguments; the step annotations are what DurableGraph reads at run time.
# mypy: disable-error-code="type-arg"

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypedDict

import anyio
import lmdb
import msgspec
from pydantic_graph import Graph, GraphBuilder, StepContext

from ledger import Ledger, open_ledger
from ledger._graph_runs import GraphCheckpoint, SavedTask
from ledger.graphs import DurableGraph
from ledger.lmdb._env import write_mode
from ledger.lmdb._seal import seal

from ._shape import BenchError, child_report, unimportable

__all__ = [
    "PEERS",
    "Counter",
    "GraphFigure",
    "loop_graph",
    "peer_missing",
    "run_durable",
    "run_peer",
    "run_plain",
    "run_raw_commits",
]

GRAPH_NAME: Final = "bench_loop"


@dataclass
class Counter:
    """The loop's state: how many steps ran."""

    count: int = 0


def loop_graph() -> Graph:
    """start -> bump; bump -> loop; loop -> (n > 0) bump | end. Input N, output 0, state Counter(N)."""
    g = GraphBuilder(name=GRAPH_NAME, state_type=Counter, input_type=int, output_type=int)

    @g.step
    async def bump(ctx: StepContext[Counter, None, int]) -> int:
        counter: Counter = ctx.state
        counter.count += 1
        remaining: int = ctx.inputs
        return remaining - 1

    loop = (
        g.decision(node_id="loop")
        .branch(g.match(int, matches=lambda n: n > 0).to(bump))
        .branch(g.match(int).to(g.end_node))
    )
    g.add(g.edge_from(g.start_node).to(bump), g.edge_from(bump).to(loop))
    return g.build()


@dataclass
class GraphFigure:
    """One timed, verified measurement: ``steps`` steps (over all runs) in ``seconds``."""

    name: str
    steps: int
    seconds: float
    runs: int = 1
    loop_cpu: float | None = None  # CPU seconds of the event-loop thread while timed
    writer_cpu: float | None = None  # CPU seconds of the ledger's writer thread, first to last batch
    commit_waits: list[float] = field(default_factory=list)  # wall seconds of each ledger.backend.env.write
    txns: int = 0  # LMDB write transactions the ledger made while timed
    txn_writes: int = 0  # writes those transactions carried
    checkpoints: int | None = None  # per run, as the ledger (or the peer) reports them
    record_bytes: int | None = None  # raw_lmdb: size of the sealed record put per commit

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    def per_step_us(self) -> dict[str, float]:
        out = {"wall": self.seconds / self.steps * 1e6}
        if self.loop_cpu is not None:
            out["loop_cpu"] = self.loop_cpu / self.steps * 1e6
        if self.writer_cpu is not None:
            out["writer_cpu"] = self.writer_cpu / self.steps * 1e6
        if self.commit_waits:
            out["commit_wait"] = sum(self.commit_waits) / len(self.commit_waits) * 1e6
        if self.txns:
            out["writes_per_txn"] = self.txn_writes / self.txns
        return out


def _check_result(output: Any, state: Any, n: int, what: str) -> None:
    if output != 0 or state != Counter(n):
        raise BenchError(f"{what} ended with output {output!r} and state {state!r}; want 0 and Counter({n})")


# -- plain pydantic-graph ------------------------------------------------------------------


def run_plain(n: int, *, runs: int = 1, backend: str = "asyncio") -> GraphFigure:
    """``runs`` plain ``graph.run`` calls of ``n`` steps each, concurrently when more than one."""
    graph = loop_graph()

    async def one() -> None:
        state = Counter()
        output = await graph.run(state=state, inputs=n)
        _check_result(output, state, n, "a plain run")

    async def main() -> tuple[float, float]:
        cpu = time.thread_time()
        started = time.perf_counter()
        await _gather(one, runs)
        return time.perf_counter() - started, time.thread_time() - cpu

    seconds, loop_cpu = anyio.run(main, backend=backend)
    name = "plain" if runs == 1 else "plain_concurrent"
    return GraphFigure(name, n * runs, seconds, runs=runs, loop_cpu=loop_cpu)


async def _gather(fn: Callable[[], Coroutine[Any, Any, None]], runs: int) -> None:
    if runs == 1:
        await fn()
        return
    async with anyio.create_task_group() as tg:
        for _ in range(runs):
            tg.start_soon(fn)


# -- DurableGraph --------------------------------------------------------------------------


def run_durable(
    n: int, *, runs: int = 1, backend: str = "asyncio", workdir: Path | None = None
) -> GraphFigure:
    """``runs`` durable runs of ``n`` steps each on one fresh ledger, concurrently when more than one.

    Besides the time it records the event-loop thread's CPU, the writer
    thread's CPU (read at the end of each commit batch, on that thread), the
    LMDB transactions and the wall time of every ``ledger.backend.env.write`` (the
    bench wraps the method on the open ledger; the runner's checkpoint
    writes go through it).
    """
    graph = loop_graph()
    run_ids = [f"bench-{i}" for i in range(runs)]
    waits: list[float] = []
    batches: list[int] = []
    writer_cpu: dict[int, list[float]] = {}

    def observe(writes: int, _ok: int) -> None:
        batches.append(writes)
        now = time.thread_time()
        writer_cpu.setdefault(threading.get_ident(), [now, now])[1] = now

    def timed_writes(ledger: Ledger) -> None:
        write = ledger.backend.env.write

        async def timed(fn: Callable[[lmdb.Transaction], Any]) -> Any:
            started = time.perf_counter()
            try:
                return await write(fn)
            finally:
                waits.append(time.perf_counter() - started)

        setattr(ledger.backend.env, "write", timed)  # noqa: B010 (mypy refuses assigning to a method)

    with tempfile.TemporaryDirectory(prefix="graphs-bench-", dir=workdir) as tmp:
        path = Path(tmp) / "ledger"

        async def main() -> tuple[float, float]:
            async with open_ledger(path) as ledger:
                durable = DurableGraph[Counter, None, int, int](graph, ledger)
                timed_writes(ledger)
                ledger.backend.env.batch_observer = observe

                async def one(run_id: str) -> None:
                    result = await durable.run(run_id, state=Counter(), inputs=n)
                    _check_result(result.output, result.state, n, f"durable run {run_id}")
                    if result.attempt != 1 or result.resumed_from is not None or result.already_finished:
                        raise BenchError(f"durable run {run_id} was not one complete attempt: {result!r}")

                cpu = time.thread_time()
                started = time.perf_counter()
                if runs == 1:
                    await one(run_ids[0])
                else:
                    async with anyio.create_task_group() as tg:
                        for run_id in run_ids:
                            tg.start_soon(one, run_id)
                seconds = time.perf_counter() - started
                loop_cpu = time.thread_time() - cpu
                ledger.backend.env.batch_observer = None
                await _check_status(durable, run_ids, n)
            # What the closed ledger holds, not what the run said.
            async with open_ledger(path, create=False) as reopened:
                await _check_status(DurableGraph[Counter, None, int, int](graph, reopened), run_ids, n)
            return seconds, loop_cpu

        seconds, loop_cpu = anyio.run(main, backend=backend)
    return GraphFigure(
        "durable" if runs == 1 else "durable_concurrent",
        n * runs,
        seconds,
        runs=runs,
        loop_cpu=loop_cpu,
        writer_cpu=sum(last - first for first, last in writer_cpu.values()),
        commit_waits=waits,
        txns=len(batches),
        txn_writes=sum(batches),
        checkpoints=n + 1,
    )


async def _check_status(durable: DurableGraph[Any, Any, Any, Any], run_ids: list[str], n: int) -> None:
    """Each run saved a checkpoint after every step and one at the end, and finished."""
    for run_id in run_ids:
        status = await durable.status(run_id)
        if (
            status is None
            or status.checkpoints != n + 1
            or not status.finished
            or status.last_step != "__end__"
            or status.attempt != 1
        ):
            raise BenchError(f"run {run_id} should hold {n + 1} checkpoints and be finished: {status!r}")


# -- raw py-lmdb: one durable commit per step ----------------------------------------------


def run_raw_commits(n: int, *, workdir: Path | None = None) -> GraphFigure:
    """``n`` durable py-lmdb write transactions, each one put of a sealed checkpoint of the loop graph."""
    encode = msgspec.msgpack.encode
    fingerprint = hashlib.sha256(b"bench").hexdigest()
    key = b"checkpoint/bench-0"
    size = 0
    with tempfile.TemporaryDirectory(prefix="raw-commits-bench-", dir=workdir) as tmp:
        env = lmdb.open(tmp, map_size=1 << 30, max_dbs=2, **write_mode(True))
        try:
            db = env.open_db(b"graph_runs")
            started = time.perf_counter()
            for i in range(1, n + 1):
                record = GraphCheckpoint(
                    1,
                    fingerprint,
                    i,
                    1,
                    "bump",
                    b'{"count":%d}' % i,
                    b"%d" % n,
                    (SavedTask("loop", b"%d" % (n - i), ()),),
                )
                value = seal("graph_runs", key, encode(record))
                size = len(value)
                with env.begin(write=True) as txn:
                    txn.put(key, value, db=db)
            seconds = time.perf_counter() - started
            with env.begin() as txn:
                raw = txn.get(key, db=db)
                commits = int(env.info()["last_txnid"])
        finally:
            env.close()
    if raw is None or msgspec.msgpack.decode(raw[4:], type=GraphCheckpoint).sequence != n or commits < n:
        raise BenchError(f"the raw LMDB loop made {commits} commits and left {raw!r}")
    return GraphFigure("raw_lmdb", n, seconds, record_bytes=size)


# -- peers, each in a child process -------------------------------------------------------------

#: The peers and the modules each needs.
PEERS: Final = {
    "langgraph": ("langgraph", "langgraph.checkpoint.sqlite"),
    "dbos": ("dbos",),
}

_PEER_INSTALL: Final = {
    "langgraph": "pip install langgraph langgraph-checkpoint-sqlite",
    "dbos": "pip install dbos",
}

_PEER_TIMEOUT_S: Final = 900


def peer_missing(name: str) -> str | None:
    """Why ``name`` cannot run here (its packages are not importable), or None if it can."""
    return unimportable(PEERS[name], _PEER_INSTALL[name])


def run_peer(name: str, n: int, *, workdir: Path | None = None) -> GraphFigure:
    """Run peer ``name``'s loop of ``n`` steps in a child process; its figure once it verified."""
    argv = [sys.executable, "-m", "bench._graphs", name, str(n), str(workdir or "")]
    seconds, checkpoints = child_report(argv, f"peer {name} ({n} steps)", _PEER_TIMEOUT_S)
    return GraphFigure(name, n, seconds, checkpoints=checkpoints)


class _LoopState(TypedDict):
    count: int


def _langgraph(n: int, tmp: Path) -> tuple[float, int]:
    """The loop as a LangGraph StateGraph on its SQLite checkpointer, every step saved before the next."""
    import sqlite3

    graph_module = importlib.import_module("langgraph.graph")
    saver_module = importlib.import_module("langgraph.checkpoint.sqlite")

    def bump(state: _LoopState) -> dict[str, int]:
        return {"count": state["count"] + 1}

    def route(state: _LoopState) -> str:
        return "bump" if state["count"] < n else str(graph_module.END)

    builder = graph_module.StateGraph(_LoopState)
    builder.add_node("bump", bump)
    builder.add_edge(graph_module.START, "bump")
    builder.add_conditional_edges("bump", route)
    conn = sqlite3.connect(tmp / "langgraph.sqlite", check_same_thread=False)
    try:
        saver = saver_module.SqliteSaver(conn)
        saver.setup()  # sets journal_mode=WAL
        conn.execute("PRAGMA synchronous=FULL")  # an fsync per commit, like the ledger
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "bench-0"}, "recursion_limit": n + 10}
        started = time.perf_counter()
        output = graph.invoke({"count": 0}, config, durability="sync")
        seconds = time.perf_counter() - started
        checkpoints = sum(1 for _ in saver.list({"configurable": {"thread_id": "bench-0"}}))
    finally:
        conn.close()
    if output != {"count": n} or checkpoints < n + 1:
        raise BenchError(f"langgraph ended with {output!r} after {checkpoints} checkpoints")
    return seconds, checkpoints


def _dbos(n: int, tmp: Path) -> tuple[float, int]:
    """The loop as one DBOS workflow calling a ``DBOS.step`` N times, system database on SQLite."""
    dbos = importlib.import_module("dbos")
    ran = [0]

    def bump_step(count: int) -> int:
        ran[0] += 1
        return count + 1

    def loop_workflow(steps: int) -> int:
        count = 0
        for _ in range(steps):
            count = bump(count)
        return count

    bump = dbos.DBOS.step()(bump_step)
    workflow = dbos.DBOS.workflow()(loop_workflow)
    config = {
        "name": "bench-graphs",
        "system_database_url": f"sqlite:///{tmp / 'dbos.sqlite'}",
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    dbos.DBOS(config=config)
    dbos.DBOS.launch()
    try:
        started = time.perf_counter()
        with dbos.SetWorkflowID("bench-0"):
            output = workflow(n)
        seconds = time.perf_counter() - started
        steps = len(dbos.DBOS.list_workflow_steps("bench-0"))
    finally:
        dbos.DBOS.destroy()
    if output != n or ran[0] != n or steps != n:
        raise BenchError(f"dbos ended with {output!r} after {ran[0]} steps, {steps} recorded")
    return seconds, steps


def _peer_main(argv: list[str]) -> int:
    """Child process: ``python -m bench._graphs PEER N [WORKDIR]``; prints one JSON line."""
    name, n = argv[0], int(argv[1])
    workdir = Path(argv[2]) if len(argv) > 2 and argv[2] else None
    run = {"langgraph": _langgraph, "dbos": _dbos}[name]
    with tempfile.TemporaryDirectory(prefix=f"{name}-bench-", dir=workdir) as tmp:
        try:
            seconds, checkpoints = run(n, Path(tmp))
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
    print(json.dumps({"peer": name, "steps": n, "seconds": seconds, "checkpoints": checkpoints}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_peer_main(sys.argv[1:]))
