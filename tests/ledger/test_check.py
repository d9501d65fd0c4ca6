"""``python -m ledger check`` and ``backup``: a sound ledger passes, each kind of damage is named."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import lmdb
import pytest

from ledger import LedgerEnv, open_ledger
from ledger.lmdb._check import check_ledger
from ledger.lmdb._demo import run_demo
from ledger.lmdb._layout import CHECKPOINT_PREFIX, descriptor_key, group_key, keyed_prefix, message_key
from streams import Key, Stream, open_scope

from ..ledger_command import ledger_command

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return ledger_command(*args, timeout=300)


def damage(path: Path, db: bytes, change: Callable[[Any], None]) -> None:
    env = lmdb.open(str(path), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(db, create=False)) as txn:
            change(txn)
    finally:
        env.close()


def checked(path: Path) -> list[str]:
    env = LedgerEnv.open_readonly(path, verify=False)
    try:
        return check_ledger(env).problems
    finally:
        env.close()


async def _pending_numbers(path: Path) -> None:
    """A third stream whose 600 messages nobody acked: stored in runs, three appends of 200."""
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(Key("numbers", Stream[int]), node="src", groups=("g",))
        for first in (1, 201, 401):
            for n in range(first, first + 200):
                stream.writer().send_nowait(n)  # no checkpoint: the 200 leave in one append
            await stream.writer().flush()


@pytest.fixture
def demo_ledger(tmp_path: Path) -> Path:
    """A finished demo (its messages compacted), and stream 3 of 600 unacknowledged messages."""
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 600)
    anyio.run(_pending_numbers, path)
    return path


def test_a_sound_ledger_passes_and_check_changes_nothing(demo_ledger: Path) -> None:
    before = (demo_ledger / "data.mdb").read_bytes()
    done = cli("check", str(demo_ledger), "--json")
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    assert report["sound"] and report["problems"] == [] and report["records"]["groups"] == 3
    assert cli("check", str(demo_ledger)).stdout.endswith("records checked, sound\n")
    assert (demo_ledger / "data.mdb").read_bytes() == before


def _flip_value(txn: Any) -> None:
    key = descriptor_key(1)
    value = bytearray(txn.get(key))
    value[-1] ^= 0x01
    txn.put(key, bytes(value))


def _move_frontier(txn: Any) -> None:
    key = group_key(1, "billing")
    value = txn.get(key)
    txn.delete(key)
    txn.put(key[:-1] + b"X", value)


def _drop_a_run(txn: Any) -> None:
    """Delete the second stored run of stream 3's messages (a run's key is its first sequence)."""
    keys = [bytes(k) for k, _ in txn.cursor() if bytes(k).startswith(message_key(3, 0)[:8])]
    assert len(keys) >= 3
    assert txn.delete(keys[1])


def _orphan_checkpoint(txn: Any) -> None:
    from ledger.lmdb._seal import seal

    key = CHECKPOINT_PREFIX + b"nobody"
    txn.put(key, seal("graph_runs", key, b"\x80"))


def _orphan_keyed_state(txn: Any) -> None:
    """A key of keyed state sealed where it sits, of a group stream 3 does not list."""
    from ledger.lmdb._seal import seal

    key = keyed_prefix(3, "gone") + b"k"
    txn.put(key, seal("keyed", key, b"1"))


@pytest.mark.parametrize(
    ("db", "change", "problem"),
    [
        (b"streams", _flip_value, "in database 'streams' of the ledger fails its checksum"),
        (b"groups", _move_frontier, "lists group 'billing', whose frontier is missing"),
        (b"messages", _drop_a_run, "stream s/src/numbers: messages jump from 200 to 401"),
        (b"graph_runs", _orphan_checkpoint, "graph run 'nobody' has a checkpoint but no run record"),
        (b"keyed", _orphan_keyed_state, "of stream s/src/numbers belongs to no group the stream lists"),
    ],
    ids=["flipped-value", "moved-frontier", "missing-run", "orphan-checkpoint", "orphan-keyed-state"],
)
def test_each_kind_of_damage_is_named_and_check_exits_4(
    demo_ledger: Path, db: bytes, change: Callable[[Any], None], problem: str
) -> None:
    damage(demo_ledger, db, change)
    problems = checked(demo_ledger)
    assert any(problem in p for p in problems), problems
    done = cli("check", str(demo_ledger))
    assert done.returncode == 4
    assert problem in done.stdout and "problems" in done.stdout.splitlines()[0]


def test_a_backup_taken_while_the_owner_runs_is_sound_and_the_demo_resumes_from_it(tmp_path: Path) -> None:
    path, copy = tmp_path / "ledger", tmp_path / "copy"
    n = 200_000
    owner = subprocess.Popen(
        [sys.executable, "-m", "ledger", "demo", str(path), "--messages", str(n)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        assert owner.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(owner.stderr, selectors.EVENT_READ)
            assert selector.select(60), "the demo never reported progress"
        owner.stderr.readline()  # the demo runs: its streams are open
        done = cli("backup", str(path), str(copy))
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert owner.stderr is not None
        owner.stderr.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ledger {path} copied to {copy}:") and done.stdout.rstrip().endswith(
        "sound"
    )
    assert checked(copy) == []
    summary = anyio.run(run_demo, copy, n)  # the copy resumes to the exact answer
    assert summary.billing_total == n * (n + 1) // 2 and summary.audit_count == n
    assert cli("backup", str(path), str(copy)).returncode == 2  # an existing destination is refused
