"""``python -m tests.ledger.keyflip_child WORKDIR SAMPLE [BITS]``: flip key bytes, read as users do.

It builds four small ledgers: a demo killed with SIGKILL in the middle of
its run, a finished demo, durable graph runs stopped at their third step
(their run records and checkpoints, enough for branch pages), and the keyed
state of two groups of a stream (one group's merged into the ``keyed``
table, enough keys for branch pages; the other's, long enough to be
digested in its keys, in its ``keyed_log`` records). It then finds the key of every node on
their live pages (:func:`ledger.lmdb._files.key_bytes`: every leaf, the named
databases' names in LMDB's main database, branch keys), and flips one bit of
each chosen key byte in a fresh copy, which it opens, without running
``check`` first, the way a user would: ``inspect`` and ``messages`` (read-only),
the resumed demo (:func:`ledger._demo.run_demo`), the graph resumed
(``DurableGraph.run``) or the keyed state listed and read (a write open). Each outcome is one JSON line:

* ``reference``: exactly the figures the undamaged copy gives;
* the name of a typed error (a :class:`~ledger.LedgerError` or a
  :class:`~streams.StreamsError`), after which ``data.mdb`` must be
  byte-for-byte what it was, else ``WROTE TO A REFUSED LEDGER``;
* ``OTHER FIGURES`` or ``UNTYPED ...``: what the suite exists to find.

SAMPLE ``all`` flips every key byte (``python -m fuzz --only keyflips``);
a number N flips at most N bytes of each database's leaf keys and of its
branch keys, spread evenly over them (deterministic), for the test suite.
BITS ``1`` (the default) flips one bit of each byte, ``8`` each of its bits.
"""

from __future__ import annotations

import collections
import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from ledger import LedgerEnv, LedgerError, inspect_ledger, open_ledger
from ledger.lmdb import _keyed_log
from ledger.lmdb._demo import run_demo
from ledger.lmdb._files import KeyBytes, key_bytes
from ledger.lmdb._inspect import view_messages
from streams import StreamRef, StreamsError
from streams.store import (
    AppendBatch,
    KeyedRange,
    KeyedRead,
    KeyedWrite,
    MessageCommit,
    MessageRef,
    StreamOpen,
)

from .graphs.graphs import Boom, Calls, Log, durable, three_steps

ROOT = Path(__file__).resolve().parents[2]
KILLED, FINISHED = 3000, 600
#: Killed once billing has confirmed this many orders (and before it confirmed them all).
KILL_AT = 800
ORDERS = StreamRef("demo", "source", "orders")

_KILLER = """
import os, signal, sys
import anyio
from ledger.lmdb._demo import run_demo

def progress(p):
    if {kill_at} <= p.billed < p.messages:
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(lambda: run_demo(sys.argv[1], {messages}, progress=progress, progress_interval=0.002, sync=False))
"""


