"""``python -m fuzz.pgkeys``: the PostgreSQL key sweep, every row (the suite changes each table's first).

Starts a private server (as the tests do), builds the reference ledger of
``tests/ledger/pg_keys.py``, then changes every key column of every row in
turn and reads each copy by every path. Prints the outcomes counted, and
every case that is neither the reference's answer nor a typed refusal that
wrote nothing, except the one ``tests/ledger/test_pg_keys.py`` names as not
detected; exits 1 if there is one.
"""

from __future__ import annotations

import collections
import sys

import anyio

from tests import pg_server
from tests.ledger import pg_keys
from tests.ledger.test_pg_keys import UNDETECTED


def main() -> int:
    pg_server.server()
    url = pg_server.new_ledger_url()
    anyio.run(pg_keys.build, url)
    answers = pg_keys.reference_answers(url)
    seen: collections.Counter[str] = collections.Counter()
    bad = []
    for i, case in enumerate(pg_keys.cases(url)):
        for path in ("inspect", "messages", *pg_keys.PATHS):
            found = pg_keys.outcome(url, answers, case, path, f"sweep_{i}")
            seen[found.split(" ")[0]] += 1
            if (
                found.startswith(("OTHER", "UNTYPED", "WROTE"))
                and (case.table, case.column, path) not in UNDETECTED
            ):
                bad.append(f"{case} {path}: {found[:300]}")
    print("pgkeys: " + ", ".join(f"{k} {v}" for k, v in seen.most_common()))
    for line in bad:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
