"""A group's keyed state as a sorted table with a log in front: writes append, a later commit merges.

Putting each key where it sorts costs a copy-on-write B-tree a page a key
once the keys outgrow a few pages: over a million keys nearly every put of a
commit copies a leaf of its own (and writes it at the fsync), so the cost of
a message grows with the number of keys. Here a commit that writes a group's
keys appends one record to the group's log instead, in ``keyed_log`` under
the group's prefix, a sequence number and eight random bytes
(:func:`record_key`): the pairs (key, value, or nil for a key removed) it
wrote, in key order. Appends land on the last page of the log, however many
keys the group holds. A key's value is its newest log entry's, else the
table's (``keyed``). Once a group's log holds :data:`MERGE_KEYS` keys (or
:data:`MERGE_ENTRIES` entries, or :data:`MERGE_RECORDS` records, or the logs
of all groups hold :data:`MERGE_ALL_KEYS` keys) the commit that writes it
merges it: each key's
newest value put in the table in key order, where a batch that large shares
its leaves, and the log's records deleted, all in that one transaction.

Reads must not decode the log each time, so each environment keeps its
groups' logs decoded in memory (:class:`KeyedLogs`): a :class:`GroupLog`
per group, each key's newest value and the position of the record it came
from. Only the thread committing a batch changes them (the writer thread; the
loop's for a lone write, but never by a merge), extending a group's log in place
with the records its transaction appended, or replacing it whole (rebuilt,
merged, cleared); any thread reads them. A reader trusts them no further than
its own transaction shows: it finds the first and last record keys of the
group's log in its snapshot (two cursor steps) and uses the decoded log only
if it holds the same records (the random bytes tell apart two records of one
sequence number, one of them rolled back), ignoring entries appended after
its snapshot's last record; anything else it decodes from its own snapshot.
So a rolled-back transaction's records, an older snapshot read during a
commit, and a process reading beside the owner all read exactly what their
transaction holds.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from streams.store import KeyedEntry

from ._commit import CommitElsewhere, on_the_loop
from ._layout import U64
from ._manifest import KeyTally
from ._seal import decode_record, seal, unseal

__all__ = [
    "MERGE_ALL_KEYS",
    "MERGE_ENTRIES",
    "MERGE_KEYS",
    "MERGE_RECORDS",
    "GroupLog",
    "KeyedLogs",
    "LogRead",
    "clear_group",
    "log_range",
    "read_log",
    "record_key",
    "write_log",
]

#: A group's log is merged into the table once it holds this many keys...
MERGE_KEYS: Final = 50_000
#: ...or this many entries (a key written again counts again)...
MERGE_ENTRIES: Final = 200_000
#: ...or this many records (a commit's each: few keys a commit, many commits)...
MERGE_RECORDS: Final = 1_000
#: ...or the logs of all groups of the environment hold this many keys together.
MERGE_ALL_KEYS: Final = 200_000

#: Past every record key of a group: sequence number and random bytes are 16 bytes.
_END: Final = b"\xff" * 17
_NONCE: Final = 8

Pairs = list[tuple[bytes, bytes | None]]
_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(list[tuple[bytes, bytes | None]])


def record_key(prefix: bytes, seq: int) -> bytes:
    """The ``keyed_log`` key of a group's record ``seq``: its prefix, the number, eight random bytes."""
    return prefix + U64.pack(seq) + os.urandom(_NONCE)


def _seq(prefix: bytes, key: bytes) -> int:
    return int(U64.unpack_from(key, len(prefix))[0])


def decode_pairs(key: bytes, value: bytes) -> Pairs:
    """The (key, value or None) pairs of one stored log record."""
    return decode_record(value, _decoder, db="keyed_log", key=key)


