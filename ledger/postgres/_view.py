"""A :class:`~streams.store.RecordView` over one PostgreSQL transaction: a query per kind of record.

The operations of :mod:`streams.store` call :meth:`load` first with every
record their request names, so a call reads its descriptors, then its
frontiers and budgets, in one round trip each; writes go out once, when the
call ends, as one pipelined batch per table.

A group's keyed state is read a batch of keys at a time (one statement for
any number of them) and written once a call, as one upsert and one deletion
per group; every statement on ``streamledger_keyed`` names its group, so it
is a range of the primary key's index: a serializable transaction locks the
index pages of the groups it touches, never the whole table, and calls for
other groups do not conflict with it. A keyed value is the handler's own
bytes, which cannot name their key as the other records do: each row keeps
a checksum of its stream, group, key and value instead (:func:`keyed_seal`),
checked on every read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar
from zlib import crc32

import msgspec

from streams import GroupFrontier, StreamRef
from streams.store import (
    AttemptKey,
    AttemptRecord,
    CachedView,
    GroupKey,
    KeyedEntry,
    StoredMessage,
    StreamDescriptor,
)

from .._errors import CorruptRecordError
from .._format import CHUNK

__all__ = ["PgView", "decode_row", "keyed", "keyed_seal", "run_row", "sound_digest", "unsealed_key"]

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_descriptor_decoder = msgspec.msgpack.Decoder(StreamDescriptor)
_frontier_decoder = msgspec.msgpack.Decoder(GroupFrontier)
_attempt_decoder = msgspec.msgpack.Decoder(AttemptRecord)
_run_decoder = msgspec.msgpack.Decoder(list[bytes])


def decode_row(decoder: msgspec.msgpack.Decoder[T], raw: bytes, what: str) -> T:
    """``raw`` as ``decoder`` reads it; one that does not decode is damage (:class:`CorruptRecordError`)."""
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(
            f"{what} does not decode as its layout ({exc}); the ledger is damaged"
        ) from None


def keyed(record: T, holds: object, key: object, what: str) -> T:
    """``record``, read from the row of ``key``, if what it names (``holds``) is that key.

    A row carries no seal (:mod:`ledger.lmdb._seal` frames every LMDB value
    with one): its contents name its key instead, so a row found under
    another key, edited by hand or restored into the wrong place, is damage
    on every read path, not only to ``check``.
    """
    if holds != key:
        raise CorruptRecordError(f"{what} is kept under {key!r} but names {holds!r}; the ledger is damaged")
    return record


#: Where every keyed row's checksum starts: the table's name.
_KEYED_SEED: Final = crc32(b"streamledger_keyed\0")


def keyed_seal(stream_id: int, group: str, key: bytes, value: bytes) -> int:
    """The checksum a keyed row keeps (its ``seal``): CRC-32 over its stream, group, key and value."""
    return crc32(value, crc32(_encoder.encode((stream_id, group, key)), _KEYED_SEED))


def unsealed_key(stream_id: int, group: str, key: bytes, value: bytes, seal: int) -> str | None:
    """What is wrong with a keyed row whose checksum does not match it (None: it matches)."""
    if seal == keyed_seal(stream_id, group, key, value):
        return None
    return (
        f"the keyed state of group {group!r} of stream id {stream_id} holds key {key.hex()} with "
        "another row's checksum (its key, group, stream or value was damaged)"
    )


def _sealed(stream_id: int, group: str, key: bytes, value: bytes, seal: int) -> bytes:
    problem = unsealed_key(stream_id, group, key, value, seal)
    if problem is not None:
        raise CorruptRecordError(f"{problem}; the ledger is damaged")
    return value


def run_row(conn: Any, table: str, columns: str, run_id: str) -> tuple[Any, ...] | None:
    """The ``columns`` of run ``run_id``'s row in ``table``, found by its id or by its digest.

    A run's id is kept twice, as ``run_id`` and as ``id_digest``
    (``md5(run_id)``, unique): a row whose ``run_id`` was rewritten is still
    found by the digest of the id asked for, and one whose digest was
    rewritten by its id; either way the two disagree, and that is damage. A
    run that is not there is one neither finds: never a run whose row moved.
    """
    rows = conn.execute(
        f"SELECT run_id, id_digest = md5(run_id), {columns} FROM {table}"
        " WHERE run_id = %s OR id_digest = md5(%s)",
        (run_id, run_id),
    ).fetchall()
    for found, sound, *_ in rows:
        if found != run_id or not sound:
            raise CorruptRecordError(
                f"the row of run {run_id!r} in {table} is kept under run id {found!r} with "
                f"{'its' if sound else 'another'} id's digest; the ledger is damaged"
            )
    return None if not rows else tuple(rows[0][2:])


def sound_digest(sound: bool, run_id: str, table: str) -> None:
    """A row listed whole: its ``id_digest`` is its ``run_id``'s (else damage, as :func:`run_row` says)."""
    if not sound:
        raise CorruptRecordError(
            f"the row of run {run_id!r} in {table} holds another id's digest; the ledger is damaged"
        )


