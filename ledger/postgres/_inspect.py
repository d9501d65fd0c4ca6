"""``inspect`` and ``check`` of a PostgreSQL ledger: the LMDB ledger's report and checks, from its tables.

Both read one ``REPEATABLE READ`` snapshot (a read-only transaction: the
ledger's workers go on) and write nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
import psycopg

from streams import GroupFrontier, StreamRef
from streams.store import (
    AttemptRecord,
    NodeAttemptRecord,
    NodeCheckpoint,
    ScopeRecord,
    StreamDescriptor,
    group_problems,
)

from .._check import LedgerCheck
from .._errors import BackupDestinationError, CorruptRecordError
from .._graph_runs import GraphCheckpoint, GraphRunRecord, decode_checkpoint_body
from .._inspect import graph_runs_report, node_runs_report, stream_entry
from .._messages import KeyFilter, keys_of, messages_of
from .._progress import SILENT, Progress, watching
from .._runs import RunRecord
from ._faults import translated
from ._schema import ensure_schema
from ._store import connect, describe_url
from ._verify import keyed_owner_problem, verify_streams
from ._view import PgView, keyed, sound_digest, unsealed_key

__all__ = ["backup_postgres", "check_postgres", "inspect_postgres", "messages_postgres"]

T = TypeVar("T")


@contextmanager
def _snapshot(url: str, *, verify: bool = True) -> Iterator[Any]:
    """One read-only snapshot; verified as every open is, unless for ``check``, which reports it all."""
    with translated(describe_url(url)), connect(url) as conn:
        ensure_schema(conn, describe_url(url), create=False)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        with conn.transaction():
            if verify:
                verify_streams(conn, describe_url(url))
            yield conn


def _decode(tp: type[T], raw: bytes) -> T:
    return msgspec.msgpack.decode(raw, type=tp)


def _row(tp: type[T], raw: bytes, what: str) -> T:
    """A row's record, or :class:`CorruptRecordError` naming it: inspect of a damaged ledger is refused."""
    try:
        return _decode(tp, raw)
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(
            f"{what} does not decode as its layout ({exc}); the ledger is damaged"
        ) from None


def inspect_postgres(url: str, *, values: bool = False) -> dict[str, Any]:
    """Streams with their groups, runs with their nodes: the report :func:`~ledger.inspect_ledger` makes."""
    with _snapshot(url) as conn:
        streams: list[dict[str, Any]] = []
        rows = conn.execute(
            "SELECT s.id, s.descriptor, g.name, g.frontier FROM streamledger_streams s"
            " LEFT JOIN streamledger_groups g ON g.stream_id = s.id"
            " WHERE s.descriptor IS NOT NULL ORDER BY s.id, g.name"
        ).fetchall()
        by_stream: dict[int, tuple[StreamDescriptor, list[tuple[GroupFrontier, str]]]] = {}
        for stream_id, raw, group, frontier in rows:
            entry = by_stream.get(stream_id)
            if entry is None:
                entry = by_stream[stream_id] = (
                    _row(StreamDescriptor, raw, f"the descriptor of stream id {stream_id}"),
                    [],
                )
            if group is not None:
                where = f"the frontier of group {group!r} of stream {entry[0].ref}"
                found = _row(GroupFrontier, frontier, where)
                entry[1].append((keyed(found, found.group, group, where), where))
        for desc, frontiers in by_stream.values():
            kept = {f.group for f, _ in frontiers}
            for group in desc.groups:
                if group not in kept:  # what a resume would find missing: refused here as it is there
                    raise CorruptRecordError(
                        f"stream {desc.ref} lists consumer group {group!r}, whose frontier is missing; "
                        "the ledger is damaged"
                    )
        owners = {
            (f"{stream}#{partition}", group): {
                "member": owner,
                "lease_expires": None if expires is None else expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "expired": bool(expired),
            }
            for stream, group, partition, owner, expires, expired in conn.execute(
                # a lease holds while its owner's row does: its end is the row's
                "SELECT l.stream, l.grp, l.partition, l.owner, m.expires_at AT TIME ZONE 'UTC',"
                " m.expires_at IS NULL OR m.expires_at < now()"
                " FROM streamledger_partition_leases l LEFT JOIN streamledger_members m"
                " ON m.stream = l.stream AND m.grp = l.grp AND m.member = l.owner"
            )
        }
        streams = [stream_entry(desc, frontiers, owners) for desc, frontiers in by_stream.values()]
        holders = {
            run_id: {
                "owner": owner,
                "lease_expires": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "expired": bool(expired),
            }
            for run_id, owner, expires, expired in conn.execute(
                "SELECT run_id, owner, expires_at AT TIME ZONE 'UTC', expires_at < now()"
                " FROM streamledger_leases"
            )
        }
        runs: list[RunRecord] = []
        for run_id, sound, raw in conn.execute(
            "SELECT run_id, id_digest = md5(run_id), record FROM streamledger_runs ORDER BY run_id"
        ):
            sound_digest(sound, run_id, "streamledger_runs")
            what = f"the record of run {run_id!r}"
            record = _row(RunRecord, raw, what)
            runs.append(keyed(record, record.run_id, run_id, what))
        boundaries = [
            _row(NodeAttemptRecord, raw, f"the attempt of {node!r} under {parent!r}")
            for parent, node, raw in conn.execute(
                "SELECT parent, node, record FROM streamledger_node_attempts"
            )
        ]
        nodes: dict[tuple[str, str], NodeCheckpoint] = {}
        for scope, node, raw in conn.execute("SELECT scope, node, record FROM streamledger_nodes"):
            what = f"the record of node {node!r} in scope {scope!r}"
            confirmed = _row(NodeCheckpoint, raw, what)
            nodes[(scope, node)] = keyed(confirmed, confirmed.node, node, what)

        def node_record(scope: str, node: str) -> NodeCheckpoint | None:
            return nodes.get((scope, node))

        graph_runs: list[tuple[GraphRunRecord, GraphCheckpoint | str | None]] = []
        for run_id, sound, raw, saved in conn.execute(
            "SELECT run_id, id_digest = md5(run_id), record, checkpoint FROM streamledger_graph_runs"
            " ORDER BY run_id"
        ):
            sound_digest(sound, run_id, "streamledger_graph_runs")
            what = f"the record of graph run {run_id!r}"
            graph_run = _row(GraphRunRecord, raw, what)
            checkpoint = None if saved is None else decode_checkpoint_body(saved)
            graph_runs.append((keyed(graph_run, graph_run.run_id, run_id, what), checkpoint))
        return {
            "path": describe_url(url),
            "owner": None,  # a server's ledger has no one owner: its workers hold runs by lease
            "streams": streams,
            "runs": node_runs_report(runs, boundaries, node_record, values=values, holders=holders)
            if runs
            else [],
            "graph_runs": graph_runs_report(graph_runs, values=values),
        }


