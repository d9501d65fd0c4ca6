"""Keyed values that expire: each stored with the time it is gone, judged by every reader alike.

A :class:`~streams.KeyedState` declared with a ``ttl`` stores each value it
writes as ``0xc1``, the time it expires (milliseconds since the epoch, 8
bytes big-endian) and the value's MessagePack. ``0xc1`` is the one byte
MessagePack never uses, so a value without a stamp (written with no
``ttl``) is plain MessagePack and reads as such, and a declaration may gain
or lose its ``ttl`` over a ledger's life. The stamp is the expiry itself, not the time
of the write: a reader that knows nothing of the declaration (``python -m
ledger state``, the console) still knows whether a value is gone.

A value is gone once ``now >= expires``, for every reader: the handler's
``tx.store.get`` (which also stages the key's delete, so the commit that
noticed it removes it), the reads from outside, and the group's sweep,
which deletes untouched keys past their time with the group's next commits
(:class:`~streams._keyed.KeyedCache`).
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["STAMP_BYTES", "TAG", "expires_at", "live_payload", "payload_of", "stamped"]

#: The first byte of a stamped value: never the first byte of a MessagePack value.
_TAG: Final = 0xC1
TAG: Final = bytes([_TAG])
_STAMP: Final = struct.Struct(">BQ")
#: How many bytes the stamp puts before the value's MessagePack.
STAMP_BYTES: Final = _STAMP.size


def stamped(payload: bytes, expires: float) -> bytes:
    """``payload`` stored so that it is gone at ``expires`` (seconds since the epoch)."""
    return _STAMP.pack(_TAG, max(0, int(expires * 1000))) + payload


def expires_at(value: bytes) -> float | None:
    """When the stored ``value`` is gone (seconds since the epoch); None if it never expires."""
    if not value or value[0] != _TAG:
        return None
    ms: int = _STAMP.unpack_from(value)[1]
    return ms / 1000


def payload_of(value: bytes) -> bytes:
    """The MessagePack of the stored ``value``, its stamp (if any) left out."""
    return value[STAMP_BYTES:] if value and value[0] == _TAG else value


def live_payload(value: bytes | None, now: float) -> bytes | None:
    """The MessagePack of the stored ``value`` if it is there at ``now``; None if absent or gone."""
    if value is None:
        return None
    if not value or value[0] != _TAG:
        return value
    ms: int = _STAMP.unpack_from(value)[1]
    if ms <= now * 1000:
        return None
    return value[STAMP_BYTES:]
