"""``python -m tests.ledger.truncate_child LEDGER WORKDIR``: open copies of LEDGER cut at every page.

For each page boundary of ``data.mdb`` (and the middle of the first meta
page), a copy is truncated there and opened read-only and inspected; what
happened is printed as one JSON line per cut: the typed error, ``read`` when
the cut removed only pages no record lives in (free pages) and the copy reads
exactly as the ledger, or ``READ OTHER DATA``. A signal (SIGBUS) kills this
process, and the test sees it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ledger import LedgerEnv, LedgerError, inspect_ledger


def main(ledger: Path, workdir: Path) -> None:
    size = (ledger / "data.mdb").stat().st_size
    original = _report(ledger)
    page = 4096
    for cut in [page // 2, *range(page, size, page)]:
        copy = workdir / f"cut-{cut}"
        shutil.copytree(ledger, copy, ignore=shutil.ignore_patterns("owner.lock"))
        with (copy / "data.mdb").open("r+b") as f:
            f.truncate(cut)
        try:
            outcome = "read" if _report(copy) == original else "READ OTHER DATA"
        except LedgerError as exc:
            outcome = type(exc).__name__
        print(json.dumps({"cut": cut, "size": size, "outcome": outcome}), flush=True)


def _report(path: Path) -> object:
    env = LedgerEnv.open_readonly(path)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    report.pop("path")
    return report


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
