"""``python -m ledger check``: every record of a ledger verified, and every reference between them.

The checks are :mod:`ledger.lmdb._verify`'s, the ones a ledger passes each time it
opens, here over every record, the messages every group acknowledged
included, and listing every problem instead of stopping at the first: each
value is unsealed (its checksum covers database, key and value) and decoded
as its database's layout, keys are in order and found by lookups, the
manifests match what their databases hold, and the references are followed
(the stream counter covers every id, each index entry names a descriptor of
the same stream and back, each group a descriptor lists has its frontier
and back, the runs of a stream are contiguous up to what it appended, each
budget belongs to a stream, each committed node has its record, each graph
checkpoint has its run record). Reading every record also walks every page
LMDB reaches, so LMDB's own damage surfaces too. One consistent snapshot;
nothing is written.
"""

from __future__ import annotations

import lmdb

from .._check import LedgerCheck
from .._errors import CorruptRecordError
from .._progress import SILENT, Progress
from ._env import LedgerEnv
from ._verify import check_records

__all__ = ["check_ledger"]


def check_ledger(env: LedgerEnv, *, progress: Progress = SILENT) -> LedgerCheck:
    """Verify every record and reference of ``env``'s ledger; the problems say which record and why.

    ``progress`` counts the records read.
    """
    problems: list[str] = []
    records: dict[str, int] = {}
    try:
        with env.read() as txn:
            check_records(txn, env.databases(), problems, records, progress=progress)
    except (lmdb.Error, CorruptRecordError) as exc:  # LMDB's own damage, met outside any one record
        problems.append(f"LMDB could not read the ledger: {exc}")
    return LedgerCheck(str(env.path), records, problems)
