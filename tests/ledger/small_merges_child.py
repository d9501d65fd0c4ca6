"""Run a program with keyed logs merged into the table every few keys, as a crash test's child.

    python tests/ledger/small_merges_child.py KEYS ENTRIES PROGRAM [ARGS...]

A group's keyed log is merged once it holds ``KEYS`` keys or ``ENTRIES``
entries (``ledger/lmdb/_keyed_log.py``; 50,000 and 200,000 otherwise), so
that a kill lands as often in a commit that merges as in one that appends.
"""

from __future__ import annotations

import runpy
import sys

from ledger.lmdb import _keyed_log

if __name__ == "__main__":
    keys, entries, program, *args = sys.argv[1:]
    _keyed_log.MERGE_KEYS = int(keys)  # type: ignore[misc]
    _keyed_log.MERGE_ENTRIES = int(entries)  # type: ignore[misc]
    sys.argv = [program, *args]
    runpy.run_path(program, run_name="__main__")
