"""The key sweep of a PostgreSQL ledger: every key column of every row, changed in turn, read as a user would.

A reference ledger holds every kind of row (a stream with two groups, one
part-acknowledged; a stream with a failed attempt's budget; a group's keyed
state; a completed run
of ``ledger.run``; a durable graph run stopped at its third step, with its
checkpoint). Each case copies it into a schema of its own, changes one key
column of one row (a text gets one more character, a number one more) and
reads the copy by each path on a fresh copy: ``inspect``, the streams
reopened and their unacknowledged messages read, the run resumed, the graph
run's status and its resume, the group's keyed state listed. Every outcome must be the reference's answer,
or a typed error of the ledger after which the copy is unchanged; anything
else (other figures, an untyped exception) is a failure the sweep names.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg

from ledger import LedgerError, connect
from ledger.postgres import TOOLS
from streams import Key, Stream, StreamRef, StreamsError, open_scope
from streams.store import (
    AppendBatch,
    KeyedHooks,
    KeyedRange,
    KeyedWrite,
    MessageCommit,
    MessageFail,
    MessageOpen,
    MessageRef,
    StreamOpen,
)

from .graphs.graphs import Boom, Calls, Log, durable, three_steps
from .pool_graphs import summing
from .test_postgres_cli import fill

NUMBERS = Key("numbers", Stream[int])

#: Each table's key columns: what the sweep changes.
KEYS: dict[str, tuple[str, ...]] = {
    "streamledger_streams": ("id", "scope", "node", "key"),
    "streamledger_messages": ("stream_id", "first_seq", "last_seq"),
    "streamledger_groups": ("stream_id", "name"),
    "streamledger_attempts": ("stream_id", "grp", "seq", "node", "parent"),
    "streamledger_keyed": ("stream_id", "grp", "key"),
    "streamledger_node_attempts": ("parent", "node", "position"),
    "streamledger_scopes": ("scope",),
    "streamledger_nodes": ("scope", "node"),
    "streamledger_runs": ("run_id", "id_digest"),
    "streamledger_graph_runs": ("run_id", "id_digest"),
}
TABLES = (
    *KEYS,
    "streamledger_meta",
    "streamledger_leases",
    "streamledger_members",
    "streamledger_partition_leases",
)


async def build(url: str) -> None:
    await fill(lambda: connect(url))
    async with connect(url) as ledger:
        async with open_scope(ledger.streams, scope="s") as scope:
            stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
            for n in range(1, 4):
                await stream.writer().send(n)
            await stream.writer().flush()
            ref = MessageRef(stream.ref, "g", stream.generation, 1)
            await ledger.streams.open_message(MessageOpen(ref, node="h", limit=3))
            await ledger.streams.fail_message(MessageFail(ref, node="h", limit=3, index=0))
        tallies = await ledger.streams.open(STREAMS[2])
        await ledger.streams.append(AppendBatch(TALLIES, tallies.generation, 1, (b"\x01",)))
        counted = MessageRef(TALLIES, "k", tallies.generation, 1)
        await ledger.streams.commit([MessageCommit(counted, keyed=(KeyedWrite(b"alice", b"\x07"),))])
        with contextlib.suppress(Boom):  # the run stops at step three: its record and checkpoint stay
            await durable(three_steps(), ledger).run(
                "r", state=Log(), inputs=5, deps=Calls(fail_at={"three"})
            )


def _inspected(url: str) -> Any:
    report = TOOLS.inspect(url, True)
    report.pop("path")
    for stream in report["streams"]:
        for group in stream["groups"]:
            group.pop("active_at")
    return report


#: The stream whose group keeps keyed state.
TALLIES = StreamRef("s", "src", "tallies")
#: The streams the reference holds, as a resumed program reopens them.
STREAMS = (
    StreamOpen(StreamRef("shop", "intake", "orders"), "int", 16, ("billing", "audit"), resumable=True),
    StreamOpen(StreamRef("s", "src", "numbers"), "int", 16, ("g",), resumable=True),
    StreamOpen(TALLIES, "int", 16, ("k",), resumable=True),
)


def _tails(request: StreamOpen) -> Callable[[str], Awaitable[Any]]:
    async def reopen(url: str) -> Any:
        """The stream reopened (a write: its generation rises): its frontiers and unacknowledged tail."""
        async with connect(url) as ledger:
            opened = await ledger.streams.open(request)
            return opened.appended, opened.generation, opened.groups, opened.tail

    return reopen


async def _resumed(url: str) -> Any:
    async with connect(url) as ledger:
        done = await ledger.resume("sum-4", summing())
        values = sorted((str(key), repr(value)) for key, value in done.result.values.items())
        return values, done.result.statuses, done.already_finished


async def _graph(url: str) -> Any:
    async with connect(url) as ledger:
        runner = durable(three_steps(), ledger)
        status = await runner.status("r")
        result = await runner.run("r", state=Log(), inputs=5, deps=Calls())
        return status, result.output


async def _keyed(url: str) -> Any:
    """The group's keyed state, as an operator lists it."""
    async with connect(url) as ledger:
        hooks = ledger.streams
        assert isinstance(hooks, KeyedHooks)
        return await hooks.list_keyed(KeyedRange(TALLIES, "k"))


