"""A :class:`~streams.store.RecordView` over one PostgreSQL transaction: a query per kind of record.

The operations of :mod:`streams.store` call :meth:`load` first with every
record their request names, so a call reads its descriptors (with every
frontier of their streams), then any other frontiers and budgets, in one
round trip each; writes go out once, when the call ends, as one statement
for all of the call's records (a data-modifying CTE a kind of record), each
column of rows one binary array (:mod:`ledger.postgres._arrays`).

A group's keyed state is read a batch of keys at a time (one statement for
any number of them) and written with the call's other records, two more
parts of its one statement (an upsert and a deletion, one row a key). A
read, and a clear of a whole group, names its group and is planned on the
primary key's index (:func:`_by_index`), so a serializable transaction
locks the index pages of the groups it touches, never the whole table, and
calls for other groups do not conflict with it; the upsert finds its rows
through that index too, as does the deletion of keys unless the planner
scans a table of a few pages. A keyed value is the handler's own
bytes, which cannot name their key as the other records do: each row keeps
a checksum of its stream, group, key and value instead (:func:`keyed_seal`),
checked on every read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, Protocol, TypeVar
from zlib import crc32

import msgspec
import psycopg

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
from ._arrays import Byteas, Int8s, Texts
from ._notify import CHANNEL, opened_topic

__all__ = [
    "Kept",
    "KeptStale",
    "PgView",
    "StatementFence",
    "decode_row",
    "keyed",
    "keyed_seal",
    "kept_stale",
    "lease_lost",
    "run_row",
    "sound_digest",
    "unsealed_key",
]

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
    savepoint), and the setting with it. (Not for the whole session: the
    write statement's other parts run slower planned so, 0.4 ms a call.)
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


#: The parts of a call's one write statement, by the :class:`_Writes` field holding their rows: one
#: data-modifying CTE a kind of record, its rows' columns as arrays of the kinds it names
#: (:mod:`ledger.postgres._arrays`: sent binary, dumped in one pass). The parts of one statement
#: touch distinct rows (a call writes each record once, and the runs it inserts lie above any it
#: compacts), so they may run in any order and see one snapshot, as the separate statements did.
_PARTS: Final[tuple[tuple[str, str, tuple[type[list[Any]], ...]], ...]] = (
    (
        "compactions",
        "DELETE FROM streamledger_messages m"
        " USING unnest(%b::bigint[], %b::bigint[]) AS c(stream_id, through)"
        " WHERE m.stream_id = c.stream_id AND m.last_seq <= c.through",
        (Int8s, Int8s),
    ),
    (
        "runs",
        "INSERT INTO streamledger_messages (stream_id, first_seq, last_seq, payloads)"
        " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bytea[])",
        (Int8s, Int8s, Int8s, Byteas),
    ),
    (
        "descriptors",
        "UPDATE streamledger_streams s SET descriptor = d.descriptor"
        " FROM unnest(%b::bigint[], %b::bytea[]) AS d(id, descriptor) WHERE s.id = d.id",
        (Int8s, Byteas),
    ),
    (
        "groups",
        "INSERT INTO streamledger_groups (stream_id, name, frontier)"
        " SELECT * FROM unnest(%b::bigint[], %b::text[], %b::bytea[])"
        " ON CONFLICT (stream_id, name) DO UPDATE SET frontier = EXCLUDED.frontier",
        (Int8s, Texts, Byteas),
    ),
    (
        "groups_gone",
        "DELETE FROM streamledger_groups g USING unnest(%b::bigint[], %b::text[]) AS d(stream_id, name)"
        " WHERE g.stream_id = d.stream_id AND g.name = d.name",
        (Int8s, Texts),
    ),
    (
        "budgets",
        "INSERT INTO streamledger_attempts (stream_id, grp, seq, node, parent, record)"
        " SELECT * FROM unnest(%b::bigint[], %b::text[], %b::bigint[], %b::text[], %b::text[], %b::bytea[])"
        " ON CONFLICT (stream_id, grp, seq, node, parent) DO UPDATE SET record = EXCLUDED.record",
        (Int8s, Texts, Int8s, Texts, Texts, Byteas),
    ),
    (
        "budgets_gone",
        "DELETE FROM streamledger_attempts a"
        " USING unnest(%b::bigint[], %b::text[], %b::bigint[], %b::text[], %b::text[])"
        " AS d(stream_id, grp, seq, node, parent)"
        " WHERE (a.stream_id, a.grp, a.seq, a.node, a.parent)"
        " = (d.stream_id, d.grp, d.seq, d.node, d.parent)",
        (Int8s, Texts, Int8s, Texts, Texts),
    ),
    (
        "keyed",
        "INSERT INTO streamledger_keyed (stream_id, grp, key, value, seal)"
        " SELECT * FROM unnest(%b::bigint[], %b::text[], %b::bytea[], %b::bytea[], %b::bigint[])"
        " ON CONFLICT (stream_id, grp, key) DO UPDATE SET value = EXCLUDED.value, seal = EXCLUDED.seal",
        (Int8s, Texts, Byteas, Byteas, Int8s),
    ),
    (
        "keyed_gone",
        "DELETE FROM streamledger_keyed k USING unnest(%b::bigint[], %b::text[], %b::bytea[])"
        " AS d(stream_id, grp, key) WHERE (k.stream_id, k.grp, k.key) = (d.stream_id, d.grp, d.key)",
        (Int8s, Texts, Byteas),
    ),
)

#: How many of the kept records a call used are no longer as the ledger holds them: each kept
#: descriptor compared with its stream's row, and each kept stream's frontiers, every one of them,
#: with its groups' rows (a group added or removed by another process counts too). It reads those
#: rows in the call's own transaction, as reading them again would, and on the snapshot the call's
#: writes start from.
_GUARD: Final = (
    "SELECT (SELECT count(*) FROM unnest(%b::bigint[], %b::bytea[]) AS k(id, descriptor)"
    " LEFT JOIN streamledger_streams s ON s.id = k.id WHERE s.descriptor IS DISTINCT FROM k.descriptor)"
    " + (SELECT count(*) FROM (SELECT stream_id, name, frontier FROM streamledger_groups"
    " WHERE stream_id = ANY(%b::bigint[])) AS g"
    " FULL JOIN unnest(%b::bigint[], %b::text[], %b::bytea[]) AS f(stream_id, name, frontier)"
    " ON g.stream_id = f.stream_id AND g.name = f.name WHERE g.frontier IS DISTINCT FROM f.frontier)"
    " AS stale"
)

#: What the statement answers when it checks kept records: it fails if any is stale, so the transaction
#: aborts in the statement itself and changes nothing, whether the statement went alone (its own
#: transaction) or in one that commits later.
#: PostgreSQL has no way to raise an error in plain SQL but a failing expression: a cast of text
#: naming :data:`_STALE` (the count makes the expression depend on the row, so it is never
#: evaluated ahead by the planner), which :func:`kept_stale` recognises.
_STALE: Final = "streamledger: kept records are stale"
_RAISE_IF_STALE: Final = (
    f"(SELECT CASE WHEN stale = 0 THEN 0 ELSE ('{_STALE} ' || stale)::int END FROM guard)"
)


def kept_stale(exc: BaseException) -> bool:
    """Whether ``exc`` is a write statement's own check finding a kept record stale (:class:`KeptStale`)."""
    return isinstance(exc, psycopg.errors.InvalidTextRepresentation) and _STALE in str(exc)