class GroupLog:
    """What one group's log holds: its records' keys in order, and each key's newest entry."""

    __slots__ = ("entries", "names", "position", "records", "values")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        #: Each record's keys, in key order (as every record stores them), for ranges of keys.
        self.names: list[list[bytes]] = []
        self.position: dict[bytes, int] = {}
        #: key -> (position of the record holding its newest entry, that entry's value or None)
        self.values: dict[bytes, tuple[int, bytes | None]] = {}
        self.entries = 0

    @property
    def first(self) -> bytes | None:
        return self.records[0] if self.records else None

    @property
    def last(self) -> bytes | None:
        return self.records[-1] if self.records else None

    def apply(self, key: bytes, pairs: Pairs) -> None:
        """Take record ``key`` as the log's newest (the writer thread's, or a log being built)."""
        position = len(self.records)
        self.names.append([name for name, _ in pairs])
        self.records.append(key)  # then: a reader of an older snapshot skips the entries after its own
        self.position[key] = position
        values = self.values
        for name, value in pairs:
            values[name] = (position, value)
        self.entries += len(pairs)


class KeyedLogs:
    """The decoded logs of one environment's groups, by group prefix; see the module's text."""

    __slots__ = ("_current", "_previous")

    def __init__(self) -> None:
        self._current: dict[bytes, GroupLog] = {}
        #: The log each group had before it was last replaced, for snapshots taken before that.
        self._previous: dict[bytes, GroupLog] = {}

    def candidates(self, prefix: bytes) -> tuple[GroupLog | None, GroupLog | None]:
        return self._current.get(prefix), self._previous.get(prefix)

    def keep(self, prefix: bytes, log: GroupLog) -> None:
        """Writer thread: ``log`` is the group's log as its transaction holds it."""
        current = self._current.get(prefix)
        if current is not log:
            if current is not None:
                self._previous[prefix] = current
            self._current[prefix] = log

    def offer(self, prefix: bytes, log: GroupLog) -> None:
        """A reader's log, decoded from its snapshot, for a group the writer has not kept one of."""
        self._current.setdefault(prefix, log)

    def forget(self, stream_id: int) -> None:
        """The stream's groups' logs went with it (deleted; its id is never used again)."""
        stream = U64.pack(stream_id)
        for logs in (self._current, self._previous):
            for prefix in [p for p in list(logs) if p.startswith(stream)]:
                logs.pop(prefix, None)

    def held_keys(self) -> int:
        return sum(len(log.values) for log in list(self._current.values()))


def _bounds(txn: Any, db: Any, prefix: bytes) -> tuple[bytes | None, bytes | None]:
    """The first and last record keys of the group's log in ``txn``'s snapshot."""
    with txn.cursor(db=db) as cursor:
        if not cursor.set_range(prefix):
            return None, None
        first = bytes(cursor.key())
        if not first.startswith(prefix):
            return None, None
        moved = cursor.prev() if cursor.set_range(prefix + _END) else cursor.last()
        return first, bytes(cursor.key()) if moved else first


def _records(txn: Any, db: Any, prefix: bytes, after: bytes | None) -> Iterator[tuple[bytes, Pairs]]:
    """The group's records in ``txn`` after record ``after`` (all of them for None), in order."""
    with txn.cursor(db=db) as cursor:
        found = cursor.set_range(after if after is not None else prefix)
        while found:
            key = bytes(cursor.key())
            if not key.startswith(prefix):
                return
            if key != after:
                yield key, decode_pairs(key, bytes(cursor.value()))
            found = cursor.next()


def _decoded(txn: Any, db: Any, prefix: bytes) -> GroupLog:
    log = GroupLog()
    for key, pairs in _records(txn, db, prefix, None):
        log.apply(key, pairs)
    return log


