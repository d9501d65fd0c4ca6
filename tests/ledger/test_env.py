from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import lmdb
import msgspec
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import (
    CorruptRecordError,
    LedgerClosedError,
    LedgerEnv,
    LedgerInUseError,
    LedgerLockedError,
    MapFullError,
    NotALedgerError,
    SchemaVersionError,
    WriteFailedError,
    open_ledger,
)
from ledger._format import CODEC, CODEC_VERSION, LedgerMeta
from ledger.lmdb._env import FORMAT, SCHEMA_VERSION
from ledger.lmdb._seal import decode_record, seal
from streams._unwrap import single_error

REPO = Path(__file__).resolve().parents[2]


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes (a missing path is empty)."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {
        str(p.relative_to(path)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(path.rglob("*"))
    }


@contextmanager
def raw_env(path: Path) -> Iterator[lmdb.Environment]:
    env = lmdb.open(str(path), max_dbs=16)
    try:
        yield env
    finally:
        env.close()


def make_ledger(path: Path) -> None:
    LedgerEnv.open(path).close()


def rewrite_schema(path: Path, meta: LedgerMeta) -> None:
    with raw_env(path) as env:
        db = env.open_db(b"meta", create=False)
        with env.begin(write=True, db=db) as txn:
            txn.put(b"schema", seal("meta", b"schema", msgspec.msgpack.encode(meta)))


def spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


# -- paths that are not ledgers ----------------------------------------------------------


def test_a_file_is_not_a_ledger_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello")
    with pytest.raises(NotALedgerError, match="is a file"):
        LedgerEnv.open(path)
    assert snapshot(tmp_path) == {"notes.txt": b"hello"}


def test_a_directory_with_other_files_is_not_a_ledger_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "project"
    path.mkdir()
    (path / "README").write_text("mine")
    before = snapshot(path)
    with pytest.raises(NotALedgerError, match="other files"):
        LedgerEnv.open(path)
    assert snapshot(path) == before


def test_someone_elses_lmdb_environment_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "other"
    with raw_env(path) as env, env.begin(write=True) as txn:
        txn.put(b"their", b"data")
    before = snapshot(path)
    with pytest.raises(NotALedgerError, match="not a streamledger ledger"):
        LedgerEnv.open(path)
    assert snapshot(path) == before


def test_an_lmdb_environment_with_a_meta_database_of_another_format_is_not_a_ledger(
    tmp_path: Path,
) -> None:
    path = tmp_path / "l"
    make_ledger(path)
    rewrite_schema(path, LedgerMeta("otherstore", SCHEMA_VERSION, CODEC, CODEC_VERSION))
    before = snapshot(path)
    with pytest.raises(NotALedgerError, match="otherstore"):
        LedgerEnv.open(path)
    assert snapshot(path) == before


def test_a_garbage_data_file_is_not_a_ledger_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "l"
    path.mkdir()
    (path / "data.mdb").write_bytes(bytes(range(256)) * 64)
    before = snapshot(path)
    with pytest.raises(NotALedgerError, match="not an LMDB file"):
        LedgerEnv.open(path)
    assert snapshot(path) == before


def test_a_missing_path_is_not_created_without_create(tmp_path: Path) -> None:
    with pytest.raises(NotALedgerError):
        LedgerEnv.open(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()


# -- versions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta",
    [
        LedgerMeta(FORMAT, SCHEMA_VERSION + 1, CODEC, CODEC_VERSION),
        LedgerMeta(FORMAT, SCHEMA_VERSION, "json", CODEC_VERSION),
        LedgerMeta(FORMAT, SCHEMA_VERSION, CODEC, CODEC_VERSION + 1),
    ],
    ids=["schema", "codec", "codec-version"],
)
def test_a_ledger_of_another_version_is_refused_and_left_unchanged(tmp_path: Path, meta: LedgerMeta) -> None:
    path = tmp_path / "l"
    make_ledger(path)
    rewrite_schema(path, meta)
    before = snapshot(path)
    with pytest.raises(SchemaVersionError, match="matching streamledger release"):
        LedgerEnv.open(path)
    assert snapshot(path) == before


# -- ownership -------------------------------------------------------------------------------