class StatementFence(Protocol):
    """A lease the write statement of each call made under it checks (:meth:`PgView.fence_with`).

    The statement reads the lease's row ``FOR SHARE`` and fails unless it
    holds the lease's token: a writer whose lease was taken over changes
    nothing, and one that holds it pays no round trip for the check. The
    row stays locked until the transaction ends, so a takeover racing the
    write waits for it, or the write sees the new token.
    """

    @property
    def token(self) -> int: ...

    def lease_row(self) -> tuple[str, tuple[object, ...]]:
        """A query of the lease's row, ``owner`` and ``token``, ``FOR SHARE``; its parameters (``%b``)."""
        ...

    def lost(self, holder: tuple[str, int] | None) -> Exception:
        """The error of a write refused for this lease, ``holder`` holding it now (None: nobody)."""
        ...


#: The statement's answer that fails it unless its lease still holds (:class:`StatementFence`): a
#: failing cast again, naming who holds the lease now (JSON), which :func:`lease_lost` reads back.
_LOST: Final = "streamledger: lease lost"
_RAISE_IF_LOST: Final = (
    "(SELECT CASE WHEN EXISTS (SELECT 1 FROM fence WHERE token = %b::bigint) THEN 0"
    f" ELSE ('{_LOST} ' || coalesce((SELECT json_build_array(owner, token)::text FROM fence), 'null'))::int"
    " END)"
)


