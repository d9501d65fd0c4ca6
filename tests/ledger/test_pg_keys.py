"""The PostgreSQL key sweep: a key column changed is the reference's answer or a typed refusal, never another.

A sample of ``tests/ledger/pg_keys.py``'s cases here, each key column of
each table's first row on every path; ``python -m fuzz --only pg-keys``
sweeps every row.
"""

from __future__ import annotations

import collections
from typing import Any

import anyio
import pytest

from .. import pg_server
from . import pg_keys

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

#: What the PostgreSQL ledger does not detect, by table, key column and path: nothing (a run's id is
#: kept twice since schema 2, so a rewritten one is found by the other; a keyed row keeps a checksum
#: of its stream, group, key and value since schema 3; docs/guarantees.md).
UNDETECTED: set[tuple[str, str, str]] = set()


#: The tables the sample changes: each has a row to change (a scope has one only once a run failed
#: for good). One test a table, so the workers of the suite share the sweep.
SAMPLED = sorted(set(pg_keys.KEYS) - {"streamledger_scopes"})


#: Tables whose first row no path of the sample reads back (``python -m fuzz --only pg-keys`` changes
#: every row of every table).
UNREAD = {"streamledger_attempts"}


@pytest.fixture(scope="module")
def reference(postgres_server: Any) -> tuple[str, dict[str, Any]]:
    """The reference ledger and what each path reads of it, built once a worker: every case changes a
    copy of it in a schema of its own (``pg_keys.outcome``), never the reference itself."""
    url = pg_server.new_ledger_url()
    anyio.run(pg_keys.build, url)
    return url, pg_keys.reference_answers(url)


@pytest.mark.parametrize("table", SAMPLED)
def test_each_key_column_changed_gives_the_same_answer_or_a_typed_refusal(
    reference: tuple[str, dict[str, Any]], table: str
) -> None:
    url, answers = reference
    seen: collections.Counter[str] = collections.Counter()
    bad = []
    sample = [case for case in pg_keys.cases(url) if case.row == 0 and case.table == table]
    assert {case.column for case in sample} == set(pg_keys.KEYS[table])  # the table has a row to change
    for i, case in enumerate(sample):
        for path in ("inspect", "messages", *pg_keys.PATHS):
            found = pg_keys.outcome(url, answers, case, path, f"sweep_{i}")
            seen[found.split(" ")[0]] += 1
            if found.startswith(("OTHER", "UNTYPED", "WROTE")):
                bad.append((case.table, case.column, path, found[:300]))
    assert {b[:3] for b in bad} == {u for u in UNDETECTED if u[0] == table}, (bad, seen)
    # the changes did reach what the paths read, but for a table whose first row no path reads
    assert (seen["same"] < sum(seen.values())) == (table not in UNREAD), seen
