"""A ledger missing a record, or holding one under another key or database name, is refused when it opens.

Each test damages one thing a lookup would read as "never written", then
opens the ledger the ways a user does (for writing, read-only, the CLI)
and checks the refusal is typed and that ``data.mdb`` is byte for byte what
it was: the damage is never laundered into a ledger ``check`` calls sound.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import lmdb
import msgspec
import pytest

from ledger import (
    CorruptRecordError,
    DamagedLedgerError,
    LedgerEnv,
    MissingRecordError,
    inspect_ledger,
    open_ledger,
)
from ledger._format import CODEC, CODEC_VERSION, LedgerMeta
from ledger.lmdb import _keyed_log
from ledger.lmdb._check import check_ledger
from ledger.lmdb._demo import run_demo
from ledger.lmdb._env import FORMAT, SCHEMA_VERSION
from ledger.lmdb._files import key_bytes
from ledger.lmdb._layout import (
    COUNTER_KEY,
    NODE_RECORD_PREFIX,
    NODE_RUN_PREFIX,
    group_key,
    keyed_prefix,
    keyed_prefix_of,
    message_key,
    run_key,
)
from ledger.lmdb._manifest import MANIFESTED, Manifest, key_digest, manifest_key
from ledger.lmdb._seal import seal
from ledger.lmdb._streams import LmdbStreamHooks
from streams import Key, Stream, StreamRef, open_scope
from streams.store import (
    KeyedRange,
    KeyedRead,
    KeyedWrite,
    MessageCommit,
    MessageFail,
    MessageOpen,
    MessageRef,
)

from ..ledger_command import ledger_command
from .graphs.graphs import Boom, Calls, Log, durable, three_steps

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = Key("numbers", Stream[int])


@contextmanager
def raw(path: Path, name: bytes) -> Iterator[Any]:
    """A write transaction on one database of the ledger, as a damaging hand would open it."""
    env = lmdb.open(str(path), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(name, create=False)) as txn:
            yield txn
    finally:
        env.close()


def keys(path: Path, name: bytes) -> list[bytes]:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(name, create=False)) as txn:
            return [bytes(k) for k, _ in txn.cursor()]
    finally:
        env.close()


async def a_failed_message(path: Path) -> None:
    """Stream s/src/numbers: 300 messages, group g, message 1 failed once (its budget record)."""
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        for n in range(1, 301):
            await stream.writer().send(n)
        await stream.writer().flush()
        ref = MessageRef(stream.ref, "g", stream.generation, 1)
        await ledger.streams.open_message(MessageOpen(ref, node="h", limit=3))
        await ledger.streams.fail_message(MessageFail(ref, node="h", limit=3, index=0))


async def a_graph_run(path: Path) -> None:
    async with open_ledger(path) as ledger:
        with contextlib.suppress(Boom):
            await durable(three_steps(), ledger).run(
                "r", state=Log(), inputs=5, deps=Calls(fail_at={"three"})
            )


def assert_refused(path: Path, error: type[Exception], match: str) -> None:
    """Refused by every way in, typed, and nothing written."""
    before = (path / "data.mdb").read_bytes()

    async def write_open() -> None:
        async with open_ledger(path):
            pass

    with pytest.raises(error, match=match):
        anyio.run(write_open)
    with pytest.raises(error, match=match):
        anyio.run(run_demo, path, 600)
    with pytest.raises(error, match=match):
        LedgerEnv.open_readonly(path)
    for command in (["inspect", str(path)], ["demo", str(path), "--messages", "600"]):
        done = ledger_command(*command)
        assert done.returncode == 4, (command, done.stdout, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: ") and ("damaged" in line or "checksum" in line), line
    assert (path / "data.mdb").read_bytes() == before
    env = LedgerEnv.open_readonly(path, verify=False)  # check still lists the damage
    try:
        assert not check_ledger(env).sound
    finally:
        env.close()


def test_a_deleted_group_frontier_refuses_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    with raw(path, b"groups") as txn:
        assert txn.delete(group_key(1, "billing"))
    assert_refused(path, MissingRecordError, "lists group 'billing', whose frontier is missing")


def test_a_group_acknowledged_past_the_last_append_refuses_the_ledger(tmp_path: Path) -> None:
    """A frontier sealed as it should be, but ahead of its stream: the rule PostgreSQL's check had alone."""
    from streams import GroupFrontier

    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    key = group_key(1, "billing")
    with raw(path, b"groups") as txn:
        frontier = msgspec.msgpack.decode(bytes(txn.get(key))[4:], type=GroupFrontier)
        ahead = msgspec.structs.replace(frontier, acked_through=601)
        txn.put(key, seal("groups", key, msgspec.msgpack.encode(ahead)))
    assert_refused(path, CorruptRecordError, "acknowledged through 601, past the 600 messages appended")