def lease_lost(exc: BaseException) -> tuple[bool, tuple[str, int] | None]:
    """Whether ``exc`` is a write statement's fence failing, and who holds the lease now if so."""
    if not isinstance(exc, psycopg.errors.InvalidTextRepresentation):
        return False, None
    text = str(exc)
    if _LOST not in text:
        return False, None
    found = text.split(_LOST, 1)[1].split("\n", 1)[0].strip().rstrip('"').strip()
    try:
        holder = json.loads(found)
    except ValueError:
        return True, None
    if isinstance(holder, list) and len(holder) == 2:
        return True, (str(holder[0]), int(holder[1]))
    return True, None


#: Tells the streams a call appended to or whose descriptor it changed (appended, finished, failed,
#: reopened, their groups changed) to whoever follows them (:mod:`ledger.postgres._notify`): one
#: notification a stream, its id, sent by the server when (and only if) the transaction commits.
_NOTIFY: Final = f"SELECT pg_notify('{CHANNEL}', n.id::text) FROM unnest(%b::bigint[]) AS n(id)"


def _tells(before: StreamDescriptor | None, after: StreamDescriptor) -> bool:
    """Whether a descriptor's change is one a stream's followers must hear of (:data:`_NOTIFY`).

    A compaction, or the marks and position that come with an append (its
    runs tell of it), are not: a follower reads nothing new for them.
    """
    return before is None or _followed(before) != _followed(after)


def _followed(desc: StreamDescriptor) -> tuple[object, ...]:
    """What of a descriptor a follower reads anew when it changes."""
    return (
        desc.generation,
        desc.groups,
        desc.appended,
        desc.finished,
        desc.failed,
        desc.type_name,
        desc.partitions,
    )


#: The statement of each set of parts a call has (and whether it checks kept records): few sets
#: occur, so each text is built once, and PostgreSQL prepares each once per connection (psycopg's
#: cache of prepared statements).
_statements: dict[tuple[object, ...], str] = {}


def _statement(present: tuple[bool, ...], guarded: bool, told: bool, fence: str | None) -> str:
    key = (*present, guarded, told, fence)
    sql = _statements.get(key)
    if sql is None:
        parts = [part for (_, part, _), on in zip(_PARTS, present, strict=True) if on]
        if not (guarded or told or fence) and len(parts) == 1:
            sql = parts[0]
        else:
            ctes = [f"w{i} AS ({part})" for i, part in enumerate(parts)]
            answers = []
            if guarded:
                ctes.append(f"guard AS ({_GUARD})")
                answers.append(_RAISE_IF_STALE)
            if told:  # a CTE that only reads runs only if the statement reads it: count its rows
                ctes.append(f"told AS ({_NOTIFY})")
                answers.append("(SELECT count(*) FROM told)")
            if fence is not None:
                ctes.append(f"fence AS ({fence})")
                answers.append(_RAISE_IF_LOST)
            sql = "WITH " + ", ".join(ctes) + " SELECT " + (", ".join(answers) or "1")
        _statements[key] = sql
    return sql


class KeptStale(Exception):
    """A record the connection kept from an earlier call is not as the ledger holds it any more.

    Another process wrote it. The transaction is rolled back and its calls run
    again from records read afresh (:mod:`ledger.postgres._store`).
    """


#: What a connection keeps of a stream between calls: its id, its descriptor, and every frontier of
#: its groups by name, each with the bytes its row held (what :data:`_GUARD` compares).
Kept = tuple[int, StreamDescriptor, bytes, Mapping[str, tuple[GroupFrontier, bytes]]]


