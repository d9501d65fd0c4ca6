"""The keyed log in front of the ``keyed`` table (``ledger/lmdb/_keyed_log.py``), against a model.

Every read, from the writer's transaction or a reader's, of the newest
snapshot or an older one still open, in this process or from a fresh one,
must give exactly what the committed writes make each key, whatever the
log holds, whichever commits merged it and whichever were rolled back.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ledger.lmdb import _keyed_log
from ledger.lmdb._check import check_ledger
from ledger.lmdb._commit import CommitElsewhere
from ledger.lmdb._env import LedgerEnv
from ledger.lmdb._keyed_log import KeyedLogs
from ledger.lmdb._layout import keyed_prefix
from ledger.lmdb._streams import LmdbStreamHooks
from ledger.lmdb._view import LmdbView
from streams import StreamRef, store
from streams.store import StreamOpen

REF = StreamRef("s", "n", "k")
GROUPS = ("g", "h")
KEYS = [b"", b"a", b"ab", b"b", b"c", b"d", b"e"]
VALUES = st.one_of(st.none(), st.binary(max_size=3))
WRITES = st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=4)
Model = dict[str, dict[bytes, bytes]]
THRESHOLDS = ("MERGE_KEYS", "MERGE_ENTRIES", "MERGE_RECORDS", "MERGE_ALL_KEYS")


def _apply(model: Model, group: str, writes: dict[bytes, bytes | None]) -> Model:
    state = {g: dict(values) for g, values in model.items()}
    for key, value in writes.items():
        if value is None:
            state[group].pop(key, None)
        else:
            state[group][key] = value
    return state


class Ledger:
    """An LMDB ledger opened as its owner opens it, written and read through ``LmdbView`` directly."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = LedgerEnv.open(path)
        self.hooks = LmdbStreamHooks(self.env)
        self.dbs: dict[str, Any] = self.env.databases()
        self.ids: dict[StreamRef, int] = {}

    @property
    def logs(self) -> KeyedLogs:
        return self.env.keyed_logs

    def view(self, txn: Any, *, writer: bool) -> LmdbView:
        view = LmdbView(txn, self.dbs, self.ids, logs=self.logs, writer=writer)
        return view

    @contextmanager
    def writing(self, *, commit: bool = True, parent: Any = None) -> Iterator[LmdbView]:
        txn = self.env.begin_write(parent)
        view = self.view(txn, writer=True)
        try:
            yield view
            view.flush()
        except BaseException:
            txn.abort()
            raise
        if commit:
            txn.commit()
            self.ids.update(view.ids)
        else:
            txn.abort()

    def write(self, group: str, writes: Mapping[bytes, bytes | None], view: LmdbView) -> None:
        for key, value in writes.items():
            view.put_keyed(REF, group, key, value)

    def close(self) -> None:
        self.env.close()


def read_all(view: LmdbView, group: str) -> dict[bytes, bytes]:
    found = view.get_keyed(REF, group, KEYS)
    return {key: value for key, value in zip(KEYS, found, strict=True) if value is not None}


def listed(view: LmdbView, group: str, start: bytes = b"", stop: bytes | None = None, limit: int = 99) -> Any:
    return [(e.key, e.value) for e in view.keyed_range(REF, group, start, stop, limit)]


def expected_listing(state: dict[bytes, bytes], start: bytes, stop: bytes | None, limit: int) -> Any:
    keys = sorted(k for k in state if k >= start and (stop is None or k < stop))
    return [(k, state[k]) for k in keys[:limit]]