class LogRead:
    """A group's log as one transaction holds it: the entries of ``log`` up to record ``through``."""

    __slots__ = ("_db", "_log", "_prefix", "_through", "_txn")

    def __init__(self, log: GroupLog, through: int, txn: Any, db: Any, prefix: bytes) -> None:
        self._log, self._through = log, through
        self._txn, self._db, self._prefix = txn, db, prefix

    @property
    def log(self) -> GroupLog:
        return self._log

    def get(self, key: bytes) -> tuple[bool, bytes | None]:
        """(True, the key's newest entry) if the log holds one, else (False, None): read the table."""
        found = self._log.values.get(key)
        if found is None:
            return False, None
        position, value = found
        if position <= self._through:
            return True, value
        # written again by a record after this snapshot's last: find its entry in the snapshot itself
        entry: tuple[bool, bytes | None] = (False, None)
        for _, pairs in _records(self._txn, self._db, self._prefix, None):
            for name, stored in pairs:
                if name == key:
                    entry = (True, stored)
        return entry

    def scan(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes | None]]:
        """The log's keys from ``start`` to ``stop`` (excluded) in key order, each with its newest entry.

        A merge of the records' sorted keys: its cost is the records' number
        and the keys taken, not the log's size.
        """
        log, through = self._log, self._through
        names = log.names[: through + 1]  # this snapshot's records
        ranges = []
        for keys in names:
            lo = bisect.bisect_left(keys, start)
            hi = len(keys) if stop is None else bisect.bisect_left(keys, stop, lo)
            if lo < hi:
                ranges.append(itertools.islice(keys, lo, hi))
        values, last = log.values, None
        for name in heapq.merge(*ranges):
            if name == last:
                continue
            last = name
            position, value = values[name]
            if position > through:  # written again after this snapshot: read the snapshot itself
                yield from _scan_decoded(_decoded(self._txn, self._db, self._prefix), name, stop)
                return
            yield name, value


def _scan_decoded(log: GroupLog, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes | None]]:
    names = sorted(name for name in log.values if name >= start and (stop is None or name < stop))
    for name in names:
        yield name, log.values[name][1]


_EMPTY: Final = GroupLog()


def read_log(txn: Any, db: Any, prefix: bytes, logs: KeyedLogs | None, *, writer: bool) -> LogRead:
    """The group's log as ``txn`` holds it, from ``logs`` where they agree with it.

    The writer thread (``writer``) keeps what it finds in ``logs``: the
    records its transaction appended since, or the log decoded whole where
    ``logs`` held another.
    """
    first, last = _bounds(txn, db, prefix)
    if first is None or last is None:
        if writer and logs is not None:
            current, _ = logs.candidates(prefix)
            if current is not None and current.records:
                logs.keep(prefix, GroupLog())
        return LogRead(_EMPTY, -1, txn, db, prefix)
    if logs is not None:
        for log in logs.candidates(prefix):
            if log is None or log.first != first:
                continue
            through = log.position.get(last)
            if through is not None:
                if writer:
                    if through != len(log.records) - 1:
                        continue  # it holds records this transaction does not (rolled back): decode anew
                    logs.keep(prefix, log)
                return LogRead(log, through, txn, db, prefix)
            if writer and log.last is not None and txn.get(log.last, db=db) is not None:
                for key, pairs in _records(txn, db, prefix, log.last):  # appended since: extend
                    log.apply(key, pairs)
                logs.keep(prefix, log)
                return LogRead(log, len(log.records) - 1, txn, db, prefix)
    log = _decoded(txn, db, prefix)
    if logs is not None:
        if writer:
            logs.keep(prefix, log)
        else:
            logs.offer(prefix, log)
    return LogRead(log, len(log.records) - 1, txn, db, prefix)