#: The paths a user takes, each on a fresh copy.
PATHS: dict[str, Callable[[str], Awaitable[Any]]] = {
    **{f"reopen {request.ref}": _tails(request) for request in STREAMS},
    "resume": _resumed,
    "graph": _graph,
    "keyed": _keyed,
}


@dataclass(frozen=True)
class Case:
    table: str
    column: str
    row: int  # the row's place among the table's rows, in their order as text


def cases(reference: str) -> Iterator[Case]:
    rows = dump(reference)
    for table, columns in KEYS.items():
        for row in range(len(rows[table])):
            for column in columns:
                yield Case(table, column, row)


def dump(url: str) -> dict[str, list[dict[str, Any]]]:
    with psycopg.connect(url, autocommit=True) as conn:
        out: dict[str, list[dict[str, Any]]] = {}
        for table in TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")
            names = [d.name for d in cur.description or ()]
            rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            out[table] = sorted(rows, key=lambda r: repr(sorted(r.items())))
        return out


def schema_of(url: str) -> str:
    found = re.search(r"search_path%3D(\w+)", url)
    assert found is not None, url
    return found.group(1)


def copy(reference: str, name: str) -> str:
    """A copy of the reference ledger in schema ``name`` of the same database: its URL."""
    source = schema_of(reference)
    # one transaction, so one commit (and one flush of the server's log) where each statement was one
    with psycopg.connect(reference) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")
        for table in TABLES:
            conn.execute(f"CREATE TABLE {name}.{table} (LIKE {source}.{table} INCLUDING ALL)")
            conn.execute(f"INSERT INTO {name}.{table} SELECT * FROM {source}.{table}")
    return reference.replace(f"search_path%3D{source}", f"search_path%3D{name}")


def damage(url: str, case: Case) -> bool:
    """Change ``case``'s key column of its row: a text (or bytes) one character longer, a number one more.

    False if the server refused it: the changed key is another row's (its primary key holds).
    """
    row = dump(url)[case.table][case.row]
    value = row[case.column]
    changed = value + 1 if isinstance(value, int) else value + (b"~" if isinstance(value, bytes) else "~")
    where = " AND ".join(f"{c} = %s" for c in KEYS[case.table] if c in row)
    params = [row[c] for c in KEYS[case.table] if c in row]
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute(f"UPDATE {case.table} SET {case.column} = %s WHERE {where}", [changed, *params])
        except psycopg.errors.UniqueViolation:
            return False
    return True


def observe(url: str, path: str) -> Any:
    if path == "inspect":
        return _inspected(url)
    if path == "messages":  # what `python -m ledger messages` prints of each stream
        return [TOOLS.messages(url, request.ref, 1, None) for request in STREAMS]
    return anyio.run(PATHS[path], url)


def outcome(reference: str, answers: dict[str, Any], case: Case, path: str, name: str) -> str:
    """What ``path`` gave on a damaged copy: ``same``, a typed refusal, or what went wrong."""
    url = copy(reference, name)
    try:
        if not damage(url, case):
            return "unique"
        before = dump(url)
        try:
            seen = observe(url, path)
        except (LedgerError, StreamsError) as exc:
            return (
                type(exc).__name__ if dump(url) == before else f"WROTE AFTER REFUSING ({type(exc).__name__})"
            )
        except Exception as exc:  # what the sweep exists to find: reported, never hidden
            return f"UNTYPED {type(exc).__name__}: {exc}"
        return "same" if seen == answers[path] else f"OTHER ANSWER {seen!r}"
    finally:
        with psycopg.connect(reference, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def reference_answers(reference: str) -> dict[str, Any]:
    answers = {}
    for path in ("inspect", "messages", *PATHS):
        answers[path] = observe(copy(reference, "sweep_ref"), path)
    with psycopg.connect(reference, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS sweep_ref CASCADE")
    return answers