def build_killed(path: Path) -> None:
    """A demo killed with SIGKILL after billing confirmed at least KILL_AT of its orders."""
    for _ in range(20):
        shutil.rmtree(path, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-c", _KILLER.format(kill_at=KILL_AT, messages=KILLED), str(path)],
            cwd=ROOT,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode == -9:
            return
    raise AssertionError(f"the demo was never killed mid-run in 20 tries: {done.stderr[-300:]!r}")


#: Graph runs stopped at step three: enough records that ``graph_runs`` has branch pages.
GRAPH_RUNS = 60
RESUMED = "run-07"


async def build_graph(path: Path) -> None:
    async with open_ledger(path) as ledger:
        runner = durable(three_steps(), ledger)
        for i in range(GRAPH_RUNS):
            with contextlib.suppress(Boom):  # the run stops at step three: its record and checkpoint stay
                await runner.run(f"run-{i:02}", state=Log(), inputs=5, deps=Calls(fail_at={"three"}))


#: Stream k/src/counts: its groups' keyed state, confirmed with their first messages.
COUNTS = StreamRef("k", "src", "counts")
KEYED_GROUPS = ("g", "l" * 250)
KEYS = 1500


def counts_opening() -> StreamOpen:
    return StreamOpen(COUNTS, "int", 64, KEYED_GROUPS, resumable=True)


async def build_keyed(path: Path) -> None:
    async with open_ledger(path) as ledger:
        opened = await ledger.streams.open(counts_opening())
        await ledger.backend.streams.append(
            AppendBatch(COUNTS, opened.generation, 1, tuple(b"%d" % i for i in range(1, 4)))
        )
        writes = tuple(KeyedWrite(b"key-%05d" % i, b"%d" % (i * 7)) for i in range(KEYS))
        first = MessageRef(COUNTS, KEYED_GROUPS[0], opened.generation, 1)
        merge_keys = _keyed_log.MERGE_KEYS
        _keyed_log.MERGE_KEYS = KEYS  # type: ignore[misc]
        try:  # the first group's keys merged into the table...
            await ledger.streams.commit([MessageCommit(first, keyed=writes)])
        finally:
            _keyed_log.MERGE_KEYS = merge_keys  # type: ignore[misc]
        for seq in range(1, 4):  # ...the second's in its log, a record a commit (a message each)
            message = MessageRef(COUNTS, KEYED_GROUPS[1], opened.generation, seq)
            await ledger.streams.commit([MessageCommit(message, keyed=writes[seq - 1 :: 3])])


# -- the user paths ---------------------------------------------------------------------------


def inspected(path: Path) -> Any:
    env = LedgerEnv.open_readonly(path)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    report.pop("path")
    return report


def viewed(path: Path) -> Any:
    env = LedgerEnv.open_readonly(path)
    try:
        return view_messages(env, ORDERS)
    finally:
        env.close()


def demo_figures(messages: int) -> Callable[[Path], Any]:
    async def demo(path: Path) -> Any:
        with anyio.fail_after(120):  # a demo that never ends is a failure, not a wait
            return await run_demo(path, messages)

    def resume(path: Path) -> Any:
        s = anyio.run(demo, path)
        return (s.orders, s.billing_total, s.invoices, s.audit_count)

    return resume


def graph_resumed(path: Path) -> Any:
    async def resume() -> Any:
        calls = Calls()
        with anyio.fail_after(60):
            return await resumed(calls)

    async def resumed(calls: Calls) -> Any:
        async with open_ledger(path) as ledger:
            result = await durable(three_steps(), ledger).run(RESUMED, state=Log(), inputs=5, deps=calls)
        return (result.output, result.state.steps, calls.ran)

    return anyio.run(resume)


def keyed_read(path: Path) -> Any:
    async def read() -> Any:
        with anyio.fail_after(60):
            async with open_ledger(path) as ledger:
                await ledger.streams.open(counts_opening())
                found = []
                for group in KEYED_GROUPS:
                    listed = await ledger.backend.streams.list_keyed(
                        KeyedRange(COUNTS, group, limit=KEYS + 1)
                    )
                    keys = (b"key-00000", b"key-00750", b"key-99999")
                    found.append(
                        (
                            [(e.key, e.value) for e in listed],
                            await ledger.backend.streams.read_keyed(KeyedRead(COUNTS, group, keys)),
                        )
                    )
                return found

    return anyio.run(read)


PATHS: dict[str, dict[str, Callable[[Path], Any]]] = {
    "killed demo": {"inspect": inspected, "messages": viewed, "demo": demo_figures(KILLED)},
    "finished demo": {"inspect": inspected, "demo": demo_figures(FINISHED)},
    "graph run": {"inspect": inspected, "graph": graph_resumed},
    "keyed state": {"keyed": keyed_read},
}


def outcome(copy: Path, path: Callable[[Path], Any], reference: Any) -> str:
    before = (copy / "data.mdb").read_bytes()
    try:
        found = path(copy)
    except (LedgerError, StreamsError) as exc:
        if (copy / "data.mdb").read_bytes() != before:
            return f"WROTE TO A REFUSED LEDGER ({type(exc).__name__}: {exc})"
        return type(exc).__name__
    except Exception as exc:  # what the suite exists to find: reported, never hidden
        return f"UNTYPED {type(exc).__name__}: {exc}"
    return "reference" if found == reference else f"OTHER FIGURES {found!r:.300}"


def flip(path: Path, offset: int, bit: int) -> None:
    with (path / "data.mdb").open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def chosen(keys: list[KeyBytes], sample: int | None) -> list[tuple[KeyBytes, int]]:
    """The key bytes to flip: every one, or up to ``sample`` spread over each database and page kind."""
    every = [(k, k.offset + i) for k in keys for i in range(k.size)]
    if sample is None:
        return every
    by_place: dict[tuple[str, str], list[tuple[KeyBytes, int]]] = collections.defaultdict(list)
    for key, offset in every:
        by_place[(key.database, key.page)].append((key, offset))
    picked: list[tuple[KeyBytes, int]] = []
    for place in sorted(by_place):
        found = by_place[place]
        step = max(1, len(found) // sample)
        picked.extend(found[::step][:sample])
    return picked


def sweep(workdir: Path, name: str, ledger: Path, sample: int | None, *, bits: int) -> None:
    copy = workdir / "copy"
    references = {}
    for label, path in PATHS[name].items():
        shutil.copytree(ledger, copy)
        references[label] = path(copy)
        shutil.rmtree(copy)
    targets = chosen(key_bytes(ledger), sample)
    print(json.dumps({"ledger": name, "key_bytes": len(targets)}), flush=True)
    for key, offset in targets:
        for bit in range(8) if bits == 8 else (offset % 8,):
            for label, path in PATHS[name].items():
                shutil.copytree(ledger, copy)
                flip(copy, offset, bit)
                line = {
                    "ledger": name,
                    "database": key.database,
                    "page": key.page,
                    "offset": offset,
                    "bit": bit,
                    "path": label,
                    "outcome": outcome(copy, path, references[label]),
                }
                print(json.dumps(line), flush=True)
                shutil.rmtree(copy)


def main(workdir: Path, sample: int | None, bits: int) -> None:
    killed, finished, graph = workdir / "killed", workdir / "finished", workdir / "graph"
    keyed = workdir / "keyed"
    build_killed(killed)
    anyio.run(run_demo, finished, FINISHED)
    anyio.run(build_graph, graph)
    anyio.run(build_keyed, keyed)
    ledgers = (
        ("killed demo", killed),
        ("finished demo", finished),
        ("graph run", graph),
        ("keyed state", keyed),
    )
    for name, ledger in ledgers:
        sweep(workdir, name, ledger, sample, bits=bits)


if __name__ == "__main__":
    main(
        Path(sys.argv[1]),
        None if sys.argv[2] == "all" else int(sys.argv[2]),
        int(sys.argv[3]) if len(sys.argv) > 3 else 1,
    )
