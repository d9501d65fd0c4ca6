"""Durable node commits: graphs in checkpoint mode on the ledger against ordinary mode and raw py-lmdb.

Two graphs of N nodes (each node sets one int key):

* ``wide``: N independent nodes, each requiring the input; their commits
  share the ledger's group commit;
* ``chain``: N nodes in a line, each requiring the key of the one before; a
  node waits for its predecessor's record, so nothing can batch.

Each runs in ordinary mode (``run_graph``) and durably (``ledger.run`` on a
fresh ledger, durable sync: one confirmed node record per node, published
only after its commit). The raw baseline writes the same records (a sealed
node checkpoint and its attempt record per node) with plain py-lmdb: for
the wide graph in the batches the ledger made, for the chain one fsynced
transaction per node.

The peer, when its packages are installed (``.[bench-peers]``), is
LangGraph with ``SqliteSaver`` (WAL, ``synchronous=FULL``,
``durability="sync"``) running the same two shapes: a ``StateGraph`` of N
nodes, each writing its own key of the state, all from ``START`` (wide: one
superstep, so one checkpoint) or in a line (chain: a checkpoint per node).
It runs in a child process (``python -m bench._nodes langgraph SHAPE N
[WORKDIR]``), as the graphs bench runs its peers.

While each durable run goes on, a probe task of the same loop asks to be
woken every millisecond and records how late it was
(:mod:`bench._lateness`): what the ledger's commits cost the loop's other
tasks.

Each timed run starts right after a full collection: the wide graph holds
thousands of tasks at once, and a full collection falling inside its run
or not (which depends on what ran before, down to declaring the graph's
keys) moved its figure by a third.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import lmdb
import msgspec

from ledger import open_ledger
from ledger.lmdb._env import write_mode
from ledger.lmdb._layout import node_attempt_key, node_record_key
from ledger.lmdb._seal import seal
from streams import Graph, Key, NodeContext, run_graph
from streams.store import CheckpointOutput, NodeAttemptRecord, NodeCheckpoint

from ._lateness import lateness_probe
from ._shape import BenchError, child_report, unimportable

__all__ = [
    "NodeFigure",
    "nodes_peer_missing",
    "run_durable_nodes",
    "run_langgraph_nodes",
    "run_ordinary_nodes",
    "run_raw_nodes",
    "shaped",
]

N_KEY: Final = Key("n", int)


@dataclass
class NodeFigure:
    name: str
    nodes: int
    seconds: float
    txns: int = 0
    #: How late each wake-up of the lateness probe was, in seconds (durable runs only).
    lateness: list[float] = field(default_factory=list)

    @property
    def nodes_per_s(self) -> float:
        return self.nodes / self.seconds


def _key(i: int) -> Key[int]:
    return Key(f"k{i}", int)


def shaped(shape: str, n: int) -> Graph:
    """The wide or the chain graph of ``n`` nodes."""
    graph = Graph(shape, version="1", inputs=[N_KEY])
    for i in range(n):
        needs = N_KEY if shape == "wide" or i == 0 else _key(i - 1)
        graph.add_node(f"n{i}", _setter(needs, _key(i)), requires=[needs], provides=[_key(i)])
    return graph


def _setter(needs: Key[int], gives: Key[int]) -> Any:
    async def node(ctx: NodeContext) -> None:
        ctx.set(gives, ctx[needs] + 1)

    return node


def _check(shape: str, n: int, values: Any) -> None:
    last = values[_key(n - 1)]
    expected = 2 if shape == "wide" else n + 1
    if last != expected:
        raise BenchError(f"{shape}: the last node set {last}, not {expected}")


def run_ordinary_nodes(shape: str, n: int, *, probe: bool = False) -> NodeFigure:
    """The graph in ordinary mode; with ``probe``, beside the lateness probe (the durable runs' baseline)."""
    graph = shaped(shape, n)
    lateness: list[float] = []

    async def main() -> float:
        gc.collect()  # each run starts the collector's cycle afresh, whatever ran before it
        started = time.perf_counter()
        if probe:
            async with lateness_probe() as samples:
                result = await run_graph(graph, {N_KEY: 1})
            lateness.extend(samples)
        else:
            result = await run_graph(graph, {N_KEY: 1})
        seconds = time.perf_counter() - started
        _check(shape, n, result)
        return seconds

    return NodeFigure(f"{shape}_ordinary", n, anyio.run(main), lateness=lateness)


def run_durable_nodes(shape: str, n: int, *, workdir: Path | None = None) -> NodeFigure:
    graph = shaped(shape, n)
    batches: list[int] = []
    lateness: list[float] = []

    async def main(path: Path) -> float:
        async with open_ledger(path) as ledger:
            ledger.backend.env.batch_observer = lambda writes, _ok: batches.append(writes)
            gc.collect()
            async with lateness_probe() as samples:
                started = time.perf_counter()
                outcome = await ledger.run(graph, {N_KEY: 1}, run_id="bench")
                seconds = time.perf_counter() - started
            lateness.extend(samples)
            ledger.backend.env.batch_observer = None
            _check(shape, n, outcome.result)
            records = await ledger.nodes.node_records("bench")
            if len(records) != n or any(r.reason != "completed" for r in records):
                raise BenchError(f"{shape}: the ledger holds {len(records)} node records, not {n}")
        return seconds

    with tempfile.TemporaryDirectory(prefix="nodes-bench-", dir=workdir) as tmp:
        seconds = anyio.run(main, Path(tmp) / "ledger")
    return NodeFigure(f"{shape}_durable", n, seconds, txns=len(batches), lateness=lateness)


def run_raw_nodes(n: int, batch: int, *, workdir: Path | None = None) -> NodeFigure:
    """The records of ``n`` node commits, ``batch`` nodes per fsynced py-lmdb transaction."""
    encode = msgspec.msgpack.encode
    parent = "bench"
    with tempfile.TemporaryDirectory(prefix="raw-nodes-bench-", dir=workdir) as tmp:
        env = lmdb.open(tmp, map_size=1 << 30, max_dbs=2, **write_mode(True))
        try:
            db = env.open_db(b"nodes")
            gc.collect()
            started = time.perf_counter()
            txns = 0
            for first in range(0, n, batch):
                with env.begin(write=True) as txn:
                    for i in range(first, min(first + batch, n)):
                        node = f"n{i}"
                        output = CheckpointOutput(f"k{i}", "ready", encode(i))
                        record = NodeCheckpoint(node, "completed", (output,))
                        key = node_record_key(parent, node)
                        txn.put(key, seal("nodes", key, encode(record)), db=db)
                        scope = f"{parent}/{node}@0.1.0"
                        attempt = NodeAttemptRecord(parent, node, 0, 1, 0, scope, committed=True)
                        akey = node_attempt_key(parent, node, 0)
                        txn.put(akey, seal("nodes", akey, encode(attempt)), db=db)
                txns += 1
            seconds = time.perf_counter() - started
            with env.begin(db=db) as txn:
                stored = txn.stat(db)["entries"]
        finally:
            env.close()
    if stored != 2 * n:
        raise BenchError(f"the raw loop stored {stored} records, not {2 * n}")
    return NodeFigure("raw_lmdb", n, seconds, txns=txns)


# -- the peer, in a child process ----------------------------------------------------------------

#: The modules LangGraph with its SQLite checkpointer needs.
LANGGRAPH_MODULES: Final = ("langgraph", "langgraph.checkpoint.sqlite")
_PEER_TIMEOUT_S: Final = 900


def nodes_peer_missing() -> str | None:
    """Why LangGraph cannot run here (its packages are not importable), or None if it can."""
    return unimportable(LANGGRAPH_MODULES, "pip install -e '.[bench-peers]'")


def run_langgraph_nodes(shape: str, n: int, *, workdir: Path | None = None) -> NodeFigure:
    """LangGraph's graph of ``shape`` and ``n`` nodes on SqliteSaver, in a child process, once verified."""
    argv = [sys.executable, "-m", "bench._nodes", "langgraph", shape, str(n), str(workdir or "")]
    seconds, checkpoints = child_report(argv, f"langgraph on the {shape} graph", _PEER_TIMEOUT_S)
    return NodeFigure(f"langgraph_{shape}", n, seconds, txns=checkpoints)


def _langgraph(shape: str, n: int, tmp: Path) -> tuple[float, int]:
    """The graph as a LangGraph ``StateGraph`` on its SQLite checkpointer; seconds and checkpoints."""
    import sqlite3
    from typing import TypedDict

    graph_module = importlib.import_module("langgraph.graph")
    saver_module = importlib.import_module("langgraph.checkpoint.sqlite")
    fields: dict[str, Any] = {"n": int, **{f"k{i}": int for i in range(n)}}
    state_type: Any = TypedDict("NodesState", fields, total=False)  # type: ignore[misc]

    def setter(needs: str, gives: str) -> Any:
        def node(state: dict[str, int]) -> dict[str, int]:
            return {gives: state[needs] + 1}

        return node

    builder = graph_module.StateGraph(state_type)
    for i in range(n):
        needs = "n" if shape == "wide" or i == 0 else f"k{i - 1}"
        builder.add_node(f"n{i}", setter(needs, f"k{i}"))
        before = graph_module.START if shape == "wide" or i == 0 else f"n{i - 1}"
        builder.add_edge(before, f"n{i}")
    conn = sqlite3.connect(tmp / "langgraph.sqlite", check_same_thread=False)
    try:
        saver = saver_module.SqliteSaver(conn)
        saver.setup()  # sets journal_mode=WAL
        conn.execute("PRAGMA synchronous=FULL")  # an fsync per commit, like the ledger
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "bench-0"}, "recursion_limit": n + 10}
        gc.collect()
        started = time.perf_counter()
        output = graph.invoke({"n": 1}, config, durability="sync")
        seconds = time.perf_counter() - started
        checkpoints = sum(1 for _ in saver.list({"configurable": {"thread_id": "bench-0"}}))
    finally:
        conn.close()
    expected = 2 if shape == "wide" else n + 1
    if output.get(f"k{n - 1}") != expected:
        raise BenchError(f"langgraph's {shape} graph set {output.get(f'k{n - 1}')!r}, not {expected}")
    return seconds, checkpoints


def _peer_main(argv: list[str]) -> int:
    """Child process: ``python -m bench._nodes langgraph SHAPE N [WORKDIR]``; prints one JSON line."""
    shape, n = argv[1], int(argv[2])
    workdir = Path(argv[3]) if len(argv) > 3 and argv[3] else None
    with tempfile.TemporaryDirectory(prefix="langgraph-nodes-bench-", dir=workdir) as tmp:
        try:
            seconds, checkpoints = _langgraph(shape, n, Path(tmp))
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
    print(json.dumps({"peer": "langgraph", "shape": shape, "seconds": seconds, "checkpoints": checkpoints}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_peer_main(sys.argv[1:]))
