"""A :class:`~streams.store.RecordView` over one LMDB transaction: the stream records as the store
logic reads and writes them.

The record layout of the ``streams``, ``messages``, ``groups``, ``attempts``
and ``keyed`` databases is stated in :mod:`ledger.lmdb._layout`. Keys are
big-endian, so a stream's messages are contiguous and appended in key
order. A batch of messages is stored as runs of up to ``CHUNK`` messages,
one LMDB value each: the writer thread makes one put per run instead of one
per message, and compaction deletes one key per run. A view caches every
record it reads or writes and puts each changed descriptor and frontier
once, when the call ends, so a commit of many messages on one group writes
its frontier once. A group's keyed state is one range of ``keyed`` keys (its
prefix and the key bytes): a takeover or a removal clears it with one cursor
walk, and a listing reads it in key order. It needs no open environment, only
a transaction and the databases: :mod:`ledger.lmdb._verify` reads through it
while the environment opens.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from streams import GroupFrontier, StreamRef
from streams.store import (
    MAX_KEY_BYTES,
    AttemptKey,
    AttemptRecord,
    CachedView,
    GroupKey,
    KeyedEntry,
    StoredMessage,
    StreamDescriptor,
)

from .._errors import CorruptRecordError, UnattributedBudgetsError
from ._keyed_log import KeyedLogs, LogRead, clear_group, log_range, read_log, table_rows, write_log
from ._layout import (
    CHUNK,
    COUNTER_KEY,
    LEGACY_DIGEST,
    LEGACY_KEY_LENGTH,
    U64,
    attempt_key,
    budget_prefixes,
    descriptor_key,
    group_key,
    index_key,
    keyed_prefix,
    legacy_attempt_key,
)
from ._manifest import KeyTally, write_tally
from ._seal import decode_record, seal, unseal

__all__ = ["LmdbView", "decode_descriptor", "decode_frontier", "decode_run"]

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_descriptor_decoder = msgspec.msgpack.Decoder(StreamDescriptor)
_frontier_decoder = msgspec.msgpack.Decoder(GroupFrontier)
_attempt_decoder = msgspec.msgpack.Decoder(AttemptRecord)
_int_decoder = msgspec.msgpack.Decoder(int)


_payloads_decoder = msgspec.msgpack.Decoder(list[bytes])


def decode_run(key: bytes, value: bytes) -> list[bytes]:
    """The payloads of one stored run of messages."""
    return decode_record(value, _payloads_decoder, db="messages", key=key)


def decode_descriptor(key: bytes, value: bytes) -> StreamDescriptor:
    return decode_record(value, _descriptor_decoder, db="streams", key=key)


def decode_frontier(key: bytes, value: bytes) -> GroupFrontier:
    return decode_record(value, _frontier_decoder, db="groups", key=key)


def _at_run_holding(cursor: Any, prefix: bytes, seq: int) -> bool:
    """Put ``cursor`` on the stream's run holding ``seq``, or the first run after it."""
    if cursor.set_range(prefix + U64.pack(seq)):
        key = cursor.key()
        if key[:8] == prefix and U64.unpack_from(key, 8)[0] == seq:
            return True
        if not cursor.prev():  # the run after seq is the first record: start there
            return bool(cursor.first()) and cursor.key()[:8] == prefix
    elif not cursor.last():
        return False
    if cursor.key()[:8] == prefix:
        return True  # the last run that starts before seq, which may hold it
    return bool(cursor.next()) and cursor.key()[:8] == prefix


