"""What both backends keep alike: the schema record's shape, the codec, runs of messages, run ids.

Each backend names its own format in the schema record (``FORMAT``) and
numbers its own schema versions.
"""

from __future__ import annotations

from typing import Final

import msgspec

from ._errors import InvalidRunIdError

__all__ = ["CHUNK", "CODEC", "CODEC_VERSION", "MAX_RUN_ID_BYTES", "LedgerMeta", "run_id_bytes"]

#: How every record's body is encoded.
CODEC: Final = "msgpack"
CODEC_VERSION: Final = 1
#: The most messages one stored run holds (bounds what compaction must keep of a run).
CHUNK: Final = 256
#: A run id is 1 to this many bytes of UTF-8, kept whole in keys.
MAX_RUN_ID_BYTES: Final = 400


class LedgerMeta(msgspec.Struct, frozen=True):
    """The schema record every ledger holds (LMDB: ``meta/schema``; PostgreSQL: ``streamledger_meta``)."""

    format: str
    schema_version: int
    codec: str
    codec_version: int


def run_id_bytes(run_id: str) -> bytes:
    """``run_id`` as the bytes a ledger keys it by, or :class:`InvalidRunIdError`."""
    raw = run_id.encode()
    if not raw or len(raw) > MAX_RUN_ID_BYTES:
        raise InvalidRunIdError(
            f"a run id must be 1 to {MAX_RUN_ID_BYTES} bytes of UTF-8; got {len(raw)} bytes"
        )
    return raw
