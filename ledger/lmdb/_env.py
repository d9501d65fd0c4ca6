"""The LMDB environment behind a ledger: files, locking, schema, reads, map growth.

One :class:`LedgerEnv` exists per ledger path in a process (LMDB refuses to
open an environment twice in one process) and one process owns a ledger path
at a time, enforced by an ``flock`` on the ledger's directory itself (a lock
file could be deleted while its owner runs; the directory cannot). Reads are
memory-mapped lookups of a microsecond or two and run inline on the caller's
thread. Writes go through :meth:`LedgerEnv.submit` to the group committer
(:mod:`ledger.lmdb._commit`), which exists only while :meth:`LedgerEnv.serve`
runs; it reaches the environment through :meth:`LedgerEnv.begin_write` and
:meth:`LedgerEnv.grow_map`. The databases and their keys are stated in
:mod:`ledger.lmdb._layout`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import lmdb
import msgspec

from streams.store import ATTR

from .._committer import BeforeCommit, GroupCommitter, ServesWrites, WriteTicket
from .._errors import (
    CorruptRecordError,
    DamagedLedgerError,
    LedgerClosedError,
    LedgerInUseError,
    LedgerLockedError,
    LedgerPathError,
    LedgerReadOnlyError,
    MapFullError,
    MissingRecordError,
    NotALedgerError,
    SchemaVersionError,
    UnfinishedLedgerError,
)
from .._format import CODEC, CODEC_VERSION, LedgerMeta
from ._commit import LmdbBatches, LmdbWrite
from ._files import check_data_file, damaged, holds_no_commit, never_held_records
from ._keyed_log import KeyedLogs
from ._layout import DATABASES, KEYED_LOG_SCHEMA, KEYED_SCHEMA, META_KEY, SCHEMA_VERSION, databases_of
from ._manifest import MANIFESTED, Manifest, put_manifest
from ._owner import OWNER_FILE, clear_owner, read_owner, write_owner
from ._seal import decode_record, seal

__all__ = ["CODEC", "CODEC_VERSION", "SCHEMA_VERSION", "LedgerEnv", "WriteTicket", "write_mode"]

FORMAT: Final = "streamledger"
#: The older schemas this build opens: its first write open upgrades one to SCHEMA_VERSION in one commit
#: (schema 3 gets its manifests, 3 and 4 the ``keyed`` database, each ``keyed_log``); read-only, as it is.
_UPGRADABLE: Final = (3, 4, 5)


T = TypeVar("T")

#: Called with each step of a new ledger's creation (a fault hook for tests; see :meth:`LedgerEnv.open`).
CreationStep = Callable[[str], None]

_open_paths: set[str] = set()
_open_paths_lock = threading.Lock()
_lock_fds: set[int] = set()  # owner-lock descriptors of this process's open ledgers


def _after_fork_in_child() -> None:
    """A forked child owns no ledger: it drops its copies of the owner locks.

    ``flock`` locks belong to the open file, which a fork shares: a child
    keeping its copy would keep the parent's ledger locked after the parent
    closed it. The child's LMDB environments are unusable anyway (LMDB must
    never be used across a fork); it may open the ledger afresh.
    """
    for fd in list(_lock_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()
    _open_paths.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


_meta_decoder = msgspec.msgpack.Decoder(LedgerMeta)


def write_mode(sync: bool) -> dict[str, bool]:
    """How a ledger opens LMDB for writing; the benches' raw loops open it the same way.

    ``sync`` fsyncs data and meta pages at every commit (durable across power
    loss as far as the disk keeps its word); without it a killed process
    loses nothing, a power loss may lose the last commits. No readahead: the
    ledger reads a few pages at a time.
    """
    return {"sync": sync, "metasync": sync, "readahead": False}


class LedgerEnv(ServesWrites[LmdbWrite]):
    """An open ledger environment. Create with :meth:`open`; serve writes inside :meth:`serving`."""

    def __init__(
        self,
        path: Path,
        env: lmdb.Environment,
        lock_fd: int,
        *,
        max_map_size: int,
        readonly: bool = False,
    ) -> None:
        self.path = path
        self._path_key = str(path)
        self._env = env
        self._lock_fd = lock_fd
        self.max_map_size = max_map_size
        self.readonly = readonly
        self._dbs = _open_databases(env)
        self._committer = None  # while serving writes
        self._map_lock = threading.Lock()
        self._closed = False
        #: The groups' keyed logs as decoded in this process (``ledger/lmdb/_keyed_log.py``).
        self.keyed_logs = KeyedLogs()
        #: Called on the writer thread after each committed batch with its writes and successes (bench).
        self.batch_observer: Callable[[int, int], None] | None = None
        #: Called on the writer thread after each batch with ``time.perf_counter()`` readings: when the
        #: loop handed it over, when the writer thread began it and when it was committed (bench).
        self.batch_timer: Callable[[float, float, float], None] | None = None

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        sync: bool = True,
        map_size: int = 64 << 20,
        max_map_size: int = 1 << 40,
        on_creation_step: CreationStep | None = None,
    ) -> LedgerEnv:
        """Open (or create) the ledger at ``path`` for this process alone.

        The map starts at ``map_size`` (at most ``max_map_size``) and grows up
        to ``max_map_size``. A new ledger is created by one commit (its schema
        record and every database); what a creation killed before that commit
        left holds nothing, and the ledger is created there afresh.
        ``on_creation_step`` is a fault hook for tests: while a ledger is
        created, it is called with the name of each step just before it is
        taken (``"directory"``, ``"lock"``, ``"lmdb_files"``, ``"schema"``)
        and with ``"created"`` once the creation committed.

        Raises :class:`NotALedgerError` when the path holds something else,
        :class:`SchemaVersionError` for another schema or codec version,
        :class:`LedgerReadOnlyError` when the ledger (or the place it would
        be created) cannot be written, :class:`MapFullError` when its
        databases do not fit in ``max_map_size``, :class:`LedgerLockedError`
        when another process owns it and :class:`LedgerInUseError` when this
        process has it open already. Nothing is written to a path that is
        refused.
        """
        if map_size < 1 or max_map_size < 1:
            raise ValueError(f"map_size and max_map_size must be positive, not {map_size} and {max_map_size}")
        p = Path(path)
        with _registered(p) as key:
            fresh = _check_path(p, create=create)
            step = on_creation_step if fresh else None
            _refuse_read_only(p, fresh=fresh)
            with _read_only_as_typed(p, fresh=fresh):
                if fresh:
                    _take_step(step, "directory")
                    _make_directory(p)
            _take_step(step, "lock")
            lock_fd = _take_owner_lock(p)
            try:
                with _read_only_as_typed(p, fresh=fresh):
                    _take_step(step, "lmdb_files")
                    env = lmdb.open(
                        str(p),
                        map_size=min(map_size, max_map_size),
                        max_dbs=len(DATABASES) + 4,
                        max_readers=256,
                        **write_mode(sync),
                    )
                try:
                    env.reader_check()
                    self = _complete(cls, p, env, lock_fd, max_map_size=max_map_size, step=step)
                    write_owner(p)  # who holds the lock, for an operator (inspect, a refused open)
                except lmdb.Error as exc:  # a damaged page met while reading the schema or databases
                    env.close()
                    raise damaged(p, exc) from None
                except BaseException:
                    env.close()
                    raise
            except BaseException:
                _lock_fds.discard(lock_fd)
                os.close(lock_fd)
                raise
        self._path_key = key
        return self

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str], *, verify: bool = True) -> LedgerEnv:
        """Open an existing ledger for reading, beside the process that owns it.

        The ledger is verified first (:mod:`ledger.lmdb._verify`): one whose
        records are missing, moved or damaged is refused with
        :class:`CorruptRecordError` or :class:`MissingRecordError`.
        ``verify=False`` opens it anyway, for ``python -m ledger check`` and
        ``backup``, which report the damage themselves.

        Takes no owner lock and writes nothing: readers register in LMDB's
        reader table like any other. On a read-only filesystem, where no
        process can be writing, LMDB finds its lock file cannot be opened for
        writing and reads without it. Raises the same errors as :meth:`open`
        for a path that is not a ledger or of another version, and
        :class:`UnfinishedLedgerError` for a ledger whose creation stopped
        before its first commit (it holds nothing; :meth:`open` finishes it).
        """
        p = Path(path)
        with _registered(p) as key:
            _check_path(p, create=False)  # checks the data file before it is mapped
            try:
                env = lmdb.open(
                    str(p), readonly=True, max_dbs=len(DATABASES) + 4, readahead=False, max_readers=256
                )
            except lmdb.Error as exc:
                raise NotALedgerError(f"{p} cannot be opened for reading: {exc}") from None
            try:
                self = cls(p, env, -1, max_map_size=0, readonly=True)
                if verify:
                    self._verify(upgrade=False)
            except lmdb.Error as exc:
                env.close()
                raise damaged(p, exc) from None
            except BaseException:
                env.close()
                raise
        self._path_key = key
        return self

    # -- reads ---------------------------------------------------------------------------

    def db(self, name: str) -> Any:
        """The handle of a named database from :data:`DATABASES`.

        A ledger opened read-only whose creation was interrupted may lack a
        database (opening it for writing completes it); :meth:`has_db` tells,
        and asking for a missing one raises :class:`NotALedgerError`.
        """
        try:
            return self._dbs[name]
        except KeyError:
            raise NotALedgerError(
                f"ledger {self.path} has no {name!r} database: its creation was interrupted; open it "
                "for writing once (python -m ledger demo, or open_ledger) to complete it"
            ) from None

    def has_db(self, name: str) -> bool:
        return name in self._dbs

    def databases(self) -> dict[str, Any]:
        """The handles of the named databases the ledger holds, by name."""
        return dict(self._dbs)

    def _verify(self, *, upgrade: bool) -> None:
        """Refuse a ledger whose records are missing, moved or damaged; upgrade an older schema's.

        Reads one snapshot (:func:`~ledger.lmdb._verify.verify_open`); nothing is
        written unless it is sound and ``upgrade`` (opened for writing) finds
        it of an older schema: then, in one commit with the schema record of
        :data:`SCHEMA_VERSION`, a schema 3 ledger gets its manifests, computed
        from what it holds, a schema 3 or 4 one the empty ``keyed``
        database and its manifest, and one of schema 5 or before the empty
        ``keyed_log`` and its manifest. Read-only, an older ledger has no
        ``keyed`` database and reads as holding no keyed state, or no
        ``keyed_log`` and reads its keyed state from ``keyed`` alone.
        """
        from ._verify import verify_open  # the record modules it reads import this one

        with self.read() as txn:
            raw = txn.get(META_KEY, db=self._dbs["meta"])
            if raw is None:
                raise MissingRecordError(f"ledger {self.path} lost its schema record; restore it from a copy")
            meta = _decode_meta(bytes(raw), self.path)
            tallies = verify_open(
                txn,
                self._dbs,
                path=self.path,
                manifests=meta.schema_version >= 4,
                schema_version=meta.schema_version,
            )
        if meta.schema_version >= SCHEMA_VERSION or not upgrade:
            return
        added: dict[str, Any] = {}
        with self._env.begin(write=True) as txn:
            meta_db = self._dbs["meta"]
            if meta.schema_version < 4:
                for name in (m for m in MANIFESTED if m not in ("keyed", "keyed_log")):  # below
                    found = tallies.get(name)
                    put_manifest(txn, meta_db, name, Manifest() if found is None else found.as_manifest())
            for name, since in (("keyed", KEYED_SCHEMA), ("keyed_log", KEYED_LOG_SCHEMA)):
                if meta.schema_version < since:
                    added[name] = self._env.open_db(name.encode(), txn=txn)
                    found = tallies.get(name)  # None: the database is new
                    put_manifest(txn, meta_db, name, Manifest() if found is None else found.as_manifest())
            record = msgspec.structs.replace(meta, schema_version=SCHEMA_VERSION)
            txn.put(META_KEY, seal("meta", META_KEY, msgspec.msgpack.encode(record)), db=meta_db)
        self._dbs.update(added)  # their handles are valid once the commit is

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read transaction on the caller's thread, seeing the last committed batch.

        An LMDB error while reading (a damaged page) is :class:`CorruptRecordError`.
        """
        self._check_open()
        with self._map_lock:
            try:
                txn = self._env.begin(buffers=False)
            except lmdb.MapResizedError:
                # the owning process grew the map; adopt its size (read-only ledgers only)
                self._env.set_mapsize(0)
                txn = self._env.begin(buffers=False)
            except lmdb.Error as exc:
                raise damaged(self.path, exc) from None
            with txn:
                try:
                    yield txn
                except lmdb.Error as exc:
                    raise damaged(self.path, exc) from None

    # -- writes --------------------------------------------------------------------------

    def submit(self, fn: Callable[[lmdb.Transaction], T]) -> WriteTicket[T]:
        """Queue ``fn`` for the next write batch and return its ticket.

        ``fn`` runs on the writer thread inside a nested write transaction:
        if it raises, its writes are rolled back and the ticket raises the
        same error; the other writes of the batch are unaffected. It must be
        a pure function of the transaction (it may run again after the map
        grows) and must not touch event-loop state.
        """
        self._check_open()
        if self.readonly:
            raise LedgerClosedError(f"ledger {self.path} was opened read-only; it takes no writes")
        committer = self._committer
        if committer is None:
            raise LedgerClosedError(
                f"ledger {self.path} is not serving writes; open it with `async with open_ledger(...)`"
            )
        ticket: WriteTicket[T] = committer.submit(fn)
        return ticket

    async def write(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Submit ``fn`` and wait until its batch is durable (withdrawn if cancelled before it left)."""
        return await self.submit(fn).wait()

    def _new_committer(self, before_commit: BeforeCommit | None) -> GroupCommitter[LmdbWrite]:
        """The committer :meth:`serve` runs: LMDB batches (`ledger/lmdb/_commit.py`) on its writer thread."""
        batches = LmdbBatches(self)
        return GroupCommitter(
            batches.commit,
            where=f"ledger {self.path}",
            attributes={ATTR.LEDGER: self.path.name},
            timer=lambda: self.batch_timer,
            before_commit=before_commit,
            inline=batches,
        )

    # -- the committer's access to the environment (writer thread) -------------------------

    def begin_write(self, parent: lmdb.Transaction | None = None) -> lmdb.Transaction:
        """A write transaction, nested in ``parent`` if given; the writer thread's only."""
        return self._env.begin(write=True, parent=parent)

    def last_txn_id(self) -> int:
        """The id of the last write transaction committed to the ledger."""
        return int(self._env.info()["last_txnid"])

    def grow_map(self) -> bool:
        """Double the map up to its limit; False if it is at the limit already."""
        current = self._env.info()["map_size"]
        if current >= self.max_map_size:
            return False
        with self._map_lock:
            self._env.set_mapsize(min(current * 2, self.max_map_size))
        return True

    # -- housekeeping ----------------------------------------------------------------------

    def reader_check(self) -> int:
        """Clear reader slots left by dead processes; return how many were cleared."""
        self._check_open()
        return int(self._env.reader_check())

    def copy_to(self, destination: Path) -> None:
        """Write a consistent, compacted copy of the ledger into the new directory ``destination``.

        LMDB's own copy, from one read transaction: it runs beside the owner's
        writes and holds exactly what was committed when it began.
        """
        self._check_open()
        destination.mkdir(parents=True)
        self._env.copy(str(destination), compact=True)

    def used_size(self) -> int:
        """Bytes of the map in use, up to its last page written: a compacted copy writes at most this."""
        self._check_open()
        return (int(self._env.info()["last_pgno"]) + 1) * int(self._env.stat()["psize"])

    def info(self) -> dict[str, int]:
        """LMDB's environment info (map size, last transaction id, readers)."""
        return {name: int(value) for name, value in self._env.info().items()}  # type: ignore[call-overload]

    def close(self) -> None:
        """Close the environment and release the owner lock. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._env.close()
        if self._lock_fd >= 0 and self._lock_fd in _lock_fds:
            clear_owner(self.path)
            _lock_fds.discard(self._lock_fd)
            os.close(self._lock_fd)
        with _open_paths_lock:
            _open_paths.discard(self._path_key)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosedError(f"ledger {self.path} is closed")


@contextmanager
def _registered(path: Path) -> Iterator[str]:
    """Claim ``path`` for this process (LMDB opens an environment once per process).

    The claim is kept when the block succeeds (:meth:`LedgerEnv.close` gives it
    back) and dropped when it raises.
    """
    key = str(path.resolve())
    with _open_paths_lock:
        if key in _open_paths:
            raise LedgerInUseError(
                f"ledger {path} is already open in this process; share the open Ledger instead"
            )
        _open_paths.add(key)
    try:
        yield key
    except BaseException:
        with _open_paths_lock:
            _open_paths.discard(key)
        raise


def _open_databases(env: lmdb.Environment) -> dict[str, Any]:
    """The named databases the ledger holds; never one created (a damaged name would be laundered).

    Which ones it should hold is :meth:`LedgerEnv._verify`'s to say.
    """
    found: dict[str, Any] = {}
    for name in DATABASES:
        try:
            found[name] = env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            continue
    return found


def _main_names(env: lmdb.Environment) -> set[bytes]:
    """The names LMDB's main database holds: the ledger's named databases."""
    with env.begin() as txn, txn.cursor() as cursor:
        return {bytes(key) for key in cursor.iternext(keys=True, values=False)}


def _make_directory(path: Path) -> None:
    """Make a new ledger's directory and its parents; a typed error, with nothing made, if it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileNotFoundError, NotADirectoryError, FileExistsError) as exc:
        raise LedgerPathError(
            f"cannot create the ledger directory {path}: {exc.strerror or exc} ({exc.filename})"
        ) from None


def _check_path(path: Path, *, create: bool) -> bool:
    """Refuse paths that are not ledgers without writing anything; return True if new.

    New is a missing or empty directory, or one holding only the files a
    creation makes and no commit (:func:`~ledger.lmdb._files.holds_no_commit`): a
    creation killed at any instant before its one commit left it, and it
    holds nothing. A data file with a commit, or anything else, is checked
    as a ledger and refused if it is not one; nothing is ever emptied.
    """
    if path.exists() and not path.is_dir():
        raise NotALedgerError(f"{path} is a file, not a ledger directory")
    names = set(os.listdir(path)) if path.exists() else set()
    creation_files_only = names <= _CREATION_FILES
    if creation_files_only and (not names or holds_no_commit(path)):
        return _new(path, names, create=create)
    if "data.mdb" not in names:
        raise NotALedgerError(
            f"{path} is a directory with other files and no ledger; choose an empty or new path"
        )
    check_data_file(path)  # before LMDB maps it: a truncated file would kill the process
    try:
        probe = lmdb.open(str(path), readonly=True, lock=False, max_dbs=len(DATABASES) + 4)
    except lmdb.Error as exc:
        raise NotALedgerError(f"{path}/data.mdb is not an LMDB file: {exc}") from None
    try:
        if creation_files_only and _is_empty(probe):  # committed to, yet holding nothing at all
            if not never_held_records(path):
                raise DamagedLedgerError(
                    f"{path}/data.mdb: its current meta page holds nothing while the other one names the "
                    "ledger's databases: a meta page is damaged; restore the ledger from a copy"
                )
            return _new(path, names, create=create)
        _read_schema(probe, path)
    except lmdb.Error as exc:  # a damaged page met while reading the schema
        raise damaged(path, exc) from None
    finally:
        probe.close()
    return False


#: The files a ledger's creation makes; a directory holding only these and no data is a fresh one.
_CREATION_FILES: Final = frozenset({"owner.lock", "lock.mdb", "data.mdb", OWNER_FILE})


def _new(path: Path, names: set[str], *, create: bool) -> bool:
    """A path that holds no ledger yet: True when this open creates one, else the typed refusal."""
    if create:
        return True
    if not names:
        raise NotALedgerError(f"{path} holds no ledger (and this command does not create one)")
    raise UnfinishedLedgerError(
        f"{path} holds a ledger whose creation did not finish: the process creating it stopped before "
        "its first commit, so it holds no records. Open it for writing (open_ledger) to finish it"
    )


def _take_step(step: CreationStep | None, name: str) -> None:
    if step is not None:
        step(name)


def _is_empty(env: lmdb.Environment) -> bool:
    """Whether an LMDB environment holds nothing at all (not even a named database)."""
    with env.begin() as txn:
        return int(txn.stat()["entries"]) == 0


def _decode_meta(raw: bytes, path: Path) -> LedgerMeta:
    """The schema record; one of schema 2 or before (its checksum covered the value only) reads too.

    so that an older ledger is refused as of another schema, not as damaged.
    """
    try:
        return decode_record(raw, _meta_decoder, db="meta", key=META_KEY)
    except CorruptRecordError:
        if len(raw) >= 4 and int.from_bytes(raw[:4], "big") == zlib.crc32(raw[4:]):
            with contextlib.suppress(msgspec.DecodeError):
                older = _meta_decoder.decode(raw[4:])
                if older.schema_version < 3:
                    return older
        raise


def _read_schema(env: lmdb.Environment, path: Path) -> LedgerMeta | None:
    try:
        meta_db = env.open_db(b"meta", create=False)
    except lmdb.NotFoundError:
        raise NotALedgerError(f"{path} is an LMDB environment but not a streamledger ledger") from None
    with env.begin(db=meta_db) as txn:
        raw = txn.get(META_KEY)
    if raw is None:
        raise NotALedgerError(f"{path} has no schema record; it is not a streamledger ledger")
    meta = _decode_meta(bytes(raw), path)
    if meta.format != FORMAT:
        raise NotALedgerError(f"{path} holds a {meta.format!r} store, not a streamledger ledger")
    if (
        meta.schema_version not in (*_UPGRADABLE, SCHEMA_VERSION)
        or meta.codec != CODEC
        or meta.codec_version != CODEC_VERSION
    ):
        raise SchemaVersionError(
            f"{path} was written with schema {meta.schema_version} and codec "
            f"{meta.codec}/{meta.codec_version}; this build reads schema {SCHEMA_VERSION} and "
            f"codec {CODEC}/{CODEC_VERSION}. Open it with the matching streamledger release."
        )
    return meta


def _ensure_schema(env: lmdb.Environment, path: Path, step: CreationStep | None) -> None:
    """Read the schema record, or create the ledger: the record and every database in one commit.

    Before that commit the ledger holds nothing, after it everything a new
    ledger holds, so a creation killed at any instant is either finished or
    never committed (and :func:`_check_path` takes it for new).
    """
    try:
        env.open_db(b"meta", create=False)
    except lmdb.NotFoundError:
        pass
    else:
        meta = _read_schema(env, path)
        _complete_interrupted_creation(env, path, SCHEMA_VERSION if meta is None else meta.schema_version)
        return
    record = LedgerMeta(FORMAT, SCHEMA_VERSION, CODEC, CODEC_VERSION)
    _take_step(step, "schema")
    with env.begin(write=True) as txn:
        for name in DATABASES:
            env.open_db(name.encode(), txn=txn)
        meta_db = env.open_db(b"meta", txn=txn)
        txn.put(META_KEY, seal("meta", META_KEY, msgspec.msgpack.encode(record)), db=meta_db)
        for name in MANIFESTED:
            put_manifest(txn, meta_db, name, Manifest())
    _take_step(step, "created")


def _complete_interrupted_creation(env: lmdb.Environment, path: Path, schema_version: int) -> None:
    """Make the databases a creation by an older build stopped before; refuse a damaged main database.

    Builds before creation was one commit made the databases one by one
    after the schema, so a ledger may lack the last few: it holds nothing in
    them yet. A database missing otherwise, or an entry that is no
    database's name, is damage (:func:`~ledger.lmdb._verify.missing_databases`):
    refused before anything is written. Only the databases of the ledger's
    own schema are made: an older schema's ``keyed`` database comes with its
    upgrade (:meth:`LedgerEnv._verify`), in the commit that raises its schema.
    """
    from ._verify import missing_databases  # the record modules it reads import this one

    names = _main_names(env)
    problems = missing_databases(names, schema_version)
    if problems:
        raise MissingRecordError(
            f"ledger {path} is damaged: {problems[0]}. Nothing was written; see every problem with "
            "python -m ledger check and restore the ledger from a copy"
        )
    missing = [name for name in databases_of(schema_version) if name.encode() not in names]
    if missing:
        with env.begin(write=True) as txn:
            for name in missing:
                env.open_db(name.encode(), txn=txn)


def _complete(
    cls: type[LedgerEnv],
    path: Path,
    env: lmdb.Environment,
    lock_fd: int,
    *,
    max_map_size: int,
    step: CreationStep | None,
) -> LedgerEnv:
    """Check (or write) the schema and open the databases, growing the map up to its limit as needed.

    Both are idempotent, so a step the map could not hold is taken again
    once it has grown; a ledger whose creation does not fit in
    ``max_map_size`` is left uncommitted, which a later open with a larger
    limit creates afresh.
    """
    while True:
        try:
            _ensure_schema(env, path, step)
            self = cls(path, env, lock_fd, max_map_size=max_map_size)
            self._verify(upgrade=True)
            return self
        except lmdb.MapFullError:
            current = int(env.info()["map_size"])
            if current >= max_map_size:
                raise MapFullError(
                    f"ledger {path} does not fit in its map limit of {max_map_size} bytes: creating its "
                    "databases needs more. Open the ledger with a larger max_map_size"
                ) from None
            env.set_mapsize(min(current * 2, max_map_size))


def _refuse_read_only(path: Path, *, fresh: bool) -> None:
    """Refuse a ledger this process cannot write before anything is made or opened.

    A path that does not exist needs the nearest existing folder above it,
    where it is made; one that exists needs its files, and itself when one
    of them is missing. On a read-only filesystem even root may not write.
    """
    place = path
    while not place.exists() and place != place.parent:
        place = place.parent
    needed = [place]
    if place == path:
        files = [path / "data.mdb", path / "lock.mdb"]
        needed = [f for f in files if f.exists()]
        if len(needed) < len(files):
            needed.append(path)
    for target in needed:
        if not os.access(target, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
            raise _read_only_error(path, target, fresh=fresh)


def _read_only_error(path: Path, target: Path, *, fresh: bool) -> LedgerReadOnlyError:
    try:
        on_read_only_fs = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        on_read_only_fs = False
    why = "its filesystem is mounted read-only" if on_read_only_fs else f"this user may not write {target}"
    if fresh:
        return LedgerReadOnlyError(
            f"ledger {path} cannot be created: {target} is read-only ({why}); choose a writable path"
        )
    return LedgerReadOnlyError(
        f"ledger {path} is read-only ({why}): it cannot be opened for writing; "
        "python -m ledger inspect and check still read it"
    )


@contextmanager
def _read_only_as_typed(path: Path, *, fresh: bool) -> Iterator[None]:
    """A write refused because the place turned read-only after :func:`_refuse_read_only` looked."""
    try:
        yield
    except (OSError, lmdb.Error):
        try:
            _refuse_read_only(path, fresh=fresh)
        except LedgerReadOnlyError as refused:
            raise refused from None
        raise


def _take_owner_lock(path: Path) -> int:
    """Lock the ledger's directory itself: a lock file could be deleted while the owner runs."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        owner = read_owner(path)
        who = (
            f"process {owner['pid']} on {owner['host']} (since {owner['since']})"
            if owner is not None
            else "another process"
        )
        raise LedgerLockedError(f"ledger {path} is owned by {who}; stop it or use another path") from None
    _lock_fds.add(fd)
    return fd