def write_log(
    txn: Any,
    dbs: Mapping[str, Any],
    read: LogRead,
    writes: Mapping[bytes, bytes | None],
    logs: KeyedLogs | None,
    *,
    table_tally: KeyTally,
    log_tally: KeyTally,
) -> None:
    """Writer thread: append ``writes`` to the group's log (``read``, by the writer's transaction: see
    :func:`read_log`), or merge the log with them into the table."""
    db, prefix = dbs["keyed_log"], read._prefix
    log = read.log if read.log is not _EMPTY else GroupLog()
    pairs = sorted(writes.items())
    held = len(log.values) + len(pairs)
    merge = (
        held >= MERGE_KEYS
        or log.entries + len(pairs) >= MERGE_ENTRIES
        or len(log.records) + 1 >= MERGE_RECORDS
        or (logs is not None and logs.held_keys() + len(pairs) >= MERGE_ALL_KEYS)
    )
    if merge and on_the_loop():  # a merge writes the whole log into the table: not on the loop
        raise CommitElsewhere
    if not merge:
        last = log.last
        key = record_key(prefix, 0 if last is None else _seq(prefix, last) + 1)
        txn.put(key, seal("keyed_log", key, _encoder.encode(pairs)), db=db)
        log_tally.added(key)
        log.apply(key, pairs)
        if logs is not None:
            logs.keep(prefix, log)
        return
    merged = {name: value for name, (_, value) in log.values.items()}
    merged.update(pairs)
    _put_table(txn, dbs["keyed"], prefix, merged, table_tally)
    for key in log.records:
        txn.delete(key, db=db)
        log_tally.removed(key)
    if logs is not None:
        logs.keep(prefix, GroupLog())


def _put_table(
    txn: Any, db: Any, prefix: bytes, values: Mapping[bytes, bytes | None], tally: KeyTally
) -> None:
    for name, value in sorted(values.items()):  # in key order: neighbouring keys share their pages
        raw_key = prefix + name
        if value is None:
            if txn.delete(raw_key, db=db):
                tally.removed(raw_key)
        elif txn.replace(raw_key, seal("keyed", raw_key, value), db=db) is None:
            tally.added(raw_key)


def clear_group(txn: Any, dbs: Mapping[str, Any], prefix: bytes, logs: KeyedLogs | None,
                tally: KeyTally, log_tally: KeyTally) -> None:  # fmt: skip
    """Writer thread: delete the group's keyed state, its table's range and its log."""
    for name, counted in (("keyed", tally), ("keyed_log", log_tally)):
        with txn.cursor(db=dbs[name]) as cursor:
            found = cursor.set_range(prefix)
            while found and (key := bytes(cursor.key())).startswith(prefix):
                counted.removed(key)
                found = cursor.delete()
    if logs is not None:
        logs.keep(prefix, GroupLog())


def log_range(
    read: LogRead, table: Iterator[tuple[bytes, bytes]], start: bytes, stop: bytes | None, limit: int
) -> list[KeyedEntry]:
    """Up to ``limit`` keys from ``start`` to ``stop`` (excluded): the log's entries over the table's.

    ``table`` yields the table's (key, value) from ``start`` in key order, up
    to ``stop``; a key the log removed (None) is left out.
    """
    logged = read.scan(start, stop)
    found: list[KeyedEntry] = []
    entry = next(logged, None)
    row = next(table, None)
    while len(found) < limit and (row is not None or entry is not None):
        if entry is not None and (row is None or entry[0] <= row[0]):
            name, value = entry
            entry = next(logged, None)
            if row is not None and row[0] == name:
                row = next(table, None)
            if value is not None:
                found.append(KeyedEntry(name, value))
        else:
            assert row is not None
            found.append(KeyedEntry(row[0], row[1]))
            row = next(table, None)
    return found


def table_rows(
    txn: Any, db: Any, prefix: bytes, start: bytes, stop: bytes | None
) -> Iterator[tuple[bytes, bytes]]:
    """The table's (key, value) of a group from ``start`` to ``stop`` (excluded), in key order."""
    end = None if stop is None else prefix + stop
    with txn.cursor(db=db) as cursor:
        more = cursor.set_range(prefix + start)
        while more:
            raw_key = bytes(cursor.key())
            if not raw_key.startswith(prefix) or (end is not None and raw_key >= end):
                return
            yield raw_key[len(prefix) :], unseal(bytes(cursor.value()), db="keyed", key=raw_key)
            more = cursor.next()
