"""The process the crash tests kill: ``python -m tests.ledger.graphs.crash_child LEDGER MODE [DRIVER]``.

MODE ``crash`` runs the three-step graph until step two starts, prints
``two started`` and blocks until it is killed. MODE ``resume`` runs the same
run id to the end and prints what happened as JSON. DRIVER ``run`` (the
default) uses ``DurableGraph.run``; ``iter`` drives the run with
``DurableGraph.iter`` a task at a time, and reports the events it saw.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import anyio
from pydantic_graph import EndMarker

from ledger import open_ledger

from .graphs import Calls, Log, durable, three_steps


class BlockAtTwo(Calls):
    def enter(self, node: str, inputs: Any = None) -> None:
        super().enter(node, inputs)
        if node == "two":
            print("two started", flush=True)
            threading.Event().wait()  # until SIGKILL


async def main(path: str, mode: str, driver: str) -> None:
    calls = BlockAtTwo() if mode == "crash" else Calls()
    seen: list[Any] = []
    async with open_ledger(path) as ledger:
        runner = durable(three_steps(), ledger)
        if driver == "iter":
            async with runner.iter("order-1", state=Log(), inputs=5, deps=calls) as run:
                async for event in run:
                    seen.append("end" if isinstance(event, EndMarker) else [t.node_id for t in event])
            result = run.result
            assert result is not None
        else:
            result = await runner.run("order-1", state=Log(), inputs=5, deps=calls)
    report = {
        "output": result.output,
        "steps": result.state.steps,
        "ran": calls.ran,
        "resumed_from": result.resumed_from,
        "seen": seen,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "run")