def test_a_renamed_streams_database_refuses_the_ledger_and_no_new_one_is_created(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    (name,) = [k for k in key_bytes(path) if k.database == "(main)" and k.size == len(b"streams")]
    data = bytearray((path / "data.mdb").read_bytes())
    assert data[name.offset : name.offset + name.size] == b"streams"
    with (path / "data.mdb").open("r+b") as f:  # "streams" becomes "strgams": one bit of its name
        f.seek(name.offset + 3)
        f.write(bytes([data[name.offset + 3] ^ 0x02]))
    assert_refused(path, MissingRecordError, "main database holds b'strgams', which is no database")


def test_a_run_of_messages_moved_to_another_key_refuses_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    chunks = [k for k in keys(path, b"messages") if k.startswith(message_key(1, 0)[:8])]
    with raw(path, b"messages") as txn:  # as a damaged stream id in its key would: under stream 9
        value = txn.get(chunks[-1])
        assert txn.delete(chunks[-1])
        txn.put(message_key(9, 1), value)
    assert_refused(path, MissingRecordError, r"should hold messages 1 to 300 .* it holds")


def test_a_deleted_budget_record_refuses_the_ledger_not_a_fresh_budget(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    (budget,) = keys(path, b"attempts")
    with raw(path, b"attempts") as txn:
        assert txn.delete(budget)
    assert_refused(path, MissingRecordError, "database 'attempts' holds 0 keys, its manifest says 1")


def test_a_budget_record_added_by_hand_refuses_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    (budget,) = keys(path, b"attempts")
    with raw(path, b"attempts") as txn:
        other = budget[:-1] + b"x"
        txn.put(other, seal("attempts", other, bytes(txn.get(budget) or b"")[4:]))
    assert_refused(path, MissingRecordError, "database 'attempts' holds 2 keys, its manifest says 1")


@pytest.mark.parametrize("prefix", [NODE_RECORD_PREFIX, NODE_RUN_PREFIX], ids=["node record", "run record"])
def test_a_deleted_node_or_run_record_refuses_the_ledger(tmp_path: Path, prefix: bytes) -> None:
    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    found = [k for k in keys(path, b"nodes") if k.startswith(prefix)]
    with raw(path, b"nodes") as txn:
        assert txn.delete(found[0])
    assert_refused(path, MissingRecordError, "'nodes'|is committed, but its record is missing")


def test_a_deleted_graph_run_record_refuses_the_ledger_not_a_new_run(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_graph_run, path)
    with raw(path, b"graph_runs") as txn:
        assert txn.delete(run_key("r"))
    assert_refused(path, MissingRecordError, "has a checkpoint but no run record")


def test_a_deleted_stream_counter_refuses_the_ledger_not_a_reused_id(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    with raw(path, b"streams") as txn:
        assert txn.delete(COUNTER_KEY)
    assert_refused(path, MissingRecordError, r"stream id 1 is above the last allocated, 0")


def test_a_deleted_manifest_refuses_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_graph_run, path)
    with raw(path, b"meta") as txn:
        assert txn.delete(manifest_key("graph_runs"))
    assert_refused(path, MissingRecordError, "the manifest of database 'graph_runs' is missing")


def as_schema(path: Path, version: int) -> None:
    """The ledger as an older release wrote it: schema 5 has no ``keyed_log`` database, 4 no ``keyed``
    either, 3 no manifests either."""
    env = lmdb.open(str(path), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            gone = ("keyed_log",) if version == 5 else ("keyed", "keyed_log")
            for name in gone:
                handle = env.open_db(name.encode(), txn=txn, create=False)
                assert txn.stat(handle)["entries"] == 0  # an older release kept none of it
                txn.drop(handle, delete=True)
            meta = env.open_db(b"meta", txn=txn, create=False)
            for name in MANIFESTED if version < 4 else gone:
                assert txn.delete(manifest_key(name), db=meta)
            record = LedgerMeta(FORMAT, version, CODEC, CODEC_VERSION)
            txn.put(b"schema", seal("meta", b"schema", msgspec.msgpack.encode(record)), db=meta)
    finally:
        env.close()


def as_schema_3(path: Path) -> None:
    """The ledger as release 0.x wrote it: schema 3, no manifests."""
    as_schema(path, 3)


def schema_of(path: Path) -> tuple[int, list[bytes]]:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            meta = msgspec.msgpack.decode(bytes(txn.get(b"schema") or b"")[4:], type=LedgerMeta)
            return meta.schema_version, [bytes(k) for k, _ in txn.cursor()]
    finally:
        env.close()


def test_a_schema_3_ledger_is_read_as_it_is_and_gets_its_manifests_on_its_first_write_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    anyio.run(a_graph_run, path)
    as_schema_3(path)
    before = (path / "data.mdb").read_bytes()
    env = LedgerEnv.open_readonly(path)  # read: verified but for the manifests, and unchanged
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    assert (path / "data.mdb").read_bytes() == before
    assert schema_of(path) == (3, [b"schema"])
    LedgerEnv.open(path).close()  # the first write open computes them, with schema 6, in one commit
    version, meta_keys = schema_of(path)
    assert version == SCHEMA_VERSION == 6
    assert meta_keys == sorted([b"schema", *(manifest_key(db) for db in MANIFESTED)])
    assert b"keyed" in database_names(path) and b"keyed_log" in database_names(path)
    env = LedgerEnv.open_readonly(path)
    try:
        assert inspect_ledger(env) == report and check_ledger(env).sound
    finally:
        env.close()
    with raw(path, b"attempts") as txn:  # from now on, a budget lost is found
        (budget,) = [bytes(k) for k, _ in txn.cursor()]
        txn.delete(budget)
    with pytest.raises(MissingRecordError, match="'attempts' holds 0 keys"):
        LedgerEnv.open_readonly(path)


def database_names(path: Path) -> list[bytes]:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [bytes(k) for k, _ in txn.cursor()]
    finally:
        env.close()


def last_transaction(path: Path) -> int:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        return int(env.info()["last_txnid"])
    finally:
        env.close()


def test_a_schema_4_ledger_reads_without_keyed_state_then_upgrades_in_one_commit_and_keeps_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    as_schema(path, 4)
    ref = StreamRef("s", "src", "numbers")
    before = (path / "data.mdb").read_bytes()
    env = LedgerEnv.open_readonly(path)  # read as it is: no keyed database, so no keyed state
    try:
        assert not env.has_db("keyed") and check_ledger(env).sound
        hooks = LmdbStreamHooks(env)
        assert anyio.run(hooks.list_keyed, KeyedRange(ref, "g")) == ()
        assert anyio.run(hooks.read_keyed, KeyedRead(ref, "g", (b"x",))) == (None,)
    finally:
        env.close()
    assert (path / "data.mdb").read_bytes() == before
    assert b"keyed" not in database_names(path) and schema_of(path)[0] == 4
    transaction = last_transaction(path)
    LedgerEnv.open(path).close()  # the first write open: the keyed databases and schema 6, one commit
    assert last_transaction(path) == transaction + 1
    version, meta_keys = schema_of(path)
    assert version == SCHEMA_VERSION
    assert manifest_key("keyed") in meta_keys and manifest_key("keyed_log") in meta_keys
    assert b"keyed" in database_names(path) and b"keyed_log" in database_names(path)

    async def resume_and_keep_state() -> None:
        async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",), resumable=True)
            assert (await stream.reader("g").receive()).value == 1  # the failed message is pending still
            message = MessageRef(stream.ref, "g", stream.generation, 1)
            writes = (KeyedWrite(b"x", b"one"), KeyedWrite(b"y", b"two"))
            await ledger.streams.commit([MessageCommit(message, node="h", keyed=writes)])
        async with open_ledger(path) as ledger:
            assert await ledger.backend.streams.read_keyed(KeyedRead(ref, "g", (b"x", b"y", b"z"))) == (
                b"one",
                b"two",
                None,
            )

    anyio.run(resume_and_keep_state)
    env = LedgerEnv.open_readonly(path)
    try:
        assert check_ledger(env).sound
    finally:
        env.close()
    assert len(keys(path, b"keyed_log")) == 1  # the commit's two keys, one record of the group's log


#: A group long enough that its keyed keys digest it.
LONG_GROUP = "l" * 250


async def a_keyed_state(path: Path) -> None:
    """Stream s/src/numbers, groups g and a long one, each with keys a and b confirmed with message 1."""
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g", LONG_GROUP))
        for n in range(1, 4):
            await stream.writer().send(n)
        await stream.writer().flush()
        writes = (KeyedWrite(b"a", b"1"), KeyedWrite(b"b", b"2"))
        await ledger.streams.commit(
            [
                MessageCommit(MessageRef(stream.ref, g, stream.generation, 1), keyed=writes)
                for g in ("g", LONG_GROUP)
            ]
        )


@pytest.mark.usefixtures("keyed_in_table")
def test_a_deleted_keyed_record_refuses_the_ledger_not_a_key_never_set(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_keyed_state, path)
    assert keys(path, b"keyed") == sorted(
        keyed_prefix(1, group) + key for group in ("g", LONG_GROUP) for key in (b"a", b"b")
    )
    with raw(path, b"keyed") as txn:
        assert txn.delete(keyed_prefix(1, LONG_GROUP) + b"b")
    assert_refused(path, MissingRecordError, "database 'keyed' holds 3 keys, its manifest says 4")


@pytest.mark.usefixtures("keyed_in_table")
def test_a_keyed_value_damaged_or_moved_to_another_key_fails_its_checksum(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_keyed_state, path)
    key = keyed_prefix(1, "g") + b"a"
    with raw(path, b"keyed") as txn:  # under the other key of the group: sealed for "a", stored as "c"
        value = bytes(txn.get(key))
        assert txn.delete(key)
        txn.put(keyed_prefix(1, "g") + b"c", value)
    assert_refused(path, CorruptRecordError, "in database 'keyed' of the ledger fails its checksum")


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (keyed_prefix(1, "gone") + b"a", "of stream s/src/numbers belongs to no group the stream lists"),
        (keyed_prefix(9, "g") + b"a", "belongs to no stream"),
        (b"\x00" * 8 + b"\x00\x00\x01\x00" + b"g", "in database 'keyed' has no known layout"),
        (keyed_prefix(1, "g") + b"k" * 257, "in database 'keyed' has no known layout"),
    ],
    ids=["removed group", "no stream", "group past its key", "key too long"],
)
@pytest.mark.usefixtures("keyed_in_table")
def test_a_keyed_record_of_no_group_the_stream_lists_refuses_the_ledger(
    tmp_path: Path, key: bytes, problem: str
) -> None:
    """Sealed for where it sits and counted by the manifest: only whose it is gives it away."""
    path = tmp_path / "l"
    anyio.run(a_keyed_state, path)
    put_counted(path, "keyed", key, b"1")
    assert_refused(path, MissingRecordError, problem)


def put_counted(path: Path, name: str, key: bytes, body: bytes) -> None:
    """Put a sealed record into database ``name`` behind the ledger's back, its manifest counting it."""
    env = lmdb.open(str(path), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, seal(name, key, body), db=env.open_db(name.encode(), txn=txn, create=False))
            meta = env.open_db(b"meta", txn=txn, create=False)
            found = msgspec.msgpack.decode(
                bytes(txn.get(manifest_key(name), db=meta) or b"")[4:], type=Manifest
            )
            digest = int.from_bytes(found.digest, "big") ^ key_digest(key)
            manifest = msgspec.msgpack.encode(Manifest(found.keys + 1, digest.to_bytes(16, "big")))
            txn.put(manifest_key(name), seal("meta", manifest_key(name), manifest), db=meta)
    finally:
        env.close()


def test_a_deleted_keyed_log_record_refuses_the_ledger_not_writes_never_made(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_keyed_state, path)
    records = keys(path, b"keyed_log")
    assert [keyed_prefix_of(k[:-16]) for k in records] == sorted(
        keyed_prefix(1, group) for group in ("g", LONG_GROUP)
    )  # one record per group: its prefix, sequence number 0, eight random bytes
    assert keys(path, b"keyed") == []
    with raw(path, b"keyed_log") as txn:
        assert txn.delete(records[0])
    assert_refused(path, MissingRecordError, "database 'keyed_log' holds 1 keys, its manifest says 2")


def test_a_keyed_log_record_moved_to_another_key_fails_its_checksum(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_keyed_state, path)
    record = next(k for k in keys(path, b"keyed_log") if k.startswith(keyed_prefix(1, "g")))
    with raw(path, b"keyed_log") as txn:  # the same group, another sequence number
        value = bytes(txn.get(record))
        assert txn.delete(record)
        txn.put(keyed_prefix(1, "g") + (7).to_bytes(8, "big") + record[-8:], value)
    assert_refused(path, CorruptRecordError, "in database 'keyed_log' of the ledger fails its checksum")


@pytest.mark.parametrize(
    ("key", "pairs", "problem"),
    [
        (
            keyed_prefix(1, "gone") + bytes(16),
            [(b"a", b"1")],
            "of stream s/src/numbers belongs to no group the stream lists",
        ),
        (keyed_prefix(9, "g") + bytes(16), [(b"a", b"1")], "belongs to no stream"),
        (keyed_prefix(1, "g") + bytes(15), [(b"a", b"1")], "in database 'keyed_log' has no known layout"),
        (keyed_prefix(1, "g") + bytes(16), [(b"b", b"1"), (b"a", None)], "holds its keys out of order"),
    ],
    ids=["removed group", "no stream", "short key", "keys out of order"],
)
def test_a_keyed_log_record_of_no_group_the_stream_lists_or_out_of_order_refuses_the_ledger(
    tmp_path: Path, key: bytes, pairs: list[tuple[bytes, bytes | None]], problem: str
) -> None:
    path = tmp_path / "l"
    anyio.run(a_keyed_state, path)
    put_counted(path, "keyed_log", key, msgspec.msgpack.encode(pairs))
    assert_refused(path, MissingRecordError, problem)


def test_a_schema_5_ledger_reads_its_keyed_table_then_upgrades_in_one_commit_and_writes_to_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "l"
    with monkeypatch.context() as patched:  # schema 5 kept keyed state in the table alone
        patched.setattr(_keyed_log, "MERGE_KEYS", 1)
        anyio.run(a_keyed_state, path)
    with raw(path, b"keyed_log") as txn:
        assert txn.stat()["entries"] == 0
    as_schema(path, 5)
    ref = StreamRef("s", "src", "numbers")
    before = (path / "data.mdb").read_bytes()
    env = LedgerEnv.open_readonly(path)  # read as it is: the table alone
    try:
        assert not env.has_db("keyed_log") and check_ledger(env).sound
        hooks = LmdbStreamHooks(env)
        assert anyio.run(hooks.read_keyed, KeyedRead(ref, "g", (b"a", b"b", b"c"))) == (b"1", b"2", None)
        assert [e.key for e in anyio.run(hooks.list_keyed, KeyedRange(ref, "g"))] == [b"a", b"b"]
    finally:
        env.close()
    assert (path / "data.mdb").read_bytes() == before
    transaction = last_transaction(path)
    LedgerEnv.open(path).close()  # the first write open: keyed_log, its manifest and schema 6, one commit
    assert last_transaction(path) == transaction + 1
    version, meta_keys = schema_of(path)
    assert version == SCHEMA_VERSION and manifest_key("keyed_log") in meta_keys

    async def overwrite() -> None:
        async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g", LONG_GROUP), resumable=True)
            message = MessageRef(ref, "g", stream.generation, 2)
            writes = (KeyedWrite(b"a", None), KeyedWrite(b"c", b"3"))
            await ledger.streams.commit([MessageCommit(message, node="h", keyed=writes)])
            found = await ledger.backend.streams.read_keyed(KeyedRead(ref, "g", (b"a", b"b", b"c")))
            assert found == (None, b"2", b"3")  # the log over the table: a removed, b kept, c new
            listed = await ledger.backend.streams.list_keyed(KeyedRange(ref, "g"))
            assert [(e.key, e.value) for e in listed] == [(b"b", b"2"), (b"c", b"3")]

    anyio.run(overwrite)
    assert len(keys(path, b"keyed_log")) == 1 and len(keys(path, b"keyed")) == 4
    env = LedgerEnv.open_readonly(path)
    try:
        assert check_ledger(env).sound
    finally:
        env.close()


def test_a_damaged_schema_3_ledger_is_refused_and_gets_no_manifests(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    as_schema_3(path)
    with raw(path, b"groups") as txn:
        assert txn.delete(group_key(1, "billing"))
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(MissingRecordError, match="whose frontier is missing"):
        LedgerEnv.open(path)
    assert (path / "data.mdb").read_bytes() == before


def test_a_flipped_record_key_is_refused_with_the_checksum_error(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(run_demo, path, 600)
    leaf: Callable[[Any], bool] = lambda k: k.database == "groups" and k.page == "leaf"  # noqa: E731
    target = next(k for k in key_bytes(path) if leaf(k))
    data = (path / "data.mdb").read_bytes()
    with (path / "data.mdb").open("r+b") as f:
        f.seek(target.offset + target.size - 1)
        f.write(bytes([data[target.offset + target.size - 1] ^ 0x01]))
    assert_refused(path, CorruptRecordError, "fails its checksum|damaged")


def test_every_manifest_deleted_refuses_the_ledger_and_check_names_each(tmp_path: Path) -> None:
    path = tmp_path / "l"
    anyio.run(a_graph_run, path)
    with raw(path, b"meta") as txn:
        for db in MANIFESTED:
            assert txn.delete(manifest_key(db))
    assert_refused(path, MissingRecordError, "the manifest of database 'attempts' is missing")
    env = LedgerEnv.open_readonly(path, verify=False)
    try:
        problems = check_ledger(env).problems
    finally:
        env.close()
    assert problems == [f"the manifest of database {db!r} is missing" for db in MANIFESTED]


def test_a_tree_page_whose_node_count_was_damaged_to_none_is_refused_never_a_signal(tmp_path: Path) -> None:
    # found by python -m fuzz.bitflips: LMDB reads "node -1" of an empty leaf, past the file: SIGBUS
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    (chunk, *_) = [k for k in key_bytes(path) if k.database == "messages" and k.page == "leaf"]
    page = chunk.offset // 4096 * 4096
    with (path / "data.mdb").open("r+b") as f:
        f.seek(page + 12)  # mp_lower: where the node pointers end; 16 is right after the header
        f.write((16).to_bytes(2, sys.byteorder))
    before = (path / "data.mdb").read_bytes()
    for command in (["inspect", str(path)], ["demo", str(path), "--messages", "600"]):
        done = ledger_command(*command)
        assert done.returncode == 4 and "is a tree page without nodes" in done.stderr, done
    assert (path / "data.mdb").read_bytes() == before


def test_a_key_damaged_out_of_its_pages_order_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    # found by the bit-flip test: message 1's key damaged to sort after message 2's, on the same page;
    # LMDB's searches then miss it or find it where another belongs, and a session that wrote first
    # met it only at its second stream's open
    path = tmp_path / "l"
    anyio.run(a_failed_message, path)
    data = (path / "data.mdb").read_bytes()
    leaves = [k for k in key_bytes(path) if k.database == "messages" and k.page == "leaf"]
    first, second = next(
        (a, b)
        for a, b in itertools.pairwise(leaves)
        if a.offset // 4096 == b.offset // 4096  # one page, one stream
        and data[a.offset : a.offset + 8] == data[b.offset : b.offset + 8]
    )
    assert data[first.offset : first.offset + first.size] < data[second.offset : second.offset + second.size]
    with (path / "data.mdb").open("r+b") as f:
        f.seek(first.offset + 8)  # the first byte of the sequence number: now after the next key's
        f.write(bytes([data[first.offset + 8] ^ 0x80]))
    before = (path / "data.mdb").read_bytes()

    async def write_open() -> None:
        async with open_ledger(path):
            pass

    with pytest.raises(DamagedLedgerError, match="key is out of order"):
        anyio.run(write_open)
    for command in (["inspect", str(path)], ["demo", str(path), "--messages", "600"]):
        done = ledger_command(*command)
        assert done.returncode == 4 and "key is out of order" in done.stderr, done
    assert (path / "data.mdb").read_bytes() == before


def test_an_empty_meta_page_made_current_by_a_damaged_transaction_id_is_damage_never_a_new_ledger(
    tmp_path: Path,
) -> None:
    # found by python -m fuzz.bitflips: a compacted copy keeps the empty meta page of transaction 0
    # beside its one commit; a flipped bit made it the current one, and the ledger was created afresh
    built, path = tmp_path / "built", tmp_path / "l"
    anyio.run(a_failed_message, built)
    env = LedgerEnv.open_readonly(built)
    try:
        env.copy_to(path)
    finally:
        env.close()
    with (path / "data.mdb").open("r+b") as f:
        f.seek(16 + 128 + 2)  # the first meta page's transaction id (after the header and 128 bytes)
        byte = f.read(1)[0]
        f.seek(16 + 128 + 2)
        f.write(bytes([byte ^ 0x04]))
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(DamagedLedgerError, match="a meta page is damaged"):
        LedgerEnv.open(path)
    with pytest.raises(DamagedLedgerError, match="a meta page is damaged"):
        LedgerEnv.open_readonly(path)
    assert (path / "data.mdb").read_bytes() == before