class LmdbView(CachedView):
    """A :class:`~streams.store.RecordView` over one LMDB transaction.

    ``known_ids`` maps streams to ids already committed; ids resolved or
    allocated here are collected in :attr:`ids` for the caller to remember
    once the transaction is durable. :attr:`reads` counts the records read.
    Reads are memory-mapped lookups, so a batch is read one key at a time.
    """

    __slots__ = ("_dbs", "_known_ids", "_log_reads", "_logs", "_txn", "_writer", "ids", "reads")

    def __init__(
        self,
        txn: Any,
        dbs: Mapping[str, Any],
        known_ids: Mapping[StreamRef, int],
        *,
        logs: KeyedLogs | None = None,
        writer: bool = False,
    ) -> None:
        super().__init__()
        self._txn = txn
        self._dbs = dbs
        self._known_ids = known_ids
        #: The environment's decoded keyed logs (:mod:`ledger.lmdb._keyed_log`); ``writer``: this
        #: view's transaction is the writer thread's, which keeps them.
        self._logs = logs
        self._writer = writer
        self._log_reads: dict[bytes, LogRead] = {}
        self.ids: dict[StreamRef, int] = {}
        self.reads = 0

    # -- ids -------------------------------------------------------------------------------

    def _id(self, ref: StreamRef) -> int | None:
        stream_id = self._known_ids.get(ref)
        if stream_id is None:
            stream_id = self.ids.get(ref)
        if stream_id is None:
            key = index_key(ref)
            raw = self._txn.get(key, db=self._dbs["streams"])
            self.reads += 1
            if raw is None:
                return None
            stream_id = decode_record(raw, _int_decoder, db="streams", key=key)
            self.ids[ref] = stream_id
        return stream_id

    def _allocate(self, ref: StreamRef) -> int:
        streams = self._dbs["streams"]
        raw = self._txn.get(COUNTER_KEY, db=streams)
        last = 0 if raw is None else decode_record(raw, _int_decoder, db="streams", key=COUNTER_KEY)
        stream_id = last + 1
        body = _encoder.encode(stream_id)
        index = index_key(ref)
        self._txn.put(COUNTER_KEY, seal("streams", COUNTER_KEY, body), db=streams)
        self._txn.put(index, seal("streams", index, body), db=streams)
        self.ids[ref] = stream_id
        return stream_id

    def _require_id(self, ref: StreamRef) -> int:
        stream_id = self._id(ref)
        return self._allocate(ref) if stream_id is None else stream_id

    # -- CachedView ------------------------------------------------------------------------

    def _read_descriptors(self, refs: Sequence[StreamRef]) -> list[StreamDescriptor | None]:
        return [self._read_descriptor(ref) for ref in refs]

    def _read_descriptor(self, ref: StreamRef) -> StreamDescriptor | None:
        stream_id = self._id(ref)
        if stream_id is None:
            return None
        key = descriptor_key(stream_id)
        raw = self._txn.get(key, db=self._dbs["streams"])
        self.reads += 1
        if raw is None:
            raise CorruptRecordError(
                f"stream {ref} has id {stream_id} but no descriptor; the ledger file is damaged"
            )
        desc = decode_descriptor(key, raw)
        if desc.ref != ref:
            raise CorruptRecordError(
                f"stream {ref} maps to id {stream_id}, whose descriptor is for {desc.ref}; "
                "the ledger file is damaged"
            )
        return desc

    def _read_groups(self, keys: Sequence[tuple[StreamRef, str]]) -> list[GroupFrontier | None]:
        found: list[GroupFrontier | None] = []
        for ref, group in keys:
            stream_id = self._id(ref)
            frontier = None
            if stream_id is not None:
                key = group_key(stream_id, group)
                raw = self._txn.get(key, db=self._dbs["groups"])
                self.reads += 1
                if raw is not None:
                    frontier = decode_frontier(key, raw)
            found.append(frontier)
        return found

    def _read_attempts(self, keys: Sequence[AttemptKey]) -> list[AttemptRecord | None]:
        found: list[AttemptRecord | None] = []
        for key in keys:
            stream_id = self._id(key.ref)
            record = None
            if stream_id is not None:
                raw_key = attempt_key(stream_id, key)
                raw = self._txn.get(raw_key, db=self._dbs["attempts"])
                self.reads += 1
                if raw is None and (legacy := legacy_attempt_key(stream_id, key)) is not None:
                    raw_key = legacy
                    raw = self._txn.get(raw_key, db=self._dbs["attempts"])
                if raw is not None:
                    record = decode_record(raw, _attempt_decoder, db="attempts", key=raw_key)
            found.append(record)
        return found

    def _write(
        self,
        descriptors: Mapping[StreamRef, StreamDescriptor],
        groups: Mapping[tuple[StreamRef, str], GroupFrontier | None],
        attempts: Mapping[AttemptKey, AttemptRecord | None],
    ) -> None:
        txn = self._txn
        if descriptors:
            streams = self._dbs["streams"]
            for ref, desc in descriptors.items():
                key = descriptor_key(self._require_id(ref))
                txn.put(key, seal("streams", key, _encoder.encode(desc)), db=streams)
        if groups:
            db = self._dbs["groups"]
            for (ref, group), frontier in groups.items():
                key = group_key(self._require_id(ref), group)
                if frontier is None:
                    txn.delete(key, db=db)
                else:
                    txn.put(key, seal("groups", key, _encoder.encode(frontier)), db=db)
        if attempts:
            db = self._dbs["attempts"]
            tally = KeyTally()  # the keys added and removed, for the budgets' manifest
            for budget, record in attempts.items():
                stream_id = self._id(budget.ref) if record is None else self._require_id(budget.ref)
                if stream_id is None:
                    continue
                raw_key = attempt_key(stream_id, budget)
                if record is not None:
                    if (
                        txn.replace(raw_key, seal("attempts", raw_key, _encoder.encode(record)), db=db)
                        is None
                    ):
                        tally.added(raw_key)
                elif txn.delete(raw_key, db=db):
                    tally.removed(raw_key)
                legacy = legacy_attempt_key(stream_id, budget)
                if legacy is not None and txn.delete(legacy, db=db):  # kept under its current key only
                    tally.removed(legacy)
            write_tally(txn, self._dbs["meta"], "attempts", tally)

    def _delete_budgets(self, groups: Sequence[tuple[StreamRef, str]]) -> None:
        db = self._dbs["attempts"]
        tally = KeyTally()
        for ref, group in groups:
            stream_id = self._id(ref)
            if stream_id is None:
                continue
            self._refuse_unattributed(ref, stream_id)
            for prefix in budget_prefixes(stream_id, group):
                with self._txn.cursor(db=db) as cursor:
                    found = cursor.set_range(prefix)
                    while found and (key := bytes(cursor.key())).startswith(prefix):
                        tally.removed(key)
                        found = cursor.delete()
        write_tally(self._txn, self._dbs["meta"], "attempts", tally)

    def _refuse_unattributed(self, ref: StreamRef, stream_id: int) -> None:
        """Refuse a group change on a stream holding budgets under 0.1.0's digested keys.

        Those keys digest the group with the rest, so no group's budgets can be
        told from another's: forgetting some might forget another group's, and
        keeping them might give a moved group a used budget back. They go as
        their messages are acknowledged (or dead-lettered).
        """
        prefix = U64.pack(stream_id) + LEGACY_DIGEST
        with self._txn.cursor(db=self._dbs["attempts"]) as cursor:
            found = cursor.set_range(prefix)
            while found and (key := cursor.key()).startswith(prefix):
                if len(key) == LEGACY_KEY_LENGTH:
                    raise UnattributedBudgetsError(
                        f"stream {ref} holds message budgets written by streamledger 0.1.0 under keys that "
                        "do not say their group (its groups' and nodes' names together are over 230 "
                        "bytes); acknowledge or dead-letter its failing messages first (nothing was changed)"
                    )
                found = cursor.next()

    # -- keyed state -----------------------------------------------------------------------
    # A ledger of schema 4 or before opened read-only has no ``keyed`` database: no keyed state.

    def _log_read(self, prefix: bytes) -> LogRead | None:
        """The group's log as this view's transaction holds it; None for a ledger with no log (schema 5)."""
        db = self._dbs.get("keyed_log")
        if db is None:
            return None
        found = self._log_reads.get(prefix)
        if found is None:
            found = self._log_reads[prefix] = read_log(self._txn, db, prefix, self._logs, writer=self._writer)
        return found

    def _read_keyed(self, ref: StreamRef, group: str, keys: Sequence[bytes]) -> list[bytes | None]:
        stream_id = self._id(ref)
        db = self._dbs.get("keyed")
        if stream_id is None or db is None:
            return [None] * len(keys)
        prefix = keyed_prefix(stream_id, group)
        log = self._log_read(prefix)
        get = self._txn.get
        found: list[bytes | None] = []
        for key in keys:
            if len(key) > MAX_KEY_BYTES:  # never stored: a commit refuses it
                found.append(None)
                continue
            if log is not None:
                logged, value = log.get(key)
                if logged:
                    found.append(value)
                    continue
            raw_key = prefix + key
            raw = get(raw_key, db=db)
            found.append(None if raw is None else unseal(bytes(raw), db="keyed", key=raw_key))
        self.reads += len(keys)
        return found

    def _clear_keyed(self, groups: Sequence[GroupKey]) -> None:
        tally, log_tally = KeyTally(), KeyTally()
        for ref, group in groups:
            stream_id = self._id(ref)
            if stream_id is None:
                continue
            prefix = keyed_prefix(stream_id, group)
            clear_group(self._txn, self._dbs, prefix, self._logs if self._writer else None, tally, log_tally)
            self._log_reads.pop(prefix, None)
        write_tally(self._txn, self._dbs["meta"], "keyed", tally)
        write_tally(self._txn, self._dbs["meta"], "keyed_log", log_tally)

    def _write_keyed(self, writes: Mapping[GroupKey, Mapping[bytes, bytes | None]]) -> None:
        """Each group's writes appended to its log, or merged with it into the table (``_keyed_log``)."""
        txn = self._txn
        tally, log_tally = KeyTally(), KeyTally()  # the keys added and removed, for the manifests
        logs = self._logs if self._writer else None
        for (ref, group), values in writes.items():
            prefix = keyed_prefix(self._require_id(ref), group)
            read = self._log_read(prefix)  # the one this commit's reads of the group took, if any
            assert read is not None  # a ledger opened for writing holds keyed_log
            write_log(txn, self._dbs, read, values, logs, table_tally=tally, log_tally=log_tally)
            self._log_reads.pop(prefix, None)
        write_tally(txn, self._dbs["meta"], "keyed", tally)
        write_tally(txn, self._dbs["meta"], "keyed_log", log_tally)

    def keyed_range(
        self, ref: StreamRef, group: str, start: bytes, stop: bytes | None, limit: int
    ) -> list[KeyedEntry]:
        stream_id = self._id(ref)
        db = self._dbs.get("keyed")
        if stream_id is None or db is None or limit <= 0:
            return []
        prefix = keyed_prefix(stream_id, group)
        rows = table_rows(self._txn, db, prefix, start, stop)
        log = self._log_read(prefix)
        found = (
            [KeyedEntry(k, v) for k, v in itertools.islice(rows, limit)]
            if log is None
            else (log_range(log, rows, start, stop, limit))
        )
        self.reads += len(found)
        return found

    # -- messages --------------------------------------------------------------------------

    def put_messages(self, ref: StreamRef, first_seq: int, payloads: Sequence[bytes]) -> None:
        prefix = U64.pack(self._require_id(ref))
        db = self._dbs["messages"]
        put = self._txn.put
        for start in range(0, len(payloads), CHUNK):
            run = payloads[start : start + CHUNK]
            key = prefix + U64.pack(first_seq + start)
            put(key, seal("messages", key, _encoder.encode(run)), db=db)

    def messages_after(self, ref: StreamRef, seq: int) -> Iterable[StoredMessage]:
        stream_id = self._id(ref)
        if stream_id is None:
            return []
        prefix = U64.pack(stream_id)
        found: list[StoredMessage] = []
        with self._txn.cursor(db=self._dbs["messages"]) as cursor:
            # the run holding seq + 1 starts at or before it: step back one run from there
            if not _at_run_holding(cursor, prefix, seq + 1):
                return found
            for key, value in cursor:
                if key[:8] != prefix:
                    break
                first = U64.unpack_from(key, 8)[0]
                for i, payload in enumerate(decode_run(key, value)):
                    if first + i > seq:
                        found.append(StoredMessage(first + i, payload))
        self.reads += len(found)
        return found

    def compact(self, ref: StreamRef, through: int) -> None:
        """Delete every run whose messages are all at or below ``through``."""
        stream_id = self._id(ref)
        if stream_id is None:
            return
        prefix = U64.pack(stream_id)
        with self._txn.cursor(db=self._dbs["messages"]) as cursor:
            if not cursor.set_range(prefix):
                return
            while True:
                key = cursor.key()
                if not key or key[:8] != prefix or U64.unpack_from(key, 8)[0] > through:
                    return
                last = U64.unpack_from(key, 8)[0] + len(decode_run(key, cursor.value())) - 1
                if last > through or not cursor.delete():
                    return
