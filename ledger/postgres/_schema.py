"""The tables of a PostgreSQL ledger, made once, and its schema record, checked on every open.

Records are the LMDB ledger's, msgpack-encoded in ``bytea`` columns; the
keys are columns, so a group's budgets or a stream's runs are found by
index::

    table                    key                                  value
    streamledger_meta        name                                 LedgerMeta (format, schema, codec)
    streamledger_streams     id; unique (scope, node, key)        StreamDescriptor
    streamledger_messages    (stream_id, first_seq), last_seq     msgpack list of payloads: a run
    streamledger_groups      (stream_id, name)                    GroupFrontier
    streamledger_attempts    (stream_id, grp, seq, node, parent)  AttemptRecord
    streamledger_keyed       (stream_id, grp, key)                a group's value of a key, its seal
    streamledger_node_attempts (parent, node, position)           NodeAttemptRecord
    streamledger_scopes      scope                                ScopeRecord
    streamledger_nodes       (scope, node)                        NodeCheckpoint
    streamledger_runs        run_id, status, graph, version       RunRecord (ledger.run, ledger.resume)
    streamledger_leases      run_id                               owner, token, expiry of a run's lease
    streamledger_graph_runs  run_id                               GraphRunRecord, GraphCheckpoint (or null)

A database (or a schema of it, through ``search_path``) holds one ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import msgspec
import psycopg

from .._errors import (
    CorruptRecordError,
    DamagedLedgerError,
    MissingSchemaError,
    NotALedgerError,
    SchemaVersionError,
)
from .._format import CODEC, CODEC_VERSION, LedgerMeta

__all__ = ["FORMAT", "MIGRATIONS", "SCHEMA_VERSION", "TABLES", "ensure_schema", "migrate"]

#: What the schema record of a PostgreSQL ledger names as its format.
FORMAT: Final = "streamledger-postgres"
#: 2: runs and graph runs keep their id twice (id_digest); 3: consumer groups keep keyed state;
#: 4: the members of a consumer group and their leases on partitions.
SCHEMA_VERSION: Final = 4

#: The table of keyed state (schema 3), made with the others and by the migration from 2.
_KEYED: Final = """
-- a group's keyed state: keyed as its group's row, then by the key's bytes (bytea compares
-- bytewise), so a group's keys are one range of the primary key's index, in byte order; the
-- value is the handler's bytes, naming nothing: seal is a checksum of the row (_view.keyed_seal)
CREATE TABLE streamledger_keyed (
    stream_id bigint NOT NULL,
    grp text NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    seal bigint NOT NULL,
    PRIMARY KEY (stream_id, grp, key)
);
"""
#: Group members and their partition leases (schema 4), made with the others and by the migration
#: from 3 (see _members.py). ``stream`` names the partitioned stream as ``scope/node/key``.
_MEMBERS: Final = """
-- a member of a group, alive while its heartbeat has not expired
CREATE TABLE streamledger_members (
    stream text NOT NULL,
    grp text NOT NULL,
    member text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (stream, grp, member)
);
-- a member's claim on one partition of a group, valid while its owner's member row is alive:
-- its commits there check owner and token (renewing the member's row renews all its claims)
CREATE TABLE streamledger_partition_leases (
    stream text NOT NULL,
    grp text NOT NULL,
    partition integer NOT NULL,
    owner text NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (stream, grp, partition)
);
"""
_TABLES: Final = (
    """
CREATE TABLE streamledger_meta (
    name text PRIMARY KEY,
    value bytea NOT NULL
);
CREATE TABLE streamledger_streams (
    id bigserial PRIMARY KEY,
    scope text NOT NULL,
    node text NOT NULL,
    key text NOT NULL,
    descriptor bytea,
    UNIQUE (scope, node, key)
);
CREATE TABLE streamledger_messages (
    stream_id bigint NOT NULL,
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    payloads bytea NOT NULL,
    PRIMARY KEY (stream_id, first_seq)
);
CREATE TABLE streamledger_groups (
    stream_id bigint NOT NULL,
    name text NOT NULL,
    frontier bytea NOT NULL,
    PRIMARY KEY (stream_id, name)
);
CREATE TABLE streamledger_attempts (
    stream_id bigint NOT NULL,
    grp text NOT NULL,
    seq bigint NOT NULL,
    node text NOT NULL,
    parent text NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (stream_id, grp, seq, node, parent)
);
"""
    + _KEYED
    + """
CREATE TABLE streamledger_node_attempts (
    parent text NOT NULL,
    node text NOT NULL,
    position integer NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (parent, node, position)
);
CREATE TABLE streamledger_scopes (
    scope text PRIMARY KEY,
    record bytea NOT NULL
);
CREATE TABLE streamledger_nodes (
    scope text NOT NULL,
    node text NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (scope, node)
);
CREATE TABLE streamledger_runs (
    run_id text PRIMARY KEY,
    id_digest text NOT NULL UNIQUE,
    status text NOT NULL,
    graph text NOT NULL,
    version text NOT NULL,
    record bytea NOT NULL
);
CREATE TABLE streamledger_graph_runs (
    run_id text PRIMARY KEY,
    id_digest text NOT NULL UNIQUE,
    record bytea NOT NULL,
    checkpoint bytea
);
CREATE TABLE streamledger_leases (
    run_id text PRIMARY KEY,
    owner text NOT NULL,
    token bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
"""
    + _MEMBERS
)

#: Every table of a ledger, checked on open.
TABLES: Final = (
    "streamledger_meta",
    "streamledger_streams",
    "streamledger_messages",
    "streamledger_groups",
    "streamledger_attempts",
    "streamledger_keyed",
    "streamledger_node_attempts",
    "streamledger_scopes",
    "streamledger_nodes",
    "streamledger_runs",
    "streamledger_graph_runs",
    "streamledger_leases",
    "streamledger_members",
    "streamledger_partition_leases",
)

_meta_decoder = msgspec.msgpack.Decoder(LedgerMeta)


#: SQL that takes a ledger from schema N to N + 1, for each N below :data:`SCHEMA_VERSION`.
#: ``python -m ledger migrate URL`` applies them, in one transaction; opening never does.
#: 1 -> 2: a run's id is kept twice, as its key and as ``id_digest`` (``md5(run_id)``, unique), so
#: that a lookup of an id finds a row whose ``run_id`` was rewritten (see ``_runs.py``).
#: 2 -> 3: consumer groups keep keyed state, in a table of its own (empty: no group had any).
#: 3 -> 4: group members and their partition leases, in two tables (empty: no group had members).
MIGRATIONS: dict[int, str] = {
    1: """
ALTER TABLE streamledger_runs ADD COLUMN id_digest text;
UPDATE streamledger_runs SET id_digest = md5(run_id);
ALTER TABLE streamledger_runs ALTER COLUMN id_digest SET NOT NULL;
ALTER TABLE streamledger_runs ADD UNIQUE (id_digest);
ALTER TABLE streamledger_graph_runs ADD COLUMN id_digest text;
UPDATE streamledger_graph_runs SET id_digest = md5(run_id);
ALTER TABLE streamledger_graph_runs ALTER COLUMN id_digest SET NOT NULL;
ALTER TABLE streamledger_graph_runs ADD UNIQUE (id_digest);
""",
    2: _KEYED,
    3: _MEMBERS,
}


@contextmanager
def _locked(conn: Any) -> Iterator[None]:
    """A read-committed transaction of ``conn`` holding the schema lock (one opener or migrator at a time).

    Read committed, whatever the connection's level: a serializable (or
    repeatable-read) transaction reads as of its first statement, so one that
    waited for the lock would not see the ledger its holder made meanwhile;
    each statement of this one sees what was committed before it. The lock
    is the transaction's, so a holder stopped inside loses it with its
    session (``idle_in_transaction_session_timeout``).
    """
    level = conn.isolation_level
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('streamledger schema'))")
            yield
    finally:
        if not conn.closed:
            conn.isolation_level = level


def _lock(conn: Any, where: str) -> bool:
    """Whether a ledger is here (call it holding the schema lock, in the transaction).

    A ``search_path`` naming no schema that exists is :class:`~ledger.MissingSchemaError`: the
    ledger's tables would have nowhere to be (and PostgreSQL would refuse to make them).
    """
    schema, path = conn.execute("SELECT current_schema(), current_setting('search_path')").fetchone()
    if schema is None:
        raise MissingSchemaError(
            f"{where}: its search_path ({path}) names no schema that exists; create the schema "
            "(CREATE SCHEMA ...) or fix the URL's options (nothing was changed)"
        )
    return bool(conn.execute("SELECT to_regclass('streamledger_meta') IS NOT NULL").fetchone()[0])


def _create(conn: Any) -> None:
    conn.execute(_TABLES)
    record = LedgerMeta(FORMAT, SCHEMA_VERSION, CODEC, CODEC_VERSION)
    conn.execute(
        "INSERT INTO streamledger_meta (name, value) VALUES ('schema', %s)", (msgspec.msgpack.encode(record),)
    )


def _meta(conn: Any, where: str) -> LedgerMeta:
    """The ledger's schema record, refused unless it is a PostgreSQL ledger's with this build's codec."""
    row = conn.execute("SELECT value FROM streamledger_meta WHERE name = 'schema'").fetchone()
    if row is None:
        raise NotALedgerError(f"{where} has a streamledger_meta table without a schema record")
    try:
        meta = _meta_decoder.decode(row[0])
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(f"{where}: the schema record does not decode ({exc})") from None
    if meta.format != FORMAT:
        raise NotALedgerError(f"{where} holds a {meta.format!r} store, not a PostgreSQL streamledger ledger")
    if meta.codec != CODEC or meta.codec_version != CODEC_VERSION or meta.schema_version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} was written with schema {meta.schema_version} and codec {meta.codec}/"
            f"{meta.codec_version}; this build reads schema {SCHEMA_VERSION} and codec "
            f"{CODEC}/{CODEC_VERSION}. Open it with the matching streamledger release."
        )
    return meta


