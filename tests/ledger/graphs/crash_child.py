"""The process the crash test kills: ``python -m tests.ledger.graphs.crash_child LEDGER MODE``.

MODE ``crash`` runs the three-step graph until step two starts, prints
``two started`` and blocks until it is killed. MODE ``resume`` runs the same
run id to the end and prints what happened as JSON.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import anyio

from ledger import open_ledger

from .graphs import Calls, Log, durable, three_steps


class BlockAtTwo(Calls):
    def enter(self, node: str, inputs: Any = None) -> None:
        super().enter(node, inputs)
        if node == "two":
            print("two started", flush=True)
            threading.Event().wait()  # until SIGKILL


async def main(path: str, mode: str) -> None:
    calls = BlockAtTwo() if mode == "crash" else Calls()
    async with open_ledger(path) as ledger:
        result = await durable(three_steps(), ledger).run("order-1", state=Log(), inputs=5, deps=calls)
    report = {
        "output": result.output,
        "steps": result.state.steps,
        "ran": calls.ran,
        "resumed_from": result.resumed_from,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