def messages_postgres(
    url: str,
    ref: StreamRef,
    *,
    start: int = 1,
    limit: int | None = None,
    last: int | None = None,
    key: KeyFilter | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    """The confirmed messages of ``ref``, as ``python -m ledger messages`` prints them."""
    with _snapshot(url) as conn:
        view, where = PgView(conn, {}), describe_url(url)
        return messages_of(view, ref, where, start=start, limit=limit, last=last, key=key, progress=progress)


def keys_postgres(
    url: str, ref: StreamRef, group: str, *, start: bytes = b"", stop: bytes | None = None, limit: int = 100
) -> dict[str, Any]:
    """The confirmed keyed state of ``group`` on ``ref``, as ``python -m ledger keys`` prints it."""
    with _snapshot(url) as conn:
        view = PgView(conn, {})
        return keys_of(view, ref, group, describe_url(url), start=start, stop=stop, limit=limit)


def backup_postgres(url: str, destination: Path, /, *, progress: Progress = SILENT) -> LedgerCheck:
    """Dump the ledger's tables into the new directory ``destination``, as of one snapshot; its check.

    ``pg_dump`` (PostgreSQL's client tools) writes its directory format from
    a snapshot this process exported, and :func:`check_postgres` reads the
    same snapshot, so the records counted are the records dumped, even while
    workers run. ``pg_restore --dbname URL DEST`` restores it into a
    database whose schema of the same name exists. ``progress`` counts the
    rows checked, then the bytes ``pg_dump`` wrote (it compresses: no total).
    """
    dump = shutil.which("pg_dump")
    if dump is None:
        raise BackupDestinationError(
            "a backup of a PostgreSQL ledger is written by pg_dump, which is not on PATH: install "
            "PostgreSQL's client tools (Debian: postgresql-client)"
        )
    with _snapshot(url, verify=False) as conn:
        (snapshot, schema) = conn.execute("SELECT pg_export_snapshot(), current_schema()").fetchone()
        report = _check(conn, describe_url(url), progress)
        progress.phase("dumping", None, unit="bytes")
        with watching(progress, partial(_size, destination)):
            done = subprocess.run(
                [
                    dump,
                    "--format=directory",
                    f"--file={destination}",
                    f"--snapshot={snapshot}",
                    f"--table={schema}.streamledger_*",
                    "--no-owner",
                    f"--dbname={url}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
    if done.returncode != 0:
        reason = " ".join(done.stderr.strip().splitlines()[-1:]) or f"exit {done.returncode}"
        raise BackupDestinationError(f"pg_dump could not write the backup to {destination}: {reason}")
    return report


def _size(directory: Path) -> int:
    """The bytes of the files in ``directory`` so far (0 before it is made)."""
    total = 0
    with contextlib.suppress(OSError):  # not made yet, or a file renamed while counted
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
    return total


def check_postgres(url: str, /, *, progress: Progress = SILENT) -> LedgerCheck:
    """Decode every record, and follow every reference between them; the problems say which and why.

    ``progress`` counts the rows read, of the total PostgreSQL estimates for
    the tables (``pg_class.reltuples``, kept by its autovacuum).
    """
    with _snapshot(url, verify=False) as conn:
        return _check(conn, describe_url(url), progress)


#: The tables :func:`_check` reads row by row.
_CHECKED: Final = (
    "streamledger_streams",
    "streamledger_groups",
    "streamledger_messages",
    "streamledger_keyed",
    "streamledger_attempts",
    "streamledger_node_attempts",
    "streamledger_scopes",
    "streamledger_nodes",
    "streamledger_graph_runs",
    "streamledger_runs",
)


def _estimated_rows(conn: Any) -> int:
    """The rows of the checked tables as PostgreSQL's statistics estimate them (never analysed: 0)."""
    (rows,) = conn.execute(
        "SELECT coalesce(sum(greatest(reltuples, 0)), 0)::bigint FROM pg_class"
        " WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
        " AND relkind = 'r' AND relname = ANY(%s)",
        (list(_CHECKED),),
    ).fetchone()
    return int(rows)


def _check(conn: Any, where: str, progress: Progress = SILENT) -> LedgerCheck:
    problems: list[str] = []
    records: dict[str, int] = {}
    progress.phase("checking", _estimated_rows(conn) if progress.live else None)

    def each(table: str, columns: str) -> Iterator[tuple[Any, ...]]:
        assert table in _CHECKED
        for row in conn.execute(f"SELECT {columns} FROM {table}").fetchall():
            records[table] = records.get(table, 0) + 1
            progress.advance()
            yield row

    def decoded(tp: type[T], raw: bytes, what: str) -> T | None:
        try:
            return _decode(tp, raw)
        except msgspec.DecodeError as exc:
            problems.append(f"{what} does not decode as {tp.__name__} ({exc})")
            return None

    streams: dict[int, StreamDescriptor] = {}
    for stream_id, scope, node, key, raw in each("streamledger_streams", "id, scope, node, key, descriptor"):
        ref = StreamRef(scope, node, key)
        if raw is None:  # a deleted stream's row (ledger/postgres/_delete.py): records of it are problems
            continue
        desc = decoded(StreamDescriptor, raw, f"the descriptor of stream {ref}")
        if desc is None:
            continue
        if desc.ref != ref:
            problems.append(f"stream {ref} (id {stream_id}) holds the descriptor of {desc.ref}")
        streams[stream_id] = desc
    frontiers: dict[int, dict[str, GroupFrontier]] = {stream_id: {} for stream_id in streams}
    for stream_id, name, raw in each("streamledger_groups", "stream_id, name, frontier"):
        desc = streams.get(stream_id)
        frontier = decoded(GroupFrontier, raw, f"the frontier of group {name!r} of stream id {stream_id}")
        if desc is None:
            problems.append(f"group {name!r} belongs to stream id {stream_id}, which has no descriptor")
            continue
        if frontier is None:  # named already; the stream still has the group's row
            frontiers[stream_id][name] = GroupFrontier(group=name, acked_through=0)
            continue
        if frontier.group != name:
            problems.append(
                f"group {name!r} of stream {desc.ref} holds the frontier of group {frontier.group!r}"
            )
        frontiers[stream_id][name] = frontier
    for stream_id, desc in streams.items():
        problems.extend(group_problems(desc, frontiers[stream_id]))  # the rules LMDB's check applies
    _check_runs(each, streams, decoded, problems)
    owners: set[tuple[int, str]] = set()  # of keyed state: each followed once
    for stream_id, group, key, value, seal in each("streamledger_keyed", "stream_id, grp, key, value, seal"):
        unsealed = unsealed_key(stream_id, group, key, value, seal)  # the handler's bytes: nothing to decode
        if unsealed is not None:
            problems.append(unsealed)
        if (stream_id, group) not in owners:
            owners.add((stream_id, group))
            if group not in frontiers.get(stream_id, {}):
                problems.append(keyed_owner_problem(streams.get(stream_id), stream_id, group))
    for stream_id, grp, seq, _node, _parent, raw in each(
        "streamledger_attempts", "stream_id, grp, seq, node, parent, record"
    ):
        decoded(AttemptRecord, raw, f"the budget of message {seq} of group {grp!r} (stream id {stream_id})")
        if stream_id not in streams:
            problems.append(
                f"a budget of group {grp!r} belongs to stream id {stream_id}, which has no descriptor"
            )
    for parent, node, position, raw in each("streamledger_node_attempts", "parent, node, position, record"):
        attempt = decoded(NodeAttemptRecord, raw, f"the attempt record of node {node!r} under {parent!r}")
        if attempt is not None and (attempt.parent, attempt.node, attempt.position) != (
            parent,
            node,
            position,
        ):
            problems.append(
                f"the attempt record of node {node!r} under {parent!r} at {position} is for node "
                f"{attempt.node!r} under {attempt.parent!r} at {attempt.position}"
            )
    for scope, raw in each("streamledger_scopes", "scope, record"):
        decoded(ScopeRecord, raw, f"the record of scope {scope!r}")
    for scope, node, raw in each("streamledger_nodes", "scope, node, record"):
        confirmed = decoded(NodeCheckpoint, raw, f"the record of node {node!r} in scope {scope!r}")
        if confirmed is not None and confirmed.node != node:
            problems.append(f"node {node!r} in scope {scope!r} holds the record of node {confirmed.node!r}")
    for run_id, sound, raw, _ in each(
        "streamledger_graph_runs", "run_id, id_digest = md5(run_id), record, checkpoint"
    ):
        if not sound:
            problems.append(f"graph run {run_id!r} holds another id's digest")
        graph_run = decoded(GraphRunRecord, raw, f"the record of graph run {run_id!r}")
        if graph_run is not None and graph_run.run_id != run_id:
            problems.append(f"graph run {run_id!r} holds the record of graph run {graph_run.run_id!r}")
    for run_id, sound, status, raw in each(
        "streamledger_runs", "run_id, id_digest = md5(run_id), status, record"
    ):
        if not sound:
            problems.append(f"run {run_id!r} holds another id's digest")
        record = decoded(RunRecord, raw, f"the record of run {run_id!r}")
        if record is not None and (record.run_id, record.status) != (run_id, status):
            problems.append(
                f"run {run_id!r} ({status}) holds the record of run {record.run_id!r} ({record.status})"
            )
    # a lease may name a run not recorded yet (its process claims it first): counted, not judged
    (leases,) = conn.execute("SELECT count(*) FROM streamledger_leases").fetchone()
    records["streamledger_leases"] = leases
    # group members and their partition leases coordinate, and confirm nothing: counted too
    for table in ("streamledger_members", "streamledger_partition_leases"):
        records[table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return LedgerCheck(where, records, problems)


def _check_runs(
    each: Callable[[str, str], Iterator[tuple[Any, ...]]],
    streams: dict[int, StreamDescriptor],
    decoded: Callable[[type[list[bytes]], bytes, str], list[bytes] | None],
    problems: list[str],
) -> None:
    """Every stream's kept messages are runs contiguous from its compaction floor to what it appended."""
    runs: dict[int, list[tuple[int, int, int]]] = {}
    for stream_id, first, last, raw in each(
        "streamledger_messages", "stream_id, first_seq, last_seq, payloads"
    ):
        payloads = decoded(
            list[bytes], raw, f"the run of messages {first} to {last} of stream id {stream_id}"
        )
        count = -1 if payloads is None else len(payloads)
        runs.setdefault(stream_id, []).append((first, last, count))
    for stream_id, desc in streams.items():
        if stream_id not in runs and desc.appended > desc.compacted_through:
            problems.append(
                f"stream {desc.ref}: messages {desc.compacted_through + 1} to {desc.appended} are missing"
            )
    for stream_id, found in runs.items():
        owner = streams.get(stream_id)
        if owner is None:
            problems.append(f"messages belong to stream id {stream_id}, which has no descriptor")
            continue
        desc = owner
        found.sort()
        for first, last, count in found:
            if count >= 0 and count != last - first + 1:
                problems.append(f"stream {desc.ref}: the run {first} to {last} holds {count} messages")
        expected = None
        for first, last, _ in found:
            if expected is not None and first != expected:
                problems.append(f"stream {desc.ref}: its messages jump from {expected - 1} to {first}")
            expected = last + 1
        if found and found[-1][1] != desc.appended:
            problems.append(
                f"stream {desc.ref}: its messages end at {found[-1][1]}, but it appended {desc.appended}"
            )
        if found and found[0][0] > desc.compacted_through + 1:
            problems.append(
                f"stream {desc.ref}: messages {desc.compacted_through + 1} to {found[0][0] - 1} are missing"
            )
