"""What ``python -m ledger check`` finds on a ledger of either backend."""

from __future__ import annotations

import msgspec

__all__ = ["LedgerCheck"]


class LedgerCheck(msgspec.Struct, frozen=True):
    """What a check found: records read per database or table, and every problem (empty: sound)."""

    path: str
    records: dict[str, int]
    problems: list[str]

    @property
    def sound(self) -> bool:
        return not self.problems