@contextmanager
def owned_by_another_process(path: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process that opens the ledger and holds it until the block ends (then it exits 0)."""
    with spawn(
        f"""
        import sys
        from ledger import LedgerEnv
        env = LedgerEnv.open({str(path)!r})
        print("ready", flush=True)
        sys.stdin.read()
        env.close()
        """
    ) as owner:
        assert owner.stdin is not None and owner.stdout is not None
        assert owner.stdout.readline() == "ready\n"
        yield owner
        owner.stdin.close()
        assert owner.wait() == 0


def test_a_second_process_on_the_same_ledger_gets_ledger_locked(tmp_path: Path) -> None:
    path = tmp_path / "l"
    with (
        owned_by_another_process(path) as owner,
        pytest.raises(LedgerLockedError, match=rf"owned by process {owner.pid} on "),
    ):
        LedgerEnv.open(path)
    LedgerEnv.open(path).close()  # free again once the owner is gone


def test_deleting_the_ledgers_other_files_does_not_let_a_second_process_in(tmp_path: Path) -> None:
    path = tmp_path / "l"
    with owned_by_another_process(path):
        (path / "owner.lock").touch()  # a lock file of an older build, then every file but the data
        for other in path.iterdir():
            if other.name != "data.mdb":
                other.unlink()
        with pytest.raises(LedgerLockedError, match="owned by another process"):  # its file went too
            LedgerEnv.open(path)


def test_the_same_process_opening_a_ledger_twice_gets_ledger_in_use(tmp_path: Path) -> None:
    env = LedgerEnv.open(tmp_path / "l")
    try:
        with pytest.raises(LedgerInUseError, match="already open in this process"):
            LedgerEnv.open(tmp_path / "l")
        with pytest.raises(LedgerInUseError):
            LedgerEnv.open(tmp_path / "l" / ".." / "l")
    finally:
        env.close()
    LedgerEnv.open(tmp_path / "l").close()


# -- writes ----------------------------------------------------------------------------------


async def test_writes_larger_than_the_map_grow_it(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    big = os.urandom(1 << 20)
    async with open_ledger(tmp_path / "l", map_size=1 << 16) as ledger:
        db = ledger.backend.env.db("nodes")
        initial = ledger.backend.env.info()["map_size"]

        def put(txn: lmdb.Transaction) -> None:
            txn.put(b"big", big, db=db)

        await ledger.backend.env.write(put)
        assert ledger.backend.env.info()["map_size"] > initial
        with ledger.backend.env.read() as txn:
            assert txn.get(b"big", db=db) == big
    growths = [
        s.attributes["streamledger.batch.map_growths"]
        for s in spans.get_finished_spans()
        if s.name == "streamledger.commit_batch" and s.attributes is not None
    ]
    assert growths and isinstance(growths[0], int) and growths[0] >= 1


async def test_a_write_over_the_map_limit_fails_clearly_and_writes_nothing(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l", map_size=1 << 16, max_map_size=1 << 17) as ledger:
        db = ledger.backend.env.db("nodes")

        def put_big(txn: lmdb.Transaction) -> None:
            txn.put(b"big", os.urandom(1 << 20), db=db)

        def put_small(txn: lmdb.Transaction) -> None:
            txn.put(b"small", b"v", db=db)

        big, small = ledger.backend.env.submit(put_big), ledger.backend.env.submit(put_small)
        with pytest.raises(MapFullError, match="max_map_size"):
            await big.wait()
        await small.wait()  # the write that fits still commits
        with ledger.backend.env.read() as txn:
            assert txn.get(b"big", db=db) is None
            assert txn.get(b"small", db=db) == b"v"
        await ledger.backend.env.write(put_small)  # and the committer goes on serving


async def test_a_raising_write_rolls_back_alone_while_its_batch_commits(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    class Refused(Exception):
        pass

    async with open_ledger(tmp_path / "l") as ledger:
        db = ledger.backend.env.db("nodes")

        def put(key: bytes, *, fail: bool = False) -> Callable[[lmdb.Transaction], bytes]:
            def fn(txn: lmdb.Transaction) -> bytes:
                txn.put(key, b"v", db=db)
                if fail:
                    raise Refused(key.decode())
                return key

            return fn

        tickets = [
            ledger.backend.env.submit(put(b"a")),
            ledger.backend.env.submit(put(b"b", fail=True)),
            ledger.backend.env.submit(put(b"c")),
        ]
        assert await tickets[0].wait() == b"a"
        with pytest.raises(Refused):
            await tickets[1].wait()
        assert await tickets[2].wait() == b"c"
        with ledger.backend.env.read() as txn:
            assert [txn.get(k, db=db) for k in (b"a", b"b", b"c")] == [b"v", None, b"v"]
    batches = [s for s in spans.get_finished_spans() if s.name == "streamledger.commit_batch"]
    assert [dict(s.attributes or {}) for s in batches] == [
        {
            "streamledger.batch.writes": 3,
            "streamledger.batch.failed": 1,
            "streamledger.batch.map_growths": 0,
        }
    ]


# -- corruption ------------------------------------------------------------------------------


class Sample(msgspec.Struct, frozen=True):
    name: str
    count: int


def flip_last_byte(path: Path, db_name: bytes, key: bytes) -> None:
    with raw_env(path) as env:
        db = env.open_db(db_name, create=False)
        with env.begin(write=True, db=db) as txn:
            stored = txn.get(key)
            assert stored is not None
            value = bytearray(stored)
            value[-1] ^= 0x01
            txn.put(key, bytes(value))


async def test_a_corrupted_record_refuses_the_ledger_when_it_opens_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "l"
    async with open_ledger(path) as ledger:
        db = ledger.backend.env.db("graph_runs")

        def put(txn: lmdb.Transaction) -> None:
            txn.put(b"run/rec", seal("graph_runs", b"run/rec", msgspec.msgpack.encode(Sample("x", 3))), db=db)

        await ledger.backend.env.write(put)
    flip_last_byte(path, b"graph_runs", b"run/rec")
    before = (path / "data.mdb").read_bytes()
    with (
        lmdb.open(str(path), max_dbs=16, readonly=True, lock=False) as raw_env,
        raw_env.begin(db=raw_env.open_db(b"graph_runs", create=False)) as txn,
    ):
        raw = txn.get(b"run/rec")
    assert raw is not None
    with pytest.raises(CorruptRecordError, match="fails its checksum"):
        decode_record(bytes(raw), msgspec.msgpack.Decoder(Sample), db="graph_runs", key=b"run/rec")
    for _ in range(2):
        with pytest.raises(CorruptRecordError, match="fails its checksum"):
            async with open_ledger(path):
                pass
        with pytest.raises(CorruptRecordError, match="fails its checksum"):
            LedgerEnv.open_readonly(path)
    assert (path / "data.mdb").read_bytes() == before


def test_a_corrupted_schema_record_refuses_the_ledger_and_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "l"
    make_ledger(path)
    flip_last_byte(path, b"meta", b"schema")
    before = snapshot(path)
    with pytest.raises(CorruptRecordError, match="'meta'"):
        LedgerEnv.open(path)
    assert snapshot(path) == before


# -- stale readers ---------------------------------------------------------------------------


def test_opening_clears_readers_left_by_killed_processes(tmp_path: Path) -> None:
    path = tmp_path / "l"
    make_ledger(path)
    # A process that keeps the environment open, so LMDB does not simply
    # reset its reader table on the next open, and lists the readers on request.
    holder_code = f"""
        import sys, lmdb
        env = lmdb.open({str(path)!r}, readonly=True, max_dbs=16)
        print("ready", flush=True)
        for line in sys.stdin:
            print(env.readers().replace("\\n", " "), flush=True)
        env.close()
        """
    reader_code = f"""
        import sys, lmdb
        env = lmdb.open({str(path)!r}, readonly=True, max_dbs=16)
        txn = env.begin()
        print("ready", flush=True)
        sys.stdin.read()
        """
    with spawn(holder_code) as holder, spawn(reader_code) as reader:
        assert holder.stdin is not None and holder.stdout is not None
        assert reader.stdout is not None
        assert holder.stdout.readline() == "ready\n"
        assert reader.stdout.readline() == "ready\n"
        reader.kill()
        reader.wait()

        def reader_pids() -> list[str]:
            assert holder.stdin is not None and holder.stdout is not None
            holder.stdin.write("list\n")
            holder.stdin.flush()
            fields = holder.stdout.readline().split()
            # "pid thread txnid", then a (pid, thread, txnid) triple per reader slot
            return fields[3::3]

        assert str(reader.pid) in reader_pids()
        env = LedgerEnv.open(path)
        try:
            assert str(reader.pid) not in reader_pids()
            assert env.reader_check() == 0
        finally:
            env.close()
        holder.stdin.close()
        assert holder.wait() == 0


async def test_a_ledger_can_be_read_beside_the_process_that_owns_it(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    async with open_ledger(path) as ledger:
        db = ledger.backend.env.db("messages")

        def put(txn: Any) -> None:
            txn.put(b"k", b"v", db=db)

        await ledger.backend.env.write(put)
        reader = await anyio.run_process(
            [
                sys.executable,
                "-c",
                "import sys; from ledger import LedgerEnv\n"
                "env = LedgerEnv.open_readonly(sys.argv[1])\n"
                "with env.read() as txn: print(txn.get(b'k', db=env.db('messages')).decode())\n"
                "try:\n    env.submit(lambda txn: None)\nexcept Exception as e: print(type(e).__name__)\n"
                "env.close()",
                str(path),
            ],
            check=False,
        )
        assert reader.stdout.decode().split() == ["v", "LedgerClosedError"], reader.stderr.decode()
        await ledger.backend.env.write(put)


def test_read_only_open_of_a_path_that_is_not_a_ledger_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotALedgerError):
        LedgerEnv.open_readonly(tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()


@pytest.mark.parametrize("stage", ["owner_lock", "lmdb_files"])
def test_a_creation_killed_half_way_is_finished_by_the_next_open(tmp_path: Path, stage: str) -> None:
    path = tmp_path / "ledger"
    path.mkdir()
    (path / "owner.lock").touch()
    if stage == "lmdb_files":
        lmdb.open(str(path), max_dbs=4).close()  # LMDB made its files, no schema yet
    env = LedgerEnv.open(path)
    env.close()
    LedgerEnv.open(path).close()


def test_an_lmdb_environment_holding_data_is_still_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "other"
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"theirs", b"x")
    env.close()
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(NotALedgerError):
        LedgerEnv.open(path)
    assert (path / "data.mdb").read_bytes() == before


async def test_writes_queued_behind_a_failed_batch_are_answered(tmp_path: Path) -> None:
    env = LedgerEnv.open(tmp_path / "l")
    gate = threading.Event()

    def failing(writes: int) -> None:
        gate.wait(10)  # hold the first batch until the second write is queued
        raise WriteFailedError("the disk is gone")

    try:
        with pytest.raises(WriteFailedError, match="the disk is gone"), single_error():
            async with anyio.create_task_group() as tg:
                await tg.start(partial(env.serve, before_commit=failing))
                first = env.submit(lambda txn: None)
                await anyio.wait_all_tasks_blocked()
                second = env.submit(lambda txn: None)
                gate.set()
                with anyio.fail_after(10):
                    with pytest.raises(WriteFailedError, match="the disk is gone"):
                        await first.wait()
                    with pytest.raises(WriteFailedError, match="stopped serving writes after a failed batch"):
                        await second.wait()
        with pytest.raises(LedgerClosedError, match="not serving writes"):
            env.submit(lambda txn: None)  # the committer is gone with its serving period
    finally:
        env.close()


def test_a_forked_child_does_not_keep_the_ledger_locked(tmp_path: Path) -> None:
    env = LedgerEnv.open(tmp_path / "l")
    release, hold = os.pipe()
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker process that never touches the ledger, alive until told
        os.close(hold)
        os.write(ready_write, b"r")  # the fork handlers have run
        os.read(release, 1)
        os._exit(0)
    os.close(release)
    os.close(ready_write)
    try:
        assert os.read(ready_read, 1) == b"r"
        env.close()
        LedgerEnv.open(tmp_path / "l").close()  # the owner opens its ledger again
    finally:
        os.write(hold, b"x")
        os.close(hold)
        os.close(ready_read)
        os.waitpid(pid, 0)
