"""The keyed state of a PostgreSQL ledger's groups: its table, its statements, its rows checked.

The conformance suite proves the rules (``streams/_conformance/keyed.py``
runs on PostgreSQL too); these are the table's own: calls of two groups do
not conflict, a group's rows leave with it, a row no listed group owns is
damage every open and ``check`` refuse, and a row that fails its checksum
is refused where it is read.
"""

from __future__ import annotations

import re

import anyio
import psycopg
import pytest

from ledger import CorruptRecordError
from ledger.postgres import migrate_url, open_postgres
from ledger.postgres._inspect import check_postgres
from ledger.postgres._store import set_default_isolation
from ledger.postgres._view import PgView
from streams import StreamRef, move_group, remove_group
from streams.store import (
    AppendBatch,
    KeyedHooks,
    KeyedRange,
    KeyedRead,
    KeyedWrite,
    MessageCommit,
    MessageRef,
    StreamOpen,
)

from .test_postgres_store import execute

REF = StreamRef("s", "src", "numbers")


def _fill(url: str, ref: StreamRef, stream_id: int, keys: int) -> None:
    """``keys`` keys of group ``g`` of stream ``ref`` (id ``stream_id``), written in one transaction."""
    with psycopg.connect(url) as conn:
        view = PgView(conn, {ref: stream_id})
        for i in range(1, keys + 1):
            view.put_keyed(ref, "g", b"key-%05d" % i, b"\x00")
        view.flush()


def test_two_groups_writing_their_keyed_state_at_once_both_commit(postgres_url: str) -> None:
    """Each call's statements lock the index pages of its own group, never the table: no conflict.

    Two serializable transactions, each reading, listing, clearing (as a new
    parent attempt taking its group over does) and writing the keys of its
    own group, both read before either writes and both write before either
    commits; the planner would scan the table for a clear of a group holding
    half of it, and then one of the two would be aborted.
    """
    migrate_url(postgres_url)  # the ledger's tables, in the empty database
    a, b = StreamRef("s", "src", "a"), StreamRef("s", "src", "b")
    _fill(postgres_url, a, 1, 2000)
    _fill(postgres_url, StreamRef("s", "src", "c"), 3, 400)  # between the two in the heap: no shared page
    _fill(postgres_url, b, 2, 2000)
    execute(postgres_url, "ANALYZE streamledger_keyed")
    first, second = psycopg.connect(postgres_url), psycopg.connect(postgres_url)
    try:
        views = []
        for conn, ref in ((first, a), (second, b)):
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            set_default_isolation(conn, conn.isolation_level)  # as the store's sessions
            view = PgView(conn, {a: 1, b: 2})
            assert view.get_keyed(ref, "g", [b"key-00007", b"nope"]) == [b"\x00", None]
            assert len(view.keyed_range(ref, "g", b"key-01", None, 50)) == 50
            views.append(view)
        for view, ref in zip(views, (a, b), strict=True):
            view.clear_keyed(ref, "g")
            view.put_keyed(ref, "g", b"key-01000~", b"\x01")
            view.put_keyed(ref, "g", b"key-00500", None)
            view.flush()
        first.commit()
        second.commit()  # no SerializationFailure
    finally:
        first.close()
        second.close()
    counts = execute(postgres_url, "SELECT stream_id, count(*) FROM streamledger_keyed GROUP BY 1 ORDER BY 1")
    assert counts == [(1, 1), (2, 1), (3, 400)]


async def _two_groups_with_keys(url: str) -> None:
    async with open_postgres(url) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a", "b", "c")))
        await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01",)))
        writes = tuple(KeyedWrite(b"k%d" % i, b"v") for i in range(10))
        for group in ("a", "b", "c"):
            await ledger.streams.commit(
                [MessageCommit(MessageRef(REF, group, opened.generation, 1), keyed=writes)]
            )