@contextmanager
def _by_index(conn: Any) -> Iterator[None]:
    """The block's statements planned without sequential scans, whatever the tables' sizes.

    A serializable transaction that scans a table locks all of it: every
    other transaction writing a row anywhere in it then conflicts with it,
    and one of the two is aborted and run again. Scanning the primary key's
    index locks only the pages it read, so the calls of other groups go on.
    The planner would scan a small table (or a group holding much of it)
    instead; this tells it not to. An error aborts the transaction (or its
    savepoint), and the setting with it.
    """
    conn.execute("SET LOCAL enable_seqscan = off")
    yield
    conn.execute("SET LOCAL enable_seqscan TO DEFAULT")


def _frontier(raw: bytes, ref: StreamRef, group: str) -> GroupFrontier:
    """The frontier kept in the row of ``group``: a row holding another group's is damage, as a
    frontier under another key is on LMDB (rows carry no seals: their contents name their keys)."""
    frontier = decode_row(_frontier_decoder, raw, f"the frontier of group {group!r} of {ref}")
    if frontier.group != group:
        raise CorruptRecordError(
            f"the row of group {group!r} of stream {ref} holds the frontier of group {frontier.group!r}; "
            "the ledger is damaged"
        )
    return frontier


class PgView(CachedView):
    """One call's records, in transaction ``conn``; ``known_ids`` maps streams to ids already committed.

    Ids found or allocated here are collected in :attr:`ids`, for the caller
    to remember once the transaction committed.
    """

    __slots__ = ("_compactions", "_conn", "_known_ids", "_runs", "ids")

    def __init__(self, conn: Any, known_ids: Mapping[StreamRef, int]) -> None:
        super().__init__()
        self._conn = conn
        self._known_ids = known_ids
        self.ids: dict[StreamRef, int] = {}
        # written by flush, never before: a call that raises has written nothing at all
        self._runs: list[tuple[StreamRef, int, int, bytes]] = []
        self._compactions: dict[StreamRef, int] = {}

    def flush(self) -> None:
        """Write everything the call changed, in one pipeline: one round trip to the server.

        Until then the call has only read: one whose rules raise leaves
        nothing behind, with no savepoint to roll back to.
        """
        with self._conn.pipeline(), self._conn.cursor() as cur:
            super().flush()
            if self._compactions:
                cur.executemany(
                    "DELETE FROM streamledger_messages WHERE stream_id = %s AND last_seq <= %s",
                    [(self._require_id(ref), through) for ref, through in self._compactions.items()],
                )
                self._compactions.clear()
            if self._runs:
                runs, self._runs = self._runs, []
                cur.executemany(
                    "INSERT INTO streamledger_messages (stream_id, first_seq, last_seq, payloads)"
                    " VALUES (%s, %s, %s, %s)",
                    [(self._require_id(ref), first, last, raw) for ref, first, last, raw in runs],
                )

    @property
    def connection(self) -> Any:
        """The connection whose transaction this view reads and writes (other views may share it)."""
        return self._conn

    # -- ids -------------------------------------------------------------------------------

    def _known(self, ref: StreamRef) -> int | None:
        found = self._known_ids.get(ref)
        return self.ids.get(ref) if found is None else found

    def _resolve(self, refs: Iterable[StreamRef]) -> None:
        """Learn the ids of ``refs`` not known yet, in one query."""
        missing = [ref for ref in dict.fromkeys(refs) if self._known(ref) is None]
        if not missing:
            return
        rows = self._conn.execute(
            "SELECT r.i, s.id FROM unnest(%s::text[], %s::text[], %s::text[]) WITH ORDINALITY"
            " AS r(scope, node, key, i) JOIN streamledger_streams s USING (scope, node, key)",
            ([r.scope for r in missing], [r.node for r in missing], [r.key for r in missing]),
        ).fetchall()
        for i, stream_id in rows:
            self.ids[missing[i - 1]] = stream_id

    def _require_id(self, ref: StreamRef) -> int:
        self._resolve((ref,))
        stream_id = self._known(ref)
        if stream_id is None:
            stream_id = self._conn.execute(
                "INSERT INTO streamledger_streams (scope, node, key) VALUES (%s, %s, %s) RETURNING id",
                (ref.scope, ref.node, ref.key),
            ).fetchone()[0]
            self.ids[ref] = stream_id
        return stream_id

    # -- CachedView ------------------------------------------------------------------------

    def _read_descriptors(self, refs: Sequence[StreamRef]) -> list[StreamDescriptor | None]:
        """The descriptors, and with them (in the same round trip) every frontier of their streams."""
        rows = self._conn.execute(
            "SELECT r.i, s.id, s.descriptor, g.name, g.frontier"
            " FROM unnest(%s::text[], %s::text[], %s::text[]) WITH ORDINALITY AS r(scope, node, key, i)"
            " JOIN streamledger_streams s USING (scope, node, key)"
            " LEFT JOIN streamledger_groups g ON g.stream_id = s.id",
            ([r.scope for r in refs], [r.node for r in refs], [r.key for r in refs]),
        ).fetchall()
        found: list[StreamDescriptor | None] = [None] * len(refs)
        for i, stream_id, raw, group, frontier in rows:
            ref = refs[i - 1]
            self.ids.setdefault(ref, stream_id)
            if group is not None and (ref, group) not in self._groups:
                self._groups[(ref, group)] = _frontier(frontier, ref, group)
            if raw is not None and found[i - 1] is None:
                desc = decode_row(_descriptor_decoder, raw, f"the descriptor of stream {ref}")
                if desc.ref != ref:
                    raise CorruptRecordError(
                        f"stream {ref} has id {stream_id}, whose descriptor is for {desc.ref}; "
                        "the ledger is damaged"
                    )
                found[i - 1] = desc
        return found

    def _read_groups(self, keys: Sequence[tuple[StreamRef, str]]) -> list[GroupFrontier | None]:
        self._resolve(ref for ref, _ in keys)
        found: list[GroupFrontier | None] = [None] * len(keys)
        asked = [(i, self._known(ref), group) for i, (ref, group) in enumerate(keys)]
        asked = [(i, stream_id, group) for i, stream_id, group in asked if stream_id is not None]
        if not asked:
            return found
        rows = self._conn.execute(
            "SELECT r.i, g.frontier FROM unnest(%s::int[], %s::bigint[], %s::text[])"
            " AS r(i, stream_id, name) JOIN streamledger_groups g USING (stream_id, name)",
            ([a[0] for a in asked], [a[1] for a in asked], [a[2] for a in asked]),
        ).fetchall()
        for i, raw in rows:
            ref, group = keys[i]
            found[i] = _frontier(raw, ref, group)
        return found

    def _read_attempts(self, keys: Sequence[AttemptKey]) -> list[AttemptRecord | None]:
        self._resolve(key.ref for key in keys)
        found: list[AttemptRecord | None] = [None] * len(keys)
        asked = [(i, self._known(key.ref), key) for i, key in enumerate(keys)]
        rows_asked = [(i, stream_id, key) for i, stream_id, key in asked if stream_id is not None]
        if not rows_asked:
            return found
        rows = self._conn.execute(
            "SELECT r.i, a.record FROM unnest(%s::int[], %s::bigint[], %s::text[], %s::bigint[], %s::text[],"
            " %s::text[]) AS r(i, stream_id, grp, seq, node, parent)"
            " JOIN streamledger_attempts a USING (stream_id, grp, seq, node, parent)",
            (
                [a[0] for a in rows_asked],
                [a[1] for a in rows_asked],
                [a[2].group for a in rows_asked],
                [a[2].seq for a in rows_asked],
                [a[2].node for a in rows_asked],
                [a[2].parent_attempt for a in rows_asked],
            ),
        ).fetchall()
        for i, raw in rows:
            found[i] = decode_row(_attempt_decoder, raw, f"the budget of {keys[i]}")
        return found

    def _delete_budgets(self, groups: Sequence[tuple[StreamRef, str]]) -> None:
        self._resolve(ref for ref, _ in groups)
        params = [(self._known(ref), group) for ref, group in groups if self._known(ref) is not None]
        if params:
            with self._conn.cursor() as cur:
                cur.executemany("DELETE FROM streamledger_attempts WHERE stream_id = %s AND grp = %s", params)

    def _read_keyed(self, ref: StreamRef, group: str, keys: Sequence[bytes]) -> list[bytes | None]:
        """Any number of keys in one statement (and one round trip)."""
        self._resolve((ref,))
        stream_id = self._known(ref)
        if stream_id is None or not keys:
            return [None] * len(keys)
        with self._conn.pipeline(), _by_index(self._conn):
            found = self._conn.execute(
                "SELECT key, value, seal FROM streamledger_keyed WHERE stream_id = %s AND grp = %s"
                " AND key = ANY(%s::bytea[])",
                (stream_id, group, list(keys)),
            )
        stored = {key: _sealed(stream_id, group, key, value, seal) for key, value, seal in found.fetchall()}
        return [stored.get(key) for key in keys]

    def _clear_keyed(self, groups: Sequence[GroupKey]) -> None:
        self._resolve(ref for ref, _ in groups)
        params = [(self._known(ref), group) for ref, group in groups if self._known(ref) is not None]
        if params:
            with _by_index(self._conn), self._conn.cursor() as cur:
                cur.executemany("DELETE FROM streamledger_keyed WHERE stream_id = %s AND grp = %s", params)

    def _write_keyed(self, writes: Mapping[GroupKey, Mapping[bytes, bytes | None]]) -> None:
        """Every group's values in one upsert, and each group's deleted keys in one statement."""
        put: list[tuple[int, str, bytes, bytes, int]] = []
        gone: list[tuple[int, str, list[bytes]]] = []
        for (ref, group), values in writes.items():
            stream_id = self._require_id(ref)
            put.extend(
                (stream_id, group, key, value, keyed_seal(stream_id, group, key, value))
                for key, value in values.items()
                if value is not None
            )
            if deleted := [key for key, value in values.items() if value is None]:
                gone.append((stream_id, group, deleted))
        with _by_index(self._conn), self._conn.cursor() as cur:
            if gone:
                cur.executemany(
                    "DELETE FROM streamledger_keyed WHERE stream_id = %s AND grp = %s"
                    " AND key = ANY(%s::bytea[])",
                    gone,
                )
            if put:
                cur.execute(
                    "INSERT INTO streamledger_keyed (stream_id, grp, key, value, seal)"
                    " SELECT * FROM unnest(%s::bigint[], %s::text[], %s::bytea[], %s::bytea[], %s::bigint[])"
                    " ON CONFLICT (stream_id, grp, key)"
                    " DO UPDATE SET value = EXCLUDED.value, seal = EXCLUDED.seal",
                    [list(column) for column in zip(*put, strict=True)],  # one array a column
                )

    def _write(
        self,
        descriptors: Mapping[StreamRef, StreamDescriptor],
        groups: Mapping[tuple[StreamRef, str], GroupFrontier | None],
        attempts: Mapping[AttemptKey, AttemptRecord | None],
    ) -> None:
        with self._conn.cursor() as cur:
            if descriptors:
                cur.executemany(
                    "UPDATE streamledger_streams SET descriptor = %s WHERE id = %s",
                    [(_encoder.encode(desc), self._require_id(ref)) for ref, desc in descriptors.items()],
                )
            put = [
                (self._require_id(ref), g, _encoder.encode(f))
                for (ref, g), f in groups.items()
                if f is not None
            ]
            if put:
                cur.executemany(
                    "INSERT INTO streamledger_groups (stream_id, name, frontier) VALUES (%s, %s, %s)"
                    " ON CONFLICT (stream_id, name) DO UPDATE SET frontier = EXCLUDED.frontier",
                    put,
                )
            gone = [(self._known(ref), g) for (ref, g), f in groups.items() if f is None]
            if gone := [(i, g) for i, g in gone if i is not None]:
                cur.executemany("DELETE FROM streamledger_groups WHERE stream_id = %s AND name = %s", gone)
            budgets = [
                (self._require_id(k.ref), k.group, k.seq, k.node, k.parent_attempt, _encoder.encode(r))
                for k, r in attempts.items()
                if r is not None
            ]
            if budgets:
                cur.executemany(
                    "INSERT INTO streamledger_attempts (stream_id, grp, seq, node, parent, record)"
                    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (stream_id, grp, seq, node, parent)"
                    " DO UPDATE SET record = EXCLUDED.record",
                    budgets,
                )
            forgotten = [
                (self._known(k.ref), k.group, k.seq, k.node, k.parent_attempt)
                for k, r in attempts.items()
                if r is None
            ]
            if forgotten := [f for f in forgotten if f[0] is not None]:
                cur.executemany(
                    "DELETE FROM streamledger_attempts"
                    " WHERE stream_id = %s AND grp = %s AND seq = %s AND node = %s AND parent = %s",
                    forgotten,
                )

    def keyed_range(
        self, ref: StreamRef, group: str, start: bytes, stop: bytes | None, limit: int
    ) -> list[KeyedEntry]:
        self._resolve((ref,))
        stream_id = self._known(ref)
        if stream_id is None:
            return []
        sql = (
            "SELECT key, value, seal FROM streamledger_keyed WHERE stream_id = %s AND grp = %s AND key >= %s"
        )
        params: tuple[object, ...] = (stream_id, group, start)
        if stop is not None:  # a bound the index scan stops at, not one it checks to the group's end
            sql, params = f"{sql} AND key < %s", (*params, stop)
        with self._conn.pipeline(), _by_index(self._conn):
            found = self._conn.execute(f"{sql} ORDER BY key LIMIT %s", (*params, limit))
        rows = found.fetchall()
        return [KeyedEntry(key, _sealed(stream_id, group, key, value, seal)) for key, value, seal in rows]

    # -- messages --------------------------------------------------------------------------

    def put_messages(self, ref: StreamRef, first_seq: int, payloads: Sequence[bytes]) -> None:
        """Keep runs of messages for :meth:`flush` (no call reads back what it appends)."""
        self._runs.extend(
            (ref, first_seq + start, first_seq + start + len(run) - 1, _encoder.encode(run))
            for start in range(0, len(payloads), CHUNK)
            if (run := list(payloads[start : start + CHUNK]))
        )

    def messages_after(self, ref: StreamRef, seq: int) -> Iterable[StoredMessage]:
        self._resolve((ref,))
        stream_id = self._known(ref)
        if stream_id is None:
            return []
        rows = self._conn.execute(
            "SELECT first_seq, payloads FROM streamledger_messages WHERE stream_id = %s AND last_seq > %s"
            " ORDER BY first_seq",
            (stream_id, seq),
        ).fetchall()
        found: list[StoredMessage] = []
        for first, raw in rows:
            payloads: list[bytes] = decode_row(_run_decoder, raw, f"a run of messages of {ref}")
            for i, payload in enumerate(payloads):
                if first + i > seq:
                    found.append(StoredMessage(first + i, payload))
        return found

    def compact(self, ref: StreamRef, through: int) -> None:
        """Delete every run whose messages are all at or below ``through``, when the call ends."""
        self._compactions[ref] = max(through, self._compactions.get(ref, 0))