def ensure_schema(conn: Any, where: str, *, create: bool = True) -> None:
    """Make the tables and the schema record in an empty database (if ``create``); check them in any other.

    Refuses a database of another schema or codec version with
    :class:`~ledger.SchemaVersionError` (an older schema: migrate it
    explicitly), one whose tables are not a ledger's with
    :class:`~ledger.NotALedgerError`, one missing a table with
    :class:`~ledger.DamagedLedgerError`; changes nothing then.
    """
    with _locked(conn):
        # one opener makes the tables; the others wait for the lock and then find them
        found = _lock(conn, where)
        if not found and not create:
            raise NotALedgerError(f"{where} holds no ledger (and this command does not create one)")
        if not found:
            _create(conn)
            return
        meta = _meta(conn, where)
        missing = [
            table
            for table in TABLES
            if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
        ]
    if meta.schema_version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where} holds schema {meta.schema_version}; this build reads schema {SCHEMA_VERSION}: "
            "stop its workers, back it up, and run `python -m ledger migrate URL` (nothing was changed)"
        )
    if missing:
        raise DamagedLedgerError(
            f"{where} lacks its table(s) {', '.join(missing)}; restore the database from a backup "
            "(nothing was changed)"
        )


def migrate(conn: Any, where: str) -> tuple[int, int]:
    """Make a ledger in an empty database, or bring an older schema to this build's; (from, to).

    All of it is one transaction: a migration that fails leaves the schema
    as it was. ``from`` is 0 for a database that held no ledger.
    """
    with _locked(conn):
        if not _lock(conn, where):
            _create(conn)
            return 0, SCHEMA_VERSION
        meta = _meta(conn, where)
        for version in range(meta.schema_version, SCHEMA_VERSION):
            step = MIGRATIONS.get(version)
            if step is None:
                raise SchemaVersionError(f"{where}: this build has no migration from schema {version}")
            conn.execute(step)
        if meta.schema_version != SCHEMA_VERSION:
            record = LedgerMeta(FORMAT, SCHEMA_VERSION, CODEC, CODEC_VERSION)
            conn.execute(
                "UPDATE streamledger_meta SET value = %s WHERE name = 'schema'",
                (msgspec.msgpack.encode(record),),
            )
        return meta.schema_version, SCHEMA_VERSION
