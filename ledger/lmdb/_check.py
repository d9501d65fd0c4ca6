"""``python -m ledger check``: every record of a ledger verified, and every reference between them.

Every value is unsealed (its checksum covers database, key and value) and
decoded as its database's layout; then the references are followed: the
stream counter covers every id, each index entry names a descriptor of the
same stream and each descriptor has its index entry, each group a
descriptor lists has its frontier and each frontier belongs to a listed
group, each stored run of messages belongs to a stream and the runs of a
stream are contiguous up to what it appended, each budget belongs to a
stream, each graph checkpoint to a run record. Reading every record also
walks every page LMDB reaches, so LMDB's own damage surfaces too. One
consistent snapshot; nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lmdb
import msgspec

from streams.store import (
    AttemptRecord,
    GroupFrontier,
    NodeAttemptRecord,
    NodeCheckpoint,
    ScopeRecord,
    StreamDescriptor,
)

from .._check import LedgerCheck
from .._errors import CorruptRecordError
from .._graph_runs import GraphRunRecord
from .._runs import RunRecord
from ._env import LedgerEnv
from ._layout import (
    CHECKPOINT_PREFIX,
    COUNTER_KEY,
    DATABASES,
    DESCRIPTOR_PREFIX,
    INDEX_PREFIX,
    RUN_PREFIX,
    U64,
    group_key,
    index_key,
)
from ._seal import decode_record, unseal

__all__ = ["check_ledger"]


_DECODERS: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def _decoder(tp: type[Any]) -> msgspec.msgpack.Decoder[Any]:
    found = _DECODERS.get(tp)
    if found is None:
        found = _DECODERS[tp] = msgspec.msgpack.Decoder(tp)
    return found


def check_ledger(env: LedgerEnv) -> LedgerCheck:
    """Verify every record and reference of ``env``'s ledger; the problems say which record and why."""
    problems: list[str] = []
    records: dict[str, int] = {}
    try:
        with env.read() as txn:
            _Checker(env, txn, problems, records).run()
    except (lmdb.Error, CorruptRecordError) as exc:  # LMDB's own damage, met outside any one record
        problems.append(f"LMDB could not read the ledger: {exc}")
    return LedgerCheck(str(env.path), records, problems)


