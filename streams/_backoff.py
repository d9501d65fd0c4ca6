"""Backoff: how long a failed message waits before its next attempt, kept across restarts."""

from __future__ import annotations

import math

import msgspec

__all__ = ["Backoff"]


class Backoff(msgspec.Struct, frozen=True):
    """The delay before each retry, in seconds: ``first``, times ``factor`` per failure, at most ``maximum``.

    ``Backoff(2.0)`` waits 2 s before every retry; ``Backoff(0.5, factor=2,
    maximum=60)`` waits 0.5, 1, 2, ... up to 60 s. The delay counts from
    the failure's confirmed time (the ledger keeps it), so a restart does
    not retry sooner. The group's later messages wait too: a group handles
    its messages in order.
    """

    first: float
    factor: float = 1.0
    maximum: float = math.inf

    def __post_init__(self) -> None:
        if not (self.first >= 0 and self.factor >= 1 and self.maximum >= 0):
            raise ValueError(
                "a backoff waits first >= 0 seconds, grows by a factor >= 1, up to maximum >= 0; "
                f"got {self!r}"
            )

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th confirmed failure (at least 1)."""
        if failures < 1:
            return 0.0
        try:
            grown = self.first * self.factor ** (failures - 1)
        except OverflowError:
            grown = math.inf
        return min(grown, self.maximum)