class _Writes:
    """The rows of one call's write statement, kind by kind, as :data:`_PARTS` names them."""

    __slots__ = (
        "budgets",
        "budgets_gone",
        "compactions",
        "descriptors",
        "groups",
        "groups_gone",
        "guard_descriptors",
        "guard_groups",
        "keyed",
        "keyed_gone",
        "runs",
        "told",
    )

    def __init__(self) -> None:
        #: The kept records the call used, to check in the statement (:data:`_GUARD`).
        self.guard_descriptors: list[tuple[int, bytes]] = []
        self.guard_groups: list[tuple[int, str, bytes]] = []
        #: The streams whose followers are told of the call (:data:`_NOTIFY`), beside those it appended to.
        self.told: list[int] = []
        self.compactions: list[tuple[int, int]] = []
        self.runs: list[tuple[int, int, int, bytes]] = []
        self.descriptors: list[tuple[int, bytes]] = []
        self.groups: list[tuple[int, str, bytes]] = []
        self.groups_gone: list[tuple[int, str]] = []
        self.budgets: list[tuple[int, str, int, str, str, bytes]] = []
        self.budgets_gone: list[tuple[int, str, int, str, str]] = []
        self.keyed: list[tuple[int, str, bytes, bytes, int]] = []
        self.keyed_gone: list[tuple[int, str, bytes]] = []

    def statement(self, fence: StatementFence | None = None) -> tuple[str, list[Any]]:
        """The statement writing every row, with one array a column (``""``: nothing to write), and
        checking ``fence`` if there is one (then there is a statement, even with nothing to write)."""
        present = tuple(bool(getattr(self, name)) for name, _, _ in _PARTS)
        guarded = bool(self.guard_descriptors)
        if not (guarded or any(present) or fence):
            return "", []
        params: list[Any] = []
        for (name, _, kinds), on in zip(_PARTS, present, strict=True):
            if on:
                rows: list[tuple[Any, ...]] = getattr(self, name)
                columns = zip(*rows, strict=True)
                params.extend(kind(column) for kind, column in zip(kinds, columns, strict=True))
        if guarded:
            ids = Int8s(stream_id for stream_id, _ in self.guard_descriptors)
            params += [ids, Byteas(raw for _, raw in self.guard_descriptors), ids]
            params += [
                Int8s(stream_id for stream_id, _, _ in self.guard_groups),
                Texts(name for _, name, _ in self.guard_groups),
                Byteas(raw for _, _, raw in self.guard_groups),
            ]
        told = dict.fromkeys(row[0] for row in self.runs)
        told.update(dict.fromkeys(self.told))
        if told:
            params.append(Int8s(told))
        fence_sql = None
        if fence is not None:
            fence_sql, fence_params = fence.lease_row()
            params += [*fence_params, fence.token]
        return _statement(present, guarded, bool(told), fence_sql), params


