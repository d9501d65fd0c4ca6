"""Checksummed framing for every record the ledger stores: the checksum covers where it is too.

LMDB keeps no checksums, so a torn or flipped page would otherwise decode as
whatever it happens to hold. Every stored value is ``crc32 (4 bytes, big
endian) + body``, where the CRC-32 covers the database's name, the record's
key and the body: a record whose key was damaged, or that sits under another
key or in another database, fails its checksum as surely as one whose value
was. :func:`unseal` checks the sum and raises :class:`CorruptRecordError`
naming the database and key when it does not match.
"""

from __future__ import annotations

from typing import Final, TypeVar
from zlib import crc32

import msgspec

from .._errors import CorruptRecordError
from ._layout import DATABASES

__all__ = ["decode_record", "seal", "unseal"]

T = TypeVar("T")

#: The CRC-32 of each database's name, where every record's checksum starts.
_SEEDS: Final = {name: crc32(name.encode() + b"\0") for name in DATABASES}


def _checksum(db: str, key: bytes, body: bytes) -> int:
    seed = _SEEDS.get(db)
    if seed is None:
        seed = crc32(db.encode() + b"\0")
    return crc32(body, crc32(key, seed))


def seal(db: str, key: bytes, body: bytes) -> bytes:
    """Frame ``body``, to be stored under ``key`` in database ``db``, with its checksum."""
    return _checksum(db, key, body).to_bytes(4, "big") + body


def unseal(value: bytes, *, db: str, key: bytes) -> bytes:
    """Return the body of a value read under ``key`` in ``db``, or raise if its checksum is wrong."""
    if len(value) < 4 or int.from_bytes(value[:4], "big") != _checksum(db, key, value[4:]):
        raise CorruptRecordError(
            f"record {key.hex()} in database {db!r} of the ledger fails its checksum (its key, its "
            "value or its place was damaged); restore the ledger from a copy"
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
