"""Flipped key bytes: every user path gives the reference figures or a typed refusal that wrote nothing.

The child (``tests/ledger/keyflip_child.py``) builds a demo killed mid-run, a
finished demo and durable graph runs, flips a deterministic sample of the key
bytes on their live pages (every database, leaf and branch keys, LMDB's own
main database and free list), and opens each copy without ``check`` the way
a user would: ``inspect``, ``messages``, the resumed demo and the graph resumed.
``python -m fuzz --only keyflips`` flips every bit of every key byte.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The exact figures, or the ledger refused, typed (the child checks that nothing was written).
ALLOWED = {
    "reference",
    "CorruptRecordError",
    "MissingRecordError",
    "DamagedLedgerError",
    "NotALedgerError",
}

#: The databases whose keys each ledger's live pages hold (a finished demo's messages are compacted).
DATABASES = {
    "killed demo": {"(main)", "(free)", "meta", "streams", "messages", "groups", "nodes"},
    "finished demo": {"(main)", "(free)", "meta", "streams", "groups", "nodes"},
    "graph run": {"(main)", "(free)", "meta", "graph_runs"},
    "keyed state": {"(main)", "(free)", "meta", "streams", "messages", "groups", "keyed", "keyed_log"},
}


def sweep(tmp_path: Path, sample: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.ledger.keyflip_child", str(tmp_path), sample],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-800:]}"
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_flipped_key_byte_anywhere_gives_the_reference_figures_or_a_typed_refusal(tmp_path: Path) -> None:
    lines = [line for line in sweep(tmp_path, "40") if "outcome" in line]
    outcomes = collections.Counter(str(line["outcome"]) for line in lines)
    assert set(outcomes) <= ALLOWED, [line for line in lines if line["outcome"] not in ALLOWED][:5]
    for ledger, databases in DATABASES.items():
        flipped = {line["database"] for line in lines if line["ledger"] == ledger}
        assert databases <= flipped, (ledger, flipped)
        paths = {line["path"] for line in lines if line["ledger"] == ledger}
        expected = {"graph run": {"inspect", "graph"}, "keyed state": {"keyed"}}
        assert paths >= expected.get(ledger, {"inspect", "demo"})
    assert any(line["page"] == "branch" for line in lines)  # graph_runs spans several pages
    assert any(line["database"] == "keyed" and line["page"] == "branch" for line in lines)
    # the flips did reach records: most are refused, and each kind of refusal is met
    assert (
        outcomes["MissingRecordError"] and outcomes["CorruptRecordError"] and outcomes["DamagedLedgerError"]
    )