class PgView(CachedView):
    """One call's records, in transaction ``conn``; ``known_ids`` maps streams to ids already committed.

    Ids found or allocated here are collected in :attr:`ids`, for the caller
    to remember once the transaction committed.
    """

    __slots__ = (
        "_compactions",
        "_conn",
        "_fence",
        "_full",
        "_guarded",
        "_kept",
        "_known_ids",
        "_loaded",
        "_raw",
        "_runs",
        "_writes",
        "ids",
    )

    def __init__(
        self, conn: Any, known_ids: Mapping[StreamRef, int], kept: Mapping[StreamRef, Kept] | None = None
    ) -> None:
        super().__init__()
        self._conn = conn
        self._known_ids = known_ids
        #: Streams kept from earlier calls (:meth:`keep`): used instead of reading them, each then
        #: checked by the call's write statement (:data:`_GUARD`).
        self._kept: Mapping[StreamRef, Kept] = {} if kept is None else kept
        self._guarded: list[tuple[int, bytes, Mapping[str, tuple[GroupFrontier, bytes]]]] = []
        #: The bytes of each descriptor (by stream) and frontier (by stream and group) as its row holds
        #: them, read or written here; and the streams whose every frontier this view holds.
        self._raw: dict[object, bytes] = {}
        self._full: set[StreamRef] = set()
        self.ids: dict[StreamRef, int] = {}
        # written by flush, never before: a call that raises has written nothing at all
        self._runs: list[tuple[StreamRef, int, int, bytes]] = []
        self._compactions: dict[StreamRef, int] = {}
        self._writes: _Writes | None = None  # while flushing: the rows of its one statement
        self._fence: StatementFence | None = None  # the lease the write statement checks
        #: Each descriptor as it was read (or kept), to tell a change its followers must hear of.
        self._loaded: dict[StreamRef, StreamDescriptor] = {}

    def fence_with(self, fence: StatementFence) -> None:
        """Have the call's write statement check ``fence`` (:class:`StatementFence`) if it is the call's
        first statement: it goes then even with nothing to write, so a writer that lost its lease is
        told so. (A call that sent a statement before it checked the lease first, in its transaction:
        :attr:`~ledger.postgres._alone.LedgerConnection.pending_check`.)"""
        self._fence = fence

    def flush(self) -> None:
        """Write everything the call changed: its records in one statement, one round trip.

        Until then the call has only read: one whose rules raise leaves
        nothing behind, with no savepoint to roll back to. Its keyed values
        are parts of that statement too; the budgets and keyed states of
        whole groups it deletes (a rare call's: a group removed or moved) go
        first, in one pipeline with it.
        """
        writes = _Writes()
        self._writes = writes
        try:
            if self._has_group_deletions():
                with self._conn.pipeline():
                    super().flush()
                    self._write_records(writes)
            else:
                super().flush()
                self._write_records(writes)
        except psycopg.errors.InvalidTextRepresentation as exc:
            # the records' statement failed its own checks (in a pipeline, its error comes at the end);
            # in a shared one, it may be an earlier call's statement: the transaction tells it
            if getattr(self._conn, "deferred", False):
                raise
            if kept_stale(exc):
                raise KeptStale from None
            lost, holder = lease_lost(exc)
            if lost and self._fence is not None:
                raise self._fence.lost(holder) from None
            raise
        finally:
            self._writes = None

    def _has_group_deletions(self) -> bool:
        """Whether :meth:`flush` deletes whole groups' budgets or keyed states before the records."""
        return bool(self._dropped_budgets or self._cleared_keyed)

    def _write_records(self, writes: _Writes) -> None:
        """The call's compactions, runs, descriptors, frontiers, budgets and keyed values: one statement."""
        if self._compactions:
            for ref, through in self._compactions.items():
                writes.compactions.append((self._require_id(ref), through))
            self._compactions.clear()
        if self._runs:
            runs, self._runs = self._runs, []
            for ref, first, last, raw in runs:
                writes.runs.append((self._require_id(ref), first, last, raw))
        for stream_id, raw, groups in self._guarded:
            writes.guard_descriptors.append((stream_id, raw))
            writes.guard_groups.extend((stream_id, name, raw) for name, (_, raw) in groups.items())
        # nothing is fetched: a stale kept record (or a lost lease) fails the statement itself, which
        # changes nothing; so a call that sent nothing before it may send it alone, a transaction of
        # its own (one round trip: no BEGIN, no COMMIT). Its checks failing: see flush.
        conn = self._conn
        alone = getattr(conn, "write_alone", None)
        if self._fence is not None and conn.write_checks_lease():
            # the call's first statement: it checks the lease itself (:class:`StatementFence`), and
            # goes alone if it is its transaction's first too
            sql, params = writes.statement(self._fence)
        else:  # fenced or not, a statement before it checked its lease first
            sql, params = writes.statement()
            if not sql:
                return
        if alone is not None:
            alone()
        conn.execute(sql, params)

    @property
    def used_kept(self) -> bool:
        """Whether the call used records kept from an earlier one (then only its write checked them)."""
        return bool(self._guarded)

    def keep(self) -> tuple[dict[StreamRef, Kept], list[StreamRef]]:
        """What to keep of this call's streams once its transaction committed, and what to forget.

        A stream is kept with its descriptor and every one of its frontiers
        as this call left them, if it read them all (a stream's descriptor
        comes with all of its frontiers); any other stream whose descriptor
        or frontiers it read or wrote is forgotten.
        """
        kept: dict[StreamRef, Kept] = {}
        for ref in self._full:
            desc, raw, stream_id = self._descriptors.get(ref), self._raw.get(ref), self._known(ref)
            if desc is None or raw is None or stream_id is None:
                continue
            groups: dict[str, tuple[GroupFrontier, bytes]] = {}
            for (of, group), frontier in self._groups.items():
                if of == ref and frontier is not None:
                    raw_frontier = self._raw.get((ref, group))
                    if raw_frontier is None:
                        break
                    groups[group] = (frontier, raw_frontier)
            else:
                kept[ref] = (stream_id, desc, raw, groups)
        touched = {**dict.fromkeys(self._descriptors), **dict.fromkeys(ref for ref, _ in self._groups)}
        return kept, [ref for ref in touched if ref not in kept]

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
            "SELECT r.i, s.id FROM unnest(%b::text[], %b::text[], %b::text[]) WITH ORDINALITY"
            " AS r(scope, node, key, i) JOIN streamledger_streams s USING (scope, node, key)",
            (Texts(r.scope for r in missing), Texts(r.node for r in missing), Texts(r.key for r in missing)),
        ).fetchall()
        for i, stream_id in rows:
            self.ids[missing[i - 1]] = stream_id

    def _require_id(self, ref: StreamRef) -> int:
        self._resolve((ref,))
        stream_id = self._known(ref)
        if stream_id is None:
            stream_id = self._conn.execute(  # and tells the members waiting for its writer
                "WITH s AS (INSERT INTO streamledger_streams (scope, node, key) VALUES (%s, %s, %s)"
                " RETURNING id) SELECT id, pg_notify(%s, %s) FROM s",
                (ref.scope, ref.node, ref.key, CHANNEL, opened_topic(str(ref))),
            ).fetchone()[0]
            self.ids[ref] = stream_id
        return stream_id

    # -- CachedView ------------------------------------------------------------------------

    def _read_descriptors(self, refs: Sequence[StreamRef]) -> list[StreamDescriptor | None]:
        """The descriptors, and with them (in the same round trip) every frontier of their streams.

        Streams whose ids are known are found by id (one array), others by name; either way a
        row's names must be its stream's, and its descriptor must name it too.
        """
        kept = self._kept
        if kept and all(ref in kept for ref in refs):
            return [self._from_kept(ref, kept[ref]) for ref in refs]
        ids = [known for ref in refs if (known := self._known(ref)) is not None]
        if len(ids) == len(refs):
            rows = self._conn.execute(
                "SELECT r.i, s.id, s.descriptor, g.name, g.frontier, s.scope, s.node, s.key"
                " FROM unnest(%b::bigint[]) WITH ORDINALITY AS r(id, i)"
                " JOIN streamledger_streams s ON s.id = r.id"
                " LEFT JOIN streamledger_groups g ON g.stream_id = s.id",
                (Int8s(ids),),
            ).fetchall()
        else:
            rows = self._conn.execute(
                "SELECT r.i, s.id, s.descriptor, g.name, g.frontier, s.scope, s.node, s.key"
                " FROM unnest(%b::text[], %b::text[], %b::text[]) WITH ORDINALITY AS r(scope, node, key, i)"
                " JOIN streamledger_streams s USING (scope, node, key)"
                " LEFT JOIN streamledger_groups g ON g.stream_id = s.id",
                (Texts(r.scope for r in refs), Texts(r.node for r in refs), Texts(r.key for r in refs)),
            ).fetchall()
        found: list[StreamDescriptor | None] = [None] * len(refs)
        named: set[int] = set()
        for i, stream_id, raw, group, frontier, *names in rows:
            ref = refs[i - 1]
            if i not in named:
                if names != [ref.scope, ref.node, ref.key]:
                    raise CorruptRecordError(
                        f"stream {ref} has id {stream_id}, whose row names {tuple(names)!r}; "
                        "the ledger is damaged"
                    )
                named.add(i)
            self.ids.setdefault(ref, stream_id)
            if group is not None and (ref, group) not in self._groups:
                self._groups[(ref, group)] = _frontier(frontier, ref, group)
                self._raw[(ref, group)] = frontier
            if raw is not None and found[i - 1] is None:
                desc = decode_row(_descriptor_decoder, raw, f"the descriptor of stream {ref}")
                if desc.ref != ref:
                    raise CorruptRecordError(
                        f"stream {ref} has id {stream_id}, whose descriptor is for {desc.ref}; "
                        "the ledger is damaged"
                    )
                found[i - 1] = self._loaded[ref] = desc
                self._raw[ref] = raw
                self._full.add(ref)
        return found

    def _from_kept(self, ref: StreamRef, kept: Kept) -> StreamDescriptor:
        """A kept stream's descriptor, and its frontiers, to be checked by the call's write."""
        stream_id, desc, raw, groups = kept
        self.ids.setdefault(ref, stream_id)
        self._guarded.append((stream_id, raw, groups))
        self._raw[ref] = raw
        self._full.add(ref)
        self._loaded[ref] = desc
        for group, (frontier, raw_frontier) in groups.items():
            if (ref, group) not in self._groups:
                self._groups[(ref, group)] = frontier
                self._raw[(ref, group)] = raw_frontier
        return desc

    def _read_groups(self, keys: Sequence[tuple[StreamRef, str]]) -> list[GroupFrontier | None]:
        self._resolve(ref for ref, _ in keys)
        found: list[GroupFrontier | None] = [None] * len(keys)
        asked = [
            (i, stream_id, group)
            for i, (ref, group) in enumerate(keys)
            if (stream_id := self._known(ref)) is not None
        ]
        if not asked:
            return found
        rows = self._conn.execute(
            "SELECT r.i, g.frontier FROM unnest(%b::bigint[], %b::bigint[], %b::text[])"
            " AS r(i, stream_id, name) JOIN streamledger_groups g USING (stream_id, name)",
            (Int8s(a[0] for a in asked), Int8s(a[1] for a in asked), Texts(a[2] for a in asked)),
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
            "SELECT r.i, a.record FROM unnest(%b::bigint[], %b::bigint[], %b::text[], %b::bigint[],"
            " %b::text[], %b::text[]) AS r(i, stream_id, grp, seq, node, parent)"
            " JOIN streamledger_attempts a USING (stream_id, grp, seq, node, parent)",
            (
                Int8s(a[0] for a in rows_asked),
                Int8s(a[1] for a in rows_asked),
                Texts(a[2].group for a in rows_asked),
                Int8s(a[2].seq for a in rows_asked),
                Texts(a[2].node for a in rows_asked),
                Texts(a[2].parent_attempt for a in rows_asked),
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
        """Collect every group's values and deleted keys for the one statement :meth:`flush` ends with
        (a key is written once a call: it is put or deleted, never both)."""
        rows = self._writes
        assert rows is not None, "keyed state is written by flush only"
        for (ref, group), values in writes.items():
            stream_id = self._require_id(ref)
            for key, value in values.items():
                if value is None:
                    rows.keyed_gone.append((stream_id, group, key))
                else:
                    seal = keyed_seal(stream_id, group, key, value)
                    rows.keyed.append((stream_id, group, key, value, seal))

    def _write(
        self,
        descriptors: Mapping[StreamRef, StreamDescriptor],
        groups: Mapping[tuple[StreamRef, str], GroupFrontier | None],
        attempts: Mapping[AttemptKey, AttemptRecord | None],
    ) -> None:
        """Collect the changed records for the one statement :meth:`flush` ends with."""
        writes = self._writes
        assert writes is not None, "records are written by flush only"
        encode = _encoder.encode
        for ref, desc in descriptors.items():
            raw = self._raw[ref] = encode(desc)
            written = self._require_id(ref)
            writes.descriptors.append((written, raw))
            if _tells(self._loaded.get(ref), desc):
                writes.told.append(written)
        for (ref, group), frontier in groups.items():
            if frontier is not None:
                raw = self._raw[(ref, group)] = encode(frontier)
                writes.groups.append((self._require_id(ref), group, raw))
            else:
                self._raw.pop((ref, group), None)
                if (stream_id := self._known(ref)) is not None:
                    writes.groups_gone.append((stream_id, group))
        for key, record in attempts.items():
            if record is not None:
                stream_id = self._require_id(key.ref)
                budget = (stream_id, key.group, key.seq, key.node, key.parent_attempt, encode(record))
                writes.budgets.append(budget)
            elif (stream_id := self._known(key.ref)) is not None:
                writes.budgets_gone.append((stream_id, key.group, key.seq, key.node, key.parent_attempt))

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