class _Checker:
    def __init__(self, env: LedgerEnv, txn: Any, problems: list[str], records: dict[str, int]) -> None:
        self.env = env
        self.txn = txn
        self.problems = problems
        self.records = records

    def items(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        if not self.env.has_db(db):
            self.problems.append(f"database {db!r} is missing: the ledger's creation was interrupted")
            return
        with self.txn.cursor(db=self.env.db(db)) as cursor:
            for key, value in cursor:
                self.records[db] = self.records.get(db, 0) + 1
                yield bytes(key), bytes(value)

    def decode(self, db: str, key: bytes, value: bytes, tp: type[Any]) -> Any:
        try:
            return decode_record(value, _decoder(tp), db=db, key=key)
        except CorruptRecordError as exc:
            self.problems.append(str(exc))
            return None

    def run(self) -> None:
        descriptors = self.streams()
        self.groups(descriptors)
        self.messages(descriptors)
        self.attempts(descriptors)
        self.graph_runs()
        self.nodes()
        for db in DATABASES:
            if db in ("meta", "streams", "groups", "messages", "attempts", "graph_runs", "nodes"):
                continue
            for key, value in self.items(db):
                try:
                    unseal(value, db=db, key=key)
                except CorruptRecordError as exc:
                    self.problems.append(str(exc))

    def streams(self) -> dict[int, StreamDescriptor]:
        counter = 0
        index: dict[bytes, int] = {}
        descriptors: dict[int, StreamDescriptor] = {}
        for key, value in self.items("streams"):
            if key == COUNTER_KEY:
                counter = self.decode("streams", key, value, int) or 0
            elif key.startswith(INDEX_PREFIX):
                stream_id = self.decode("streams", key, value, int)
                if stream_id is not None:
                    index[key] = stream_id
            elif key.startswith(DESCRIPTOR_PREFIX) and len(key) == 9:
                desc = self.decode("streams", key, value, StreamDescriptor)
                if desc is not None:
                    descriptors[U64.unpack_from(key, 1)[0]] = desc
            else:
                self.problems.append(f"record {key.hex()} in database 'streams' has no known layout")
        for key, stream_id in index.items():
            desc = descriptors.get(stream_id)
            if desc is None:
                self.problems.append(f"stream id {stream_id} (index {key.hex()}) has no descriptor")
            elif index_key(desc.ref) != key:
                self.problems.append(
                    f"index {key.hex()} names stream {stream_id}, whose descriptor is for {desc.ref}"
                )
        for stream_id, desc in descriptors.items():
            if stream_id > counter:
                self.problems.append(
                    f"stream {desc.ref} has id {stream_id}, above the last allocated {counter}"
                )
            if index.get(index_key(desc.ref)) != stream_id:
                self.problems.append(f"stream {desc.ref} (id {stream_id}) has no index entry naming it")
        return descriptors

    def groups(self, descriptors: dict[int, StreamDescriptor]) -> None:
        found: set[tuple[int, str]] = set()
        for key, value in self.items("groups"):
            frontier = self.decode("groups", key, value, GroupFrontier)
            if frontier is None:
                continue
            stream_id = U64.unpack_from(key)[0]
            desc = descriptors.get(stream_id)
            if desc is None or frontier.group not in desc.groups:
                self.problems.append(
                    f"frontier {key.hex()} of group {frontier.group!r} belongs to no stream's groups"
                )
            elif group_key(stream_id, frontier.group) != key:
                self.problems.append(
                    f"frontier of group {frontier.group!r} sits under another key, {key.hex()}"
                )
            else:
                found.add((stream_id, frontier.group))
        for stream_id, desc in descriptors.items():
            for group in desc.groups:
                if (stream_id, group) not in found:
                    self.problems.append(
                        f"stream {desc.ref} lists group {group!r}, whose frontier is missing"
                    )

    def messages(self, descriptors: dict[int, StreamDescriptor]) -> None:
        next_seq: dict[int, int] = {}
        for key, value in self.items("messages"):
            if len(key) != 16:
                self.problems.append(f"record {key.hex()} in database 'messages' has no known layout")
                continue
            stream_id, first = U64.unpack_from(key)[0], U64.unpack_from(key, 8)[0]
            run = self.decode("messages", key, value, list[bytes])
            desc = descriptors.get(stream_id)
            if run is None:
                continue
            if desc is None:
                self.problems.append(f"messages {key.hex()} belong to no stream (id {stream_id})")
                continue
            expected = next_seq.get(stream_id)
            if expected is not None and first != expected:
                self.problems.append(f"stream {desc.ref}: messages jump from {expected - 1} to {first}")
            last = first + len(run) - 1
            if last > desc.appended:
                self.problems.append(
                    f"stream {desc.ref}: messages up to {last}, beyond the {desc.appended} appended"
                )
            next_seq[stream_id] = last + 1
        for stream_id, desc in descriptors.items():
            end = next_seq.get(stream_id)
            if desc.appended > desc.compacted_through and (end is None or end - 1 != desc.appended):
                held = 0 if end is None else end - 1
                self.problems.append(
                    f"stream {desc.ref}: {desc.appended} appended, messages stored up to {held}"
                )

    def attempts(self, descriptors: dict[int, StreamDescriptor]) -> None:
        for key, value in self.items("attempts"):
            if self.decode("attempts", key, value, AttemptRecord) is None:
                continue
            if U64.unpack_from(key)[0] not in descriptors:
                self.problems.append(f"budget {key.hex()} belongs to no stream")

    def nodes(self) -> None:
        layouts = {b"a": NodeAttemptRecord, b"s": ScopeRecord, b"n": NodeCheckpoint, b"r": RunRecord}
        for key, value in self.items("nodes"):
            layout = layouts.get(key[:1])
            if layout is None:
                self.problems.append(f"record {key.hex()} in database 'nodes' has no known layout")
            else:
                self.decode("nodes", key, value, layout)

    def graph_runs(self) -> None:
        runs: set[bytes] = set()
        checkpoints: list[bytes] = []
        for key, value in self.items("graph_runs"):
            if key.startswith(RUN_PREFIX):
                if self.decode("graph_runs", key, value, GraphRunRecord) is not None:
                    runs.add(key[len(RUN_PREFIX) :])
            elif key.startswith(CHECKPOINT_PREFIX):
                try:
                    unseal(value, db="graph_runs", key=key)  # a checkpoint of another format is not damage
                except CorruptRecordError as exc:
                    self.problems.append(str(exc))
                else:
                    checkpoints.append(key[len(CHECKPOINT_PREFIX) :])
            else:
                self.problems.append(f"record {key.hex()} in database 'graph_runs' has no known layout")
        for run_id in checkpoints:
            if run_id not in runs:
                self.problems.append(
                    f"graph run {run_id.decode(errors='replace')!r} has a checkpoint but no run record"
                )
