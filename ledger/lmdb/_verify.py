"""What a ledger's LMDB file must hold for its records to be believed: checked at open and by ``check``.

A damaged value fails its checksum when read; a damaged *key* is worse: the
record moves elsewhere, and the lookup that should find it finds nothing,
which reads as history never written (a new stream, a new group, a fresh
budget, a node that never ran). So before a ledger is used,
:func:`verify_open` reads the part of it that a missing record could hide in
and that stays small as history grows:

* LMDB's main database holds exactly the ledger's named databases (a
  damaged name is an unknown entry and a missing database; no database is
  ever created in a ledger that exists, see :mod:`ledger.lmdb._env`);
* ``meta`` holds the schema record and, from schema 4, the manifests
  (:mod:`ledger.lmdb._manifest`);
* ``streams``, ``groups``, ``attempts``, ``nodes``, ``graph_runs``,
  (from schema 5) ``keyed`` and (from 6) ``keyed_log`` are read whole: every record's checksum (it
  covers the database's name and the key, so a record under a damaged key
  fails it), keys in strictly increasing order, every key found again by a
  lookup (a damaged branch page would send lookups elsewhere), the
  manifests' counts and digests, and the references between records
  (``streams/_store/_integrity.py``; a keyed record belongs to a group its
  stream's descriptor lists, since a group's keyed state goes in the
  commit that removes it);
* ``messages`` only where an open of each stream will read: from the
  lowest frontier of its groups to the last appended, every run present,
  contiguous and sound. Messages every group acknowledged are not read
  (a stream's history), and ``messages`` checks the ones it shows.

The cost is proportional to the number of streams, groups, pending budgets,
runs, keys of keyed state and unacknowledged messages, never to the
messages ever appended.
A problem refuses the ledger with :class:`~ledger.CorruptRecordError` (a
checksum or decode failure) or :class:`~ledger.MissingRecordError` (a
record missing, moved, or contradicting another), before anything is
written. ``python -m ledger check`` runs the same checks over every
record, messages included, and lists every problem instead of stopping at
the first (:func:`check_records`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any, Final

import lmdb
import msgspec

from streams import GroupFrontier
from streams.store import (
    MAX_KEY_BYTES,
    AttemptRecord,
    NodeAttemptRecord,
    NodeCheckpoint,
    ScopeRecord,
    StreamDescriptor,
    checkpoint_problems,
    group_problems,
    node_problems,
    stream_id_problems,
    tail_floor,
    tail_problems,
)

from .._errors import CorruptRecordError, MissingRecordError
from .._format import LedgerMeta
from .._graph_runs import GraphRunRecord
from .._progress import SILENT, Progress
from .._runs import RunRecord
from ._layout import (
    CHECKPOINT_PREFIX,
    COUNTER_KEY,
    DATABASES,
    DELETED_PREFIX,
    DESCRIPTOR_PREFIX,
    INDEX_PREFIX,
    META_KEY,
    NODE_ATTEMPT_PREFIX,
    RUN_PREFIX,
    SCHEMA_VERSION,
    U64,
    databases_of,
    group_key,
    index_key,
    keyed_prefix,
    keyed_prefix_of,
    node_record_key,
)
from ._manifest import MANIFESTED, KeyTally, Manifest, manifest_key
from ._seal import decode_record, unseal
from ._view import LmdbView

__all__ = ["check_records", "missing_databases", "verify_open"]

_DECODERS: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}
_meta: Final = msgspec.msgpack.Decoder(LedgerMeta)
_NODE_LAYOUTS: Final = {b"a": NodeAttemptRecord, b"s": ScopeRecord, b"n": NodeCheckpoint, b"r": RunRecord}


def _decoder(tp: type[Any]) -> msgspec.msgpack.Decoder[Any]:
    found = _DECODERS.get(tp)
    if found is None:
        found = _DECODERS[tp] = msgspec.msgpack.Decoder(tp)
    return found


def missing_databases(names: set[bytes], schema_version: int) -> list[str]:
    """The databases a ledger's main database should hold and does not, or holds and should not.

    A ledger made by a build before creation was one commit may lack the
    databases after the last one it made (its creation was interrupted): it
    holds nothing yet, and is not damaged. Anything else is. The databases
    are those of the ledger's schema (:func:`databases_of`): one of schema 4
    or before holds no ``keyed`` database until its upgrade.
    """
    known = [name.encode() for name in databases_of(schema_version)]
    problems = [
        f"LMDB's main database holds {name!r}, which is no database of a ledger (a damaged name?)"
        for name in sorted(names - {name.encode() for name in DATABASES})
    ]
    present = [name in names for name in known]
    if present != sorted(present, reverse=True):  # not a prefix of the creation order
        problems.extend(
            f"database {name.decode()!r} is missing from LMDB's main database (its name is damaged?)"
            for name, held in zip(known, present, strict=True)
            if not held
        )
    return problems


def verify_open(
    txn: Any, dbs: Mapping[str, Any], *, path: object, manifests: bool, schema_version: int
) -> dict[str, KeyTally]:
    """Refuse a ledger whose records contradict each other; the manifests as found (for an upgrade).

    ``manifests`` says whether the ledger keeps them (schema 4). Raises
    :class:`CorruptRecordError` at the first record that fails its checksum
    and :class:`MissingRecordError` for a record missing or moved.
    """
    checker = _Checker(txn, dbs, problems=None, manifests=manifests, schema_version=schema_version)
    checker.run(whole_messages=False)
    if checker.found:
        more = f" (and {len(checker.found) - 1} more problems)" if len(checker.found) > 1 else ""
        raise MissingRecordError(
            f"ledger {path} is damaged: {checker.found[0]}{more}. Nothing was written; see every problem "
            "with python -m ledger check and restore the ledger from a copy"
        )
    return checker.tallies


def check_records(
    txn: Any,
    dbs: Mapping[str, Any],
    problems: list[str],
    records: dict[str, int],
    *,
    progress: Progress = SILENT,
) -> None:
    """Every record and reference of the ledger, messages included; each problem appended to ``problems``.

    ``progress`` counts the records read, of the entries LMDB says its databases hold.
    """
    manifests = any(txn.get(manifest_key(db), db=dbs["meta"]) is not None for db in MANIFESTED)
    raw = txn.get(META_KEY, db=dbs["meta"])
    schema_version = SCHEMA_VERSION  # a damaged schema record is a problem of its own
    with contextlib.suppress(CorruptRecordError):
        if raw is not None:
            schema_version = decode_record(bytes(raw), _meta, db="meta", key=META_KEY).schema_version
            manifests |= schema_version >= 4
    checker = _Checker(
        txn,
        dbs,
        problems=problems,
        manifests=manifests,
        records=records,
        schema_version=schema_version,
        progress=progress,
    )
    progress.phase("checking", _entries(txn, dbs) if progress.live else None)
    checker.run(whole_messages=True)


def _entries(txn: Any, dbs: Mapping[str, Any]) -> int | None:
    """The records the databases hold, as LMDB counts them (no total if it cannot: the check will say why)."""
    try:
        return sum(int(txn.stat(handle)["entries"]) for handle in dbs.values())
    except lmdb.Error:
        return None


class _Checker:
    """One pass over a ledger's records. ``problems`` None: raise at the first damaged record."""

    def __init__(
        self,
        txn: Any,
        dbs: Mapping[str, Any],
        *,
        problems: list[str] | None,
        manifests: bool,
        schema_version: int,
        records: dict[str, int] | None = None,
        progress: Progress = SILENT,
    ) -> None:
        self.txn = txn
        self.progress = progress
        self.schema_version = schema_version
        self.dbs = dbs
        self.listing = problems
        self.found: list[str] = [] if problems is None else problems
        self.manifests = manifests
        self.records: dict[str, int] = {} if records is None else records
        self.tallies: dict[str, KeyTally] = {}

    def problem(self, text: str) -> None:
        self.found.append(text)

    def items(self, db: str, *, lookups: bool = True) -> Iterator[tuple[bytes, bytes]]:
        """Every record of ``db`` in key order, each found again by a lookup when ``lookups``."""
        handle = self.dbs.get(db)
        if handle is None:
            return
        tally = self.tallies[db] = KeyTally()
        previous: bytes | None = None
        get = self.txn.get
        advance = self.progress.advance
        with self.txn.cursor(db=handle) as cursor:
            for raw_key, raw_value in cursor:
                key, value = bytes(raw_key), bytes(raw_value)
                self.records[db] = self.records.get(db, 0) + 1
                advance()
                if previous is not None and key <= previous:
                    self.problem(f"record {key.hex()} in database {db!r} is out of key order (a damaged key)")
                previous = key
                if lookups and get(key, db=handle) is None:
                    self.problem(
                        f"record {key.hex()} in database {db!r} is not found by its key (a damaged page)"
                    )
                if db in MANIFESTED:
                    tally.added(key)
                yield key, value

    def decode(self, db: str, key: bytes, value: bytes, tp: type[Any]) -> Any:
        try:
            return decode_record(value, _decoder(tp), db=db, key=key)
        except CorruptRecordError as exc:
            if self.listing is None:
                raise
            self.problem(str(exc))
            return None

    def sealed(self, db: str, key: bytes, value: bytes) -> bool:
        try:
            unseal(value, db=db, key=key)
        except CorruptRecordError as exc:
            if self.listing is None:
                raise
            self.problem(str(exc))
            return False
        return True

    def run(self, *, whole_messages: bool) -> None:
        with self.txn.cursor() as cursor:  # LMDB's main database: the names of the named ones
            names = {bytes(key) for key in cursor.iternext(keys=True, values=False)}
        damaged = missing_databases(names, self.schema_version)
        for text in damaged:
            self.problem(text)
        if damaged:
            return  # the databases under their names are not the ledger's: nothing else can be believed
        if self.listing is not None:  # check says what an interrupted creation lacks
            for name in databases_of(self.schema_version):
                if name.encode() not in names:
                    self.problem(f"database {name!r} is missing: the ledger's creation was interrupted")
        meta = self.meta()
        descriptors = self.streams()
        frontiers = self.groups(descriptors)
        self.messages(descriptors, frontiers, whole=whole_messages)
        self.attempts(descriptors)
        self.keyed(descriptors)
        self.nodes()
        self.graph_runs()
        for db in MANIFESTED:
            self.compare_manifest(db, meta.get(db))

    def meta(self) -> dict[str, Manifest]:
        manifests: dict[str, Manifest] = {}
        keys = {manifest_key(db): db for db in MANIFESTED}
        for key, value in self.items("meta"):
            if key == META_KEY:
                self.sealed("meta", key, value)  # read and checked as the schema when the ledger opened
            elif key in keys:
                found = self.decode("meta", key, value, Manifest)
                if found is not None:
                    manifests[keys[key]] = found
            else:
                self.problem(f"record {key.hex()} in database 'meta' has no known layout")
        return manifests

    def compare_manifest(self, db: str, manifest: Manifest | None) -> None:
        if not self.manifests:
            return
        if db not in self.dbs:  # an older schema's keyed database, or an interrupted creation's
            if manifest is not None and manifest.keys:
                self.problem(f"database {db!r} is missing, its manifest says it holds {manifest.keys} keys")
            return
        if manifest is None:
            self.problem(f"the manifest of database {db!r} is missing")
            return
        held = self.tallies.get(db, KeyTally()).as_manifest()
        if held != manifest:
            self.problem(
                f"database {db!r} holds {held.keys} keys, its manifest says {manifest.keys}"
                + ("" if held.keys != manifest.keys else " with other keys")
                + ": a record is missing or sits under another key"
            )

    def streams(self) -> dict[int, StreamDescriptor]:
        counter = 0
        index: dict[bytes, int] = {}
        descriptors: dict[int, StreamDescriptor] = {}
        deleted: set[int] = set()  # ids of deleted streams, never allocated again
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
            elif key.startswith(DELETED_PREFIX) and len(key) == 9:  # the tombstone of a deleted stream
                if self.decode("streams", key, value, str) is not None:
                    deleted.add(U64.unpack_from(key, 1)[0])
            else:
                self.problem(f"record {key.hex()} in database 'streams' has no known layout")
        for key, stream_id in index.items():
            desc = descriptors.get(stream_id)
            if desc is None:
                self.problem(f"stream id {stream_id} (index {key.hex()}) has no descriptor")
            elif index_key(desc.ref) != key:
                self.problem(
                    f"index {key.hex()} names stream {stream_id}, whose descriptor is for {desc.ref}"
                )
        for stream_id, desc in descriptors.items():
            if index.get(index_key(desc.ref)) != stream_id:
                self.problem(f"stream {desc.ref} (id {stream_id}) has no index entry naming it")
        for stream_id in sorted(deleted & descriptors.keys()):
            self.problem(
                f"stream {descriptors[stream_id].ref} (id {stream_id}) has a descriptor and a tombstone"
            )
        for text in stream_id_problems(counter, descriptors.keys() | deleted):
            self.problem(text)
        return descriptors

    def groups(self, descriptors: dict[int, StreamDescriptor]) -> dict[int, dict[str, GroupFrontier]]:
        found: dict[int, dict[str, GroupFrontier]] = {stream_id: {} for stream_id in descriptors}
        for key, value in self.items("groups"):
            frontier = self.decode("groups", key, value, GroupFrontier)
            if frontier is None:
                continue
            stream_id = U64.unpack_from(key)[0] if len(key) >= 8 else 0
            if stream_id not in descriptors:
                self.problem(f"frontier {key.hex()} of group {frontier.group!r} belongs to no stream")
            elif group_key(stream_id, frontier.group) != key:
                self.problem(f"frontier of group {frontier.group!r} sits under another key, {key.hex()}")
            else:
                found[stream_id][frontier.group] = frontier
        for stream_id, desc in descriptors.items():
            for text in group_problems(desc, found[stream_id]):
                self.problem(text)
        return found

    def messages(
        self,
        descriptors: dict[int, StreamDescriptor],
        frontiers: dict[int, dict[str, GroupFrontier]],
        *,
        whole: bool,
    ) -> None:
        if "messages" not in self.dbs or "streams" not in self.dbs:
            return
        if not whole:  # what each stream's open will read, through the reads it will make
            dbs = {"streams": self.dbs["streams"], "messages": self.dbs["messages"]}
            for stream_id, desc in descriptors.items():
                floor = tail_floor(desc, frontiers[stream_id])
                if floor >= desc.appended:
                    continue
                view = LmdbView(self.txn, dbs, {desc.ref: stream_id})
                seqs = [m.seq for m in view.messages_after(desc.ref, floor)]
                for text in tail_problems(desc, floor, seqs):
                    self.problem(text)
            return
        next_seq: dict[int, int] = {}
        for key, value in self.items("messages", lookups=False):
            if len(key) != 16:
                self.problem(f"record {key.hex()} in database 'messages' has no known layout")
                continue
            stream_id, first = U64.unpack_from(key)[0], U64.unpack_from(key, 8)[0]
            run = self.decode("messages", key, value, list[bytes])
            owner = descriptors.get(stream_id)
            if run is None:
                continue
            if owner is None:
                self.problem(f"messages {key.hex()} belong to no stream (id {stream_id})")
                continue
            desc = owner
            expected = next_seq.get(stream_id)
            if expected is not None and first != expected:
                self.problem(f"stream {desc.ref}: messages jump from {expected - 1} to {first}")
            last = first + len(run) - 1
            if last > desc.appended:
                self.problem(f"stream {desc.ref}: messages up to {last}, beyond the {desc.appended} appended")
            next_seq[stream_id] = last + 1
        for stream_id, desc in descriptors.items():
            end = next_seq.get(stream_id)
            if desc.appended > desc.compacted_through and (end is None or end - 1 != desc.appended):
                held = 0 if end is None else end - 1
                self.problem(f"stream {desc.ref}: {desc.appended} appended, messages stored up to {held}")

    def attempts(self, descriptors: dict[int, StreamDescriptor]) -> None:
        for key, value in self.items("attempts"):
            if self.decode("attempts", key, value, AttemptRecord) is None:
                continue
            if len(key) < 8 or U64.unpack_from(key)[0] not in descriptors:
                self.problem(f"budget {key.hex()} belongs to no stream")

    def keyed(self, descriptors: dict[int, StreamDescriptor]) -> None:
        """Each key and log record well formed, of a group its stream lists (a removed group's go with it)."""
        prefixes = {keyed_prefix(i, group) for i, desc in descriptors.items() for group in desc.groups}
        for key, value in self.items("keyed"):
            if not self.sealed("keyed", key, value):
                continue
            prefix = keyed_prefix_of(key)
            if prefix is None:
                self.problem(f"record {key.hex()} in database 'keyed' has no known layout")
            elif prefix not in prefixes:
                self.unlisted(f"keyed state {key.hex()}", key, descriptors)
        for key, value in self.items("keyed_log"):
            pairs = self.decode("keyed_log", key, value, list[tuple[bytes, bytes | None]])
            if pairs is None:
                continue
            prefix = keyed_prefix_of(key[:-16])  # a group's prefix, a sequence number, eight random bytes
            if prefix is None or len(prefix) != len(key) - 16:
                self.problem(f"record {key.hex()} in database 'keyed_log' has no known layout")
            elif prefix not in prefixes:
                self.unlisted(f"keyed log record {key.hex()}", key, descriptors)
            elif any(len(name) > MAX_KEY_BYTES for name, _ in pairs):
                self.problem(f"keyed log record {key.hex()} holds a key longer than {MAX_KEY_BYTES} bytes")
            elif any(a[0] >= b[0] for a, b in itertools.pairwise(pairs)):  # reads bisect them
                self.problem(f"keyed log record {key.hex()} holds its keys out of order")

    def unlisted(self, what: str, key: bytes, descriptors: dict[int, StreamDescriptor]) -> None:
        """``what`` (under ``key``) is of no stream, or of a group its stream does not list."""
        owner = descriptors.get(U64.unpack_from(key)[0])
        if owner is None:
            self.problem(f"{what} belongs to no stream")
        else:
            self.problem(f"{what} of stream {owner.ref} belongs to no group the stream lists")

    def nodes(self) -> None:
        keys: set[bytes] = set()
        boundaries: list[NodeAttemptRecord] = []
        for key, value in self.items("nodes"):
            keys.add(key)
            layout = _NODE_LAYOUTS.get(key[:1])
            if layout is None:
                self.problem(f"record {key.hex()} in database 'nodes' has no known layout")
                continue
            record = self.decode("nodes", key, value, layout)
            if key[:1] == NODE_ATTEMPT_PREFIX and record is not None:
                boundaries.append(record)
        for text in node_problems(boundaries, lambda scope, node: node_record_key(scope, node) in keys):
            self.problem(text)

    def graph_runs(self) -> None:
        runs: list[str] = []
        checkpoints: list[str] = []
        for key, value in self.items("graph_runs"):
            if key.startswith(RUN_PREFIX):
                if self.decode("graph_runs", key, value, GraphRunRecord) is not None:
                    runs.append(key[len(RUN_PREFIX) :].decode(errors="replace"))
            elif key.startswith(CHECKPOINT_PREFIX):
                if self.sealed("graph_runs", key, value):  # a checkpoint of another format is not damage
                    checkpoints.append(key[len(CHECKPOINT_PREFIX) :].decode(errors="replace"))
            else:
                self.problem(f"record {key.hex()} in database 'graph_runs' has no known layout")
        for text in checkpoint_problems(runs, checkpoints):
            self.problem(text)