@pytest.mark.anyio
async def test_a_removed_group_and_one_moved_without_its_state_leave_no_keyed_row(postgres_url: str) -> None:
    await _two_groups_with_keys(postgres_url)
    async with open_postgres(postgres_url) as ledger:
        await remove_group(ledger.streams, REF, "a")
        await move_group(ledger.streams, REF, "b", to="earliest", keep_state=False)
        await move_group(ledger.streams, REF, "c", to="earliest", keep_state=True)
    assert execute(postgres_url, "SELECT grp, count(*) FROM streamledger_keyed GROUP BY grp") == [("c", 10)]
    checked = await anyio.to_thread.run_sync(check_postgres, postgres_url)
    assert checked.problems == [] and checked.records["streamledger_keyed"] == 10


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            "UPDATE streamledger_keyed SET grp = 'd' WHERE grp = 'b' AND key = 'k3'",
            r"stream s/src/numbers holds keyed state of group 'd', which it does not list",
        ),
        (
            "UPDATE streamledger_keyed SET stream_id = stream_id + 7 WHERE grp = 'a'",
            r"keyed state of group 'a' belongs to stream id \d+, which has no descriptor",
        ),
    ],
)
async def test_keyed_state_no_listed_group_owns_refuses_the_ledger_and_check_names_it(
    postgres_url: str, damage: str, problem: str
) -> None:
    """A group's keys leave with it: keys of a group no stream lists would be a new group's of that name."""
    await _two_groups_with_keys(postgres_url)
    execute(postgres_url, damage)
    before = execute(postgres_url, "SELECT * FROM streamledger_keyed ORDER BY 1, 2, 3")
    with pytest.raises(CorruptRecordError, match=problem):
        async with open_postgres(postgres_url):
            pass
    assert execute(postgres_url, "SELECT * FROM streamledger_keyed ORDER BY 1, 2, 3") == before
    checked = await anyio.to_thread.run_sync(check_postgres, postgres_url)
    assert [p for p in checked.problems if re.search(problem, p)], checked.problems
    assert checked.records["streamledger_keyed"] == 30


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("damage", "key"),
    [
        ("UPDATE streamledger_keyed SET value = '\\x01' WHERE grp = 'b' AND key = 'k3'", b"k3"),
        ("UPDATE streamledger_keyed SET key = 'k33' WHERE grp = 'b' AND key = 'k3'", b"k33"),
        (  # a row of group c moved into group b, in place of b's own
            "DELETE FROM streamledger_keyed WHERE grp = 'b' AND key = 'k3';"
            " UPDATE streamledger_keyed SET grp = 'b' WHERE grp = 'c' AND key = 'k3'",
            b"k3",
        ),
    ],
)
async def test_a_keyed_row_that_fails_its_checksum_is_refused_where_it_is_read(
    postgres_url: str, damage: str, key: bytes
) -> None:
    """A keyed value names nothing: its row's checksum says it is the row written under its key."""
    await _two_groups_with_keys(postgres_url)
    execute(postgres_url, damage)
    before = execute(postgres_url, "SELECT * FROM streamledger_keyed ORDER BY 1, 2, 3")
    async with open_postgres(postgres_url) as ledger:  # its owners are sound: it opens
        hooks = ledger.streams
        assert isinstance(hooks, KeyedHooks)
        with pytest.raises(
            CorruptRecordError, match=f"group 'b' of stream id \\d+ holds key {key.hex()} with"
        ):
            await hooks.read_keyed(KeyedRead(REF, "b", (b"k1", key)))
        with pytest.raises(CorruptRecordError, match="another row's checksum"):
            await hooks.list_keyed(KeyedRange(REF, "b"))
        assert await hooks.read_keyed(KeyedRead(REF, "a", (b"k3",))) == (b"v",)  # a's are sound
    assert execute(postgres_url, "SELECT * FROM streamledger_keyed ORDER BY 1, 2, 3") == before
    checked = await anyio.to_thread.run_sync(check_postgres, postgres_url)
    assert [p for p in checked.problems if f"key {key.hex()} with another" in p], checked.problems
