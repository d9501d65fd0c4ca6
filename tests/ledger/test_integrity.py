"""A damaged record is found, never read as other data or as empty history."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import lmdb
import pytest

from ledger import (
    CorruptRecordError,
    LedgerEnv,
    MissingRecordError,
    NotALedgerError,
    inspect_ledger,
    open_ledger,
)
from ledger.lmdb._demo import run_demo
from ledger.lmdb._layout import descriptor_key, group_key, message_key
from streams import Key, Stream, open_scope

from ..ledger_command import ledger_command

NUMBERS = Key("numbers", Stream[int])
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def raw_db(path: Path, name: bytes) -> Iterator[tuple[lmdb.Environment, Any]]:
    env = lmdb.open(str(path), max_dbs=16)
    try:
        yield env, env.open_db(name, create=False)
    finally:
        env.close()


def move_record(path: Path, db_name: bytes, key: bytes, new_key: bytes) -> None:
    """What a damaged key does: the record is gone from its key and sits under another."""
    with raw_db(path, db_name) as (env, db), env.begin(write=True, db=db) as txn:
        value = txn.get(key)
        assert value is not None
        txn.delete(key)
        txn.put(new_key, value)


def flip_a_bit(key: bytes, index: int) -> bytes:
    damaged = bytearray(key)
    damaged[index] ^= 0x04
    return bytes(damaged)


async def a_stream_with_two_groups(path: Path) -> None:
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("billing", "audit"), resumable=True)
        for n in range(1, 6):
            stream.writer().send_nowait(n, send_at=n)  # no checkpoint: the five leave in one append
        await stream.writer().flush()
        await stream.reader("billing").ack(1)


async def reopen(path: Path) -> None:
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        await scope.open_stream(NUMBERS, node="src", groups=("billing", "audit"), resumable=True)


async def test_a_message_missing_from_a_groups_tail_stops_recovery(tmp_path: Path) -> None:
    # the descriptor says five messages were appended and audit acknowledged none: all five must
    # be stored; their run gone (a lost page, a record deleted by hand) is damage, never a shorter
    # tail. (A run whose key was damaged is still found under its stream and fails its checksum.)
    path = tmp_path / "l"
    await a_stream_with_two_groups(path)
    with raw_db(path, b"messages") as (env, db), env.begin(write=True, db=db) as txn:
        assert txn.delete(message_key(1, 1))
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(MissingRecordError, match=r"should hold messages 1 to 5 .* holds 0 message"):
        await reopen(path)  # refused when the ledger opens, before the stream's open writes anything
    assert (path / "data.mdb").read_bytes() == before


async def test_a_group_whose_key_was_damaged_stops_recovery_and_is_never_recreated(tmp_path: Path) -> None:
    path = tmp_path / "l"
    await a_stream_with_two_groups(path)
    billing = group_key(1, "billing")
    move_record(path, b"groups", billing, flip_a_bit(billing, len(billing) - 1))
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(CorruptRecordError, match="in database 'groups' of the ledger fails its checksum"):
        await reopen(path)  # the moved record is read when the ledger opens, and refused
    assert (path / "data.mdb").read_bytes() == before  # nothing recreated, nothing written
    with pytest.raises(CorruptRecordError, match="in database 'groups' of the ledger fails its checksum"):
        await anyio.to_thread.run_sync(LedgerEnv.open_readonly, path)
    env = await anyio.to_thread.run_sync(partial(LedgerEnv.open_readonly, path, verify=False))
    try:
        with pytest.raises(CorruptRecordError, match="in database 'groups' of the ledger fails its checksum"):
            inspect_ledger(env)  # unverified, inspect still finds it by its stream's prefix, and refuses it
    finally:
        env.close()


async def test_a_record_under_another_records_key_fails_its_checksum(tmp_path: Path) -> None:
    path = tmp_path / "l"
    await a_stream_with_two_groups(path)
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        other = Key("other", Stream[int])
        await scope.open_stream(other, node="src", groups=("g",))
    # stream 2's descriptor key now holds stream 1's descriptor, a well-formed record of another key
    with raw_db(path, b"streams") as (raw, db), raw.begin(write=True, db=db) as txn:
        moved = txn.get(descriptor_key(1))
        assert moved is not None
        txn.put(descriptor_key(2), moved)
    with pytest.raises(CorruptRecordError, match=f"record {descriptor_key(2).hex()} in database 'streams'"):
        await anyio.to_thread.run_sync(LedgerEnv.open_readonly, path)


def test_the_demo_on_a_ledger_with_a_damaged_key_exits_4_with_one_line_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 30)
    billing = group_key(1, "billing")
    move_record(path, b"groups", billing, flip_a_bit(billing, 9))
    before = (path / "data.mdb").read_bytes()
    done = ledger_command("demo", str(path), "--messages", "30")
    assert done.returncode == 4, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and "damaged" in line  # the moved record, or the missing one
    assert (path / "data.mdb").read_bytes() == before


def test_a_data_file_cut_at_any_page_is_refused_with_a_typed_error_never_a_signal(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 2000)
    work = tmp_path / "cuts"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.ledger.truncate_child", str(path), str(work)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, f"the reader died ({done.returncode}): {done.stderr[-500:]}"
    cuts = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(cuts) >= 10
    # a cut through a page a record lives in is refused; one that removed only free pages (LMDB
    # neither writes nor reads them) leaves every record readable, exactly as before
    assert {c["outcome"] for c in cuts} <= {"DamagedLedgerError", "read"}
    refused = [c["cut"] for c in cuts if c["outcome"] == "DamagedLedgerError"]
    assert len(refused) >= 10 and min(refused) == 2048  # the middle of the first meta page


def test_a_ledger_whose_creation_stopped_after_its_schema_is_inspected_as_empty_and_completed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "l"
    LedgerEnv.open(path).close()
    # as if killed before the named databases were made
    with raw_db(path, b"meta") as (raw, _), raw.begin(write=True) as txn:
        for name in (
            b"streams",
            b"messages",
            b"groups",
            b"attempts",
            b"graph_runs",
            b"nodes",
            b"keyed",
            b"keyed_log",
        ):
            txn.drop(raw.open_db(name, txn=txn), delete=True)
    env = LedgerEnv.open_readonly(path)
    try:
        empty: dict[str, object] = {
            "path": str(path),
            "owner": None,
            "streams": [],
            "runs": [],
            "graph_runs": [],
        }
        assert inspect_ledger(env) == empty
        with pytest.raises(NotALedgerError, match="no 'streams' database: its creation was interrupted"):
            env.db("streams")
    finally:
        env.close()
    LedgerEnv.open(path).close()  # opened for writing: completed
    env = LedgerEnv.open_readonly(path)
    try:
        assert env.has_db("streams") and env.has_db("graph_runs") and env.has_db("keyed")
    finally:
        env.close()
