"""``python -m tests.ledger.bitflip_child WORKDIR SEED FLIPS``: flip bits of a ledger, one copy each.

FLIPS ``all`` flips every bit of every page in turn (``python -m fuzz.bitflips``).

It builds a ledger holding every kind of record (a finished demo; a stream
with unacknowledged messages and a failed attempt's budget; a group's keyed
state, half in its table and half in its log; a durable graph run's record
and checkpoint), copies it compacted so that every page is in use, then for
each of FLIPS seeded random bits flips it in a fresh copy and reads the copy
as a user would, with no ``check`` first: ``inspect``, then the stream
reopened and read back with the keyed state (a write: the reopen raises its
generation); a refusal must be typed and write nothing. The demo refuses to
run beside other records, so the write is the application's. One JSON line
per flip says what happened. A signal kills this process, and the test sees
it."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio

from ledger import LedgerEnv, LedgerError, inspect_ledger, open_ledger
from ledger.lmdb import _keyed_log
from ledger.lmdb._check import check_ledger
from ledger.lmdb._demo import run_demo
from streams import Key, Stream, StreamsError, open_scope
from streams.store import KeyedRange, KeyedWrite, MessageCommit, MessageFail, MessageOpen, MessageRef

from .graphs.graphs import Boom, Calls, Log, durable, three_steps

DEMO = 3000
NUMBERS = Key("numbers", Stream[int])
COUNTS = Key("counts", Stream[int])
#: The keyed state group k of stream s/src/counts confirms with its two messages (table and log).
KEYED = {b"key-%03d" % i: b"value-%d" % (i * i) for i in range(200)}


async def build(path: Path) -> None:
    await run_demo(path, DEMO)
    async with open_ledger(path) as ledger:
        async with open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
            for n in range(1, 301):
                await stream.writer().send(n)
            await stream.writer().flush()
            ref = MessageRef(stream.ref, "g", stream.generation, 1)
            await ledger.streams.open_message(MessageOpen(ref, node="h", limit=3))
            await ledger.streams.fail_message(MessageFail(ref, node="h", limit=3, index=0))
            counts = await scope.open_stream(COUNTS, node="src", groups=("k",))
            for n in range(1, 3):
                await counts.writer().send(n)
            await counts.writer().flush()
            writes = tuple(KeyedWrite(k, v) for k, v in KEYED.items())
            first, second = (MessageRef(counts.ref, "k", counts.generation, seq) for seq in (1, 2))
            merge_keys = _keyed_log.MERGE_KEYS
            _keyed_log.MERGE_KEYS = 100  # type: ignore[misc]
            try:  # half the keys merged into the keyed table...
                await ledger.streams.commit([MessageCommit(first, keyed=writes[:100])])
            finally:
                _keyed_log.MERGE_KEYS = merge_keys  # type: ignore[misc]
            await ledger.streams.commit([MessageCommit(second, keyed=writes[100:])])  # ...half in its log
        runner = durable(three_steps(), ledger)
        with contextlib.suppress(Boom):  # the run stops at step three: its record and checkpoint stay
            await runner.run("r", state=Log(), inputs=5, deps=Calls(fail_at={"three"}))


async def read_back(path: Path) -> bool:
    """Reopen the stream (a write) and read its 300 unacknowledged messages and group k's keyed state.

    Whether the messages are 1..300 and the keyed state is :data:`KEYED`.

    Waiting longer than a minute for them is a failure (``TimeoutError``): a ledger taken for another,
    whose stream holds fewer messages, would wait forever.
    """
    with anyio.fail_after(60):
        return await _read_back(path)


async def _read_back(path: Path) -> bool:
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
        reader = stream.reader("g")
        if [(await reader.receive()).value for _ in range(300)] != list(range(1, 301)):
            return False
        counts = await scope.open_stream(COUNTS, node="src", groups=("k",), resumable=True)
        keyed = await ledger.backend.streams.list_keyed(KeyedRange(counts.ref, "k", limit=1000))
        return {e.key: e.value for e in keyed} == KEYED


def view(path: Path) -> dict[str, Any]:
    """``inspect`` as a user runs it: the ledger verified when it opens, and no ``check`` first."""
    env = LedgerEnv.open_readonly(path)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    report.pop("path")
    return report


def sound(path: Path) -> bool:
    env = LedgerEnv.open_readonly(path, verify=False)
    try:
        return check_ledger(env).sound
    finally:
        env.close()


def flip(path: Path, bit: int) -> None:
    with (path / "data.mdb").open("r+b") as f:
        f.seek(bit // 8)
        byte = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([byte ^ (1 << (bit % 8))]))


def outcome(copy: Path, original: dict[str, Any]) -> str:
    """Inspect, then the stream reopened (a write), neither gated by ``check``: both must agree.

    A refusal is typed and leaves ``data.mdb`` as it was; a ledger inspect
    accepted reads back as it was, or the write path refuses it, typed.
    """
    before = (copy / "data.mdb").read_bytes()
    try:
        report = view(copy)
    except (LedgerError, StreamsError) as exc:
        refused = type(exc).__name__
        try:  # the write path must refuse it too, and write nothing
            anyio.run(read_back, copy)
        except (LedgerError, StreamsError):
            pass
        except Exception as exc:
            return f"UNTYPED {type(exc).__name__} on the write path: {exc}"
        else:
            return f"READ BACK A LEDGER INSPECT REFUSED ({refused})"
        if (copy / "data.mdb").read_bytes() != before:
            return f"WROTE TO A REFUSED LEDGER ({refused})"
        return refused
    except Exception as exc:  # what the suite exists to find: reported, never hidden
        return f"UNTYPED {type(exc).__name__}: {exc}"
    if report != original:
        return "READ OTHER DATA"
    try:
        if not anyio.run(read_back, copy):
            return "RESUMED TO ANOTHER ANSWER"
    except (LedgerError, StreamsError) as exc:
        if (copy / "data.mdb").read_bytes() != before:
            return f"WROTE TO A REFUSED LEDGER ({type(exc).__name__})"
        return type(exc).__name__
    except Exception as exc:
        return f"UNTYPED {type(exc).__name__}: {exc}"
    return "unchanged"


def main(workdir: Path, seed: int, flips: int | None) -> None:
    """``flips`` seeded random bits, or every bit when None."""
    built, ledger = workdir / "built", workdir / "ledger"
    anyio.run(build, built)
    env = LedgerEnv.open_readonly(built)
    try:
        env.copy_to(ledger)  # compacted: every page of the copy is in use
    finally:
        env.close()
    original = view(ledger)
    assert sound(ledger)
    size = (ledger / "data.mdb").stat().st_size
    rng = random.Random(seed)
    print(json.dumps({"pages": size // 4096}), flush=True)
    bits = range(size * 8) if flips is None else (rng.randrange(size * 8) for _ in range(flips))
    for i, bit in enumerate(bits):
        copy = workdir / "copy"
        shutil.copytree(ledger, copy)
        flip(copy, bit)
        print(json.dumps({"flip": i, "bit": bit, "outcome": outcome(copy, original)}), flush=True)
        shutil.rmtree(copy)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), None if sys.argv[3] == "all" else int(sys.argv[3]))
