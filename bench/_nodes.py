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

Each timed run starts right after a full collection: the wide graph holds
thousands of tasks at once, and a full collection falling inside its run
or not (which depends on what ran before, down to declaring the graph's
keys) moved its figure by a third.
"""

from __future__ import annotations

import gc
import tempfile
import time
from dataclasses import dataclass
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

from ._shape import BenchError

__all__ = ["NodeFigure", "run_durable_nodes", "run_ordinary_nodes", "run_raw_nodes", "shaped"]

N_KEY: Final = Key("n", int)


@dataclass
class NodeFigure:
    name: str
    nodes: int
    seconds: float
    txns: int = 0

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


def run_ordinary_nodes(shape: str, n: int) -> NodeFigure:
    graph = shaped(shape, n)

    async def main() -> float:
        gc.collect()  # each run starts the collector's cycle afresh, whatever ran before it
        started = time.perf_counter()
        result = await run_graph(graph, {N_KEY: 1})
        seconds = time.perf_counter() - started
        _check(shape, n, result)
        return seconds

    return NodeFigure(f"{shape}_ordinary", n, anyio.run(main))


def run_durable_nodes(shape: str, n: int, *, workdir: Path | None = None) -> NodeFigure:
    graph = shaped(shape, n)
    batches: list[int] = []

    async def main(path: Path) -> float:
        async with open_ledger(path) as ledger:
            ledger.backend.env.batch_observer = lambda writes, _ok: batches.append(writes)
            gc.collect()
            started = time.perf_counter()
            outcome = await ledger.run(graph, {N_KEY: 1}, run_id="bench")
            seconds = time.perf_counter() - started
            ledger.backend.env.batch_observer = None
            _check(shape, n, outcome.result)
            records = await ledger.nodes.node_records("bench")
            if len(records) != n or any(r.reason != "completed" for r in records):
                raise BenchError(f"{shape}: the ledger holds {len(records)} node records, not {n}")
        return seconds

    with tempfile.TemporaryDirectory(prefix="nodes-bench-", dir=workdir) as tmp:
        seconds = anyio.run(main, Path(tmp) / "ledger")
    return NodeFigure(f"{shape}_durable", n, seconds, txns=len(batches))


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