class KeyedLogMachine(RuleBasedStateMachine):
    """Commits, rolled-back writes, nested writes, old snapshots, outside readers and reopens."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="keyed-log-"))
        self.ledger = Ledger(self.dir / "l")
        self.model: Model = {g: {} for g in GROUPS}
        self.held: list[tuple[ExitStack, Any, Model]] = []  # open read transactions, what they must show
        with self.ledger.writing() as view:  # the stream and its groups
            store.open_stream(view, StreamOpen(REF, "int", 10, GROUPS))

    @initialize(
        keys=st.integers(1, 30),
        entries=st.integers(1, 60),
        records=st.integers(1, 20),
        all_keys=st.integers(2, 60),
    )
    def thresholds(self, keys: int, entries: int, records: int, all_keys: int) -> None:
        self._patched = {name: getattr(_keyed_log, name) for name in THRESHOLDS}
        for name, value in zip(THRESHOLDS, (keys, entries, records, all_keys), strict=True):
            setattr(_keyed_log, name, value)

    @rule(group=st.sampled_from(GROUPS), writes=WRITES)
    def commit(self, group: str, writes: dict[bytes, bytes | None]) -> None:
        with self.ledger.writing() as view:
            self.ledger.write(group, writes, view)
        self.model = _apply(self.model, group, writes)

    @rule(group=st.sampled_from(GROUPS), writes=WRITES, read_first=st.booleans())
    def roll_back(self, group: str, writes: dict[bytes, bytes | None], read_first: bool) -> None:
        with self.ledger.writing(commit=False) as view:
            if read_first:
                assert read_all(view, group) == self.model[group]
            self.ledger.write(group, writes, view)

    @rule(
        group=st.sampled_from(GROUPS),
        first=WRITES,
        failed=WRITES,
        last=WRITES,
    )
    def batch_with_a_failed_write(
        self, group: str, first: dict[bytes, bytes | None], failed: dict[bytes, bytes | None],
        last: dict[bytes, bytes | None],
    ) -> None:  # fmt: skip
        """As the writer thread runs a batch: each write nested, the middle one rolled back."""
        parent = self.ledger.env.begin_write()
        for i, (writes, keep) in enumerate(((first, True), (failed, False), (last, True))):
            child = self.ledger.env.begin_write(parent)
            view = self.ledger.view(child, writer=True)
            expected = self.model if i == 0 else _apply(self.model, group, first)
            assert read_all(view, group) == expected[group]
            self.ledger.write(group, writes, view)
            view.flush()
            if keep:
                child.commit()
            else:
                child.abort()
        parent.commit()
        self.model = _apply(_apply(self.model, group, first), group, last)

    @rule(group=st.sampled_from(GROUPS))
    def clear(self, group: str) -> None:
        with self.ledger.writing() as view:
            view.clear_keyed(REF, group)
        self.model = {**self.model, group: {}}

    @precondition(lambda self: len(self.held) < 3)
    @rule()
    def hold_a_snapshot(self) -> None:
        """A snapshot another thread still reads while commits go on (``env.read`` holds the map lock)."""
        stack = ExitStack()
        txn = stack.enter_context(self.ledger.env._env.begin(buffers=False))
        self.held.append((stack, txn, self.model))

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def read_a_held_snapshot(self, data: st.DataObject) -> None:
        _, txn, model = self.held[data.draw(st.integers(0, len(self.held) - 1))]
        view = self.ledger.view(txn, writer=False)
        for group in GROUPS:
            assert read_all(view, group) == model[group]
            assert listed(view, group) == expected_listing(model[group], b"", None, 99)

    @precondition(lambda self: bool(self.held))
    @rule()
    def release_a_snapshot(self) -> None:
        stack, _, _ = self.held.pop(0)
        stack.close()

    @rule(
        group=st.sampled_from(GROUPS),
        start=st.sampled_from(KEYS),
        stop=st.one_of(st.none(), st.sampled_from(KEYS)),
        limit=st.integers(1, 4),
    )
    def list_a_range(self, group: str, start: bytes, stop: bytes | None, limit: int) -> None:
        with self.ledger.env.read() as txn:
            found = listed(self.ledger.view(txn, writer=False), group, start, stop, limit)
        assert found == expected_listing(self.model[group], start, stop, limit)

    @rule()
    def read_from_outside(self) -> None:
        """As a process beside the owner reads: no decoded logs, its own snapshot."""
        with self.ledger.env.read() as txn:
            view = LmdbView(txn, self.ledger.dbs, {})
            for group in GROUPS:
                assert read_all(view, group) == self.model[group]
                assert listed(view, group) == expected_listing(self.model[group], b"", None, 99)

    def release_every_snapshot(self) -> None:
        for stack, _, _ in self.held:
            stack.close()
        self.held.clear()

    @rule()
    def reopen(self) -> None:
        self.release_every_snapshot()
        self.ledger.close()
        self.ledger = Ledger(self.ledger.path)

    @invariant()
    def every_reader_sees_the_commits(self) -> None:
        with self.ledger.env.read() as txn:
            view = self.ledger.view(txn, writer=False)
            for group in GROUPS:
                assert read_all(view, group) == self.model[group]
        with self.ledger.writing(commit=False) as view:
            for group in GROUPS:
                assert read_all(view, group) == self.model[group]

    def teardown(self) -> None:
        self.release_every_snapshot()
        for name, value in getattr(self, "_patched", {}).items():
            setattr(_keyed_log, name, value)
        self.ledger.close()
        env = LedgerEnv.open_readonly(self.ledger.path)  # the manifests and records agree
        try:
            assert check_ledger(env).sound
        finally:
            env.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def test_the_keyed_log_agrees_with_the_model_through_merges_rollbacks_snapshots_and_reopens() -> None:
    KeyedLogMachine.TestCase.settings = settings(
        max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    KeyedLogMachine.TestCase().runTest()


def test_a_commit_appends_one_record_per_group_and_a_merge_empties_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_keyed_log, "MERGE_KEYS", 4)
    ledger = Ledger(tmp_path / "l")
    try:
        with ledger.writing() as view:
            store.open_stream(view, StreamOpen(REF, "int", 10, GROUPS))
        for writes in ({b"b": b"1", b"a": b"2"}, {b"a": b"3"}):
            with ledger.writing() as view:
                ledger.write("g", writes, view)
        with ledger.env.read() as txn:
            log = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=ledger.dbs["keyed_log"])]
            assert [bytes(k) for k, _ in txn.cursor(db=ledger.dbs["keyed"])] == []
        prefix = keyed_prefix(1, "g")
        assert [k[: len(prefix) + 8] for k, _ in log] == [prefix + bytes(8), prefix + (1).to_bytes(8, "big")]
        assert [_keyed_log.decode_pairs(k, v) for k, v in log] == [
            [(b"a", b"2"), (b"b", b"1")],
            [(b"a", b"3")],
        ]
        with ledger.writing() as view:  # four keys held: merged, with this commit's, into the table
            ledger.write("g", {b"c": b"4", b"b": None}, view)
        with ledger.env.read() as txn:
            assert [bytes(k) for k, _ in txn.cursor(db=ledger.dbs["keyed_log"])] == []
            table = [bytes(k)[len(prefix) :] for k, _ in txn.cursor(db=ledger.dbs["keyed"])]
            assert table == [b"a", b"c"]
            assert read_all(ledger.view(txn, writer=False), "g") == {b"a": b"3", b"c": b"4"}
    finally:
        ledger.close()


def test_a_merge_due_in_a_commit_on_the_loops_thread_moves_the_batch_to_the_writer_thread(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge writes a whole log into the table (0.3 s at a million keys): never on the loop's thread."""
    monkeypatch.setattr(_keyed_log, "MERGE_KEYS", 2)
    _committed(ledger, "g", {b"a": b"1"})
    monkeypatch.setattr(_keyed_log, "on_the_loop", lambda: True)
    with pytest.raises(CommitElsewhere):
        _committed(ledger, "g", {b"b": b"2"})
    with ledger.env.read() as txn:
        assert [bytes(k) for k, _ in txn.cursor(db=ledger.dbs["keyed"])] == []  # no merge made
    monkeypatch.setattr(_keyed_log, "on_the_loop", lambda: False)
    _committed(ledger, "g", {b"b": b"2"})  # on the writer thread: merged
    with ledger.env.read() as txn:
        assert [bytes(k) for k, _ in txn.cursor(db=ledger.dbs["keyed_log"])] == []
        assert read_all(ledger.view(txn, writer=False), "g") == {b"a": b"1", b"b": b"2"}


