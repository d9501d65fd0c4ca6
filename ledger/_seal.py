"""Checksummed framing for every value the ledger stores.

LMDB keeps no checksums, so a torn or flipped page would otherwise decode as
whatever it happens to hold. Every stored value is ``crc32 (4 bytes, big
endian) + body``; :func:`unseal` checks the sum and raises
:class:`CorruptRecordError` naming the database and key when it does not match.
"""

from __future__ import annotations

from typing import TypeVar
from zlib import crc32

import msgspec

from ._errors import CorruptRecordError

__all__ = ["decode_record", "seal", "unseal"]

T = TypeVar("T")


def seal(body: bytes) -> bytes:
    """Frame ``body`` with its checksum."""
    return crc32(body).to_bytes(4, "big") + body


def unseal(value: bytes, *, db: str, key: bytes) -> bytes:
    """Return the body of a sealed value, or raise if its checksum is wrong."""
    if len(value) < 4 or int.from_bytes(value[:4], "big") != crc32(value[4:]):
        raise CorruptRecordError(
            f"record {key.hex()} in database {db!r} fails its checksum; "
            "the ledger file is damaged, restore it from a copy"
        )
    return value[4:]


def decode_record(value: bytes, decoder: msgspec.msgpack.Decoder[T], *, db: str, key: bytes) -> T:
    """Unseal and decode one stored record, raising :class:`CorruptRecordError` on failure."""
    body = unseal(value, db=db, key=key)
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise CorruptRecordError(
            f"record {key.hex()} in database {db!r} does not decode as its layout ({exc}); "
            "the ledger file is damaged or was written by an incompatible build"
        ) from None