def _committed(ledger: Ledger, group: str, writes: Mapping[bytes, bytes | None]) -> None:
    with ledger.writing() as view:
        ledger.write(group, writes, view)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "l")
    with ledger.writing() as view:
        store.open_stream(view, StreamOpen(REF, "int", 10, GROUPS))
    try:
        yield ledger
    finally:
        ledger.close()


def test_a_snapshot_held_across_a_commit_reads_its_own_values_from_the_log_extended_in_place(
    ledger: Ledger,
) -> None:
    _committed(ledger, "g", {b"a": b"1"})
    with ledger.env._env.begin(buffers=False) as held:
        _committed(ledger, "g", {b"a": b"2", b"b": b"3"})  # extends the decoded log the snapshot also uses
        log, _ = ledger.logs.candidates(keyed_prefix(1, "g"))
        assert log is not None and len(log.records) == 2
        view = ledger.view(held, writer=False)
        assert read_all(view, "g") == {b"a": b"1"}
        assert listed(view, "g") == [(b"a", b"1")]
    with ledger.env.read() as txn:
        view = ledger.view(txn, writer=False)
        assert read_all(view, "g") == {b"a": b"2", b"b": b"3"}
        assert listed(view, "g") == [(b"a", b"2"), (b"b", b"3")]


def test_the_writer_decodes_the_log_anew_after_a_rolled_back_append(ledger: Ledger) -> None:
    _committed(ledger, "g", {b"a": b"1"})
    with ledger.writing(commit=False) as view:  # appends a record to the decoded log, then rolls back
        ledger.write("g", {b"b": b"9"}, view)
    _committed(ledger, "g", {b"c": b"3"})
    prefix = keyed_prefix(1, "g")
    with ledger.env.read() as txn:
        seqs = [_keyed_log._seq(prefix, bytes(k)) for k, _ in txn.cursor(db=ledger.dbs["keyed_log"])]
        assert seqs == [0, 1]
        assert read_all(ledger.view(txn, writer=False), "g") == {b"a": b"1", b"c": b"3"}
    with ledger.writing(commit=False) as view:
        assert read_all(view, "g") == {b"a": b"1", b"c": b"3"}
