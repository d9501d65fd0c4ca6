"""A ledger's data file, checked before LMDB maps it.

LMDB maps ``data.mdb`` into memory and trusts its meta pages: a file cut
shorter than the pages they name is read past its end, and the process dies
of SIGBUS with no message. :func:`check_data_file` reads the two meta pages
first (magic, version, page size, last page, transaction id), takes the one
LMDB would use (the higher transaction id), and refuses a file shorter than
it says with :class:`DamagedLedgerError` (and a file that does not start
with a meta page with :class:`NotALedgerError`).

The meta layout read here is LMDB 0.9's on a 64-bit machine: after a 16-byte
page header, ``mm_magic`` (u32), ``mm_version`` (u32), ``mm_address``,
``mm_mapsize``, two 48-byte ``MDB_db`` records (the first one's leading u32
is the page size), ``mm_last_pg``, ``mm_txnid``; native byte order.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Final, NamedTuple

import lmdb

from ._errors import CorruptRecordError, DamagedLedgerError, NotALedgerError

__all__ = ["check_data_file", "damaged"]

_MAGIC: Final = 0xBEEFC0DE
_VERSION: Final = 1
_PAGE_HEADER: Final = 16
_META: Final = struct.Struct("=IIQQ48x48xQQ")  # magic, version, address, map size, (dbs), last page, txn
_PAGE_SIZE: Final = struct.Struct("=I")  # the free database's md_pad: the page size
_SMALLEST_PAGE: Final = 512


class _Meta(NamedTuple):
    page_size: int
    last_page: int
    txnid: int


def check_data_file(path: Path) -> None:
    """Refuse ``path/data.mdb`` if it is shorter than its meta pages say, or they are unreadable.

    A missing or empty file is a ledger not created yet (LMDB initializes it).
    """
    data_file = path / "data.mdb"
    try:
        size = data_file.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    with data_file.open("rb") as f:
        head = f.read(_PAGE_HEADER + _META.size)
        first = _meta(head)
        if first is None:
            raise NotALedgerError(
                f"{data_file} is not an LMDB file: it does not start with an LMDB meta page"
            )
        f.seek(first.page_size)
        second = _meta(f.read(_PAGE_HEADER + _META.size))
    current = max((m for m in (first, second) if m is not None), key=lambda m: m.txnid)
    needed = (current.last_page + 1) * current.page_size
    if size < needed:
        raise DamagedLedgerError(
            f"{data_file} holds {size} bytes but its last commit needs {needed} (page "
            f"{current.last_page} of {current.page_size} bytes): the file was truncated; restore the "
            "ledger from a copy"
        )


def _meta(page: bytes) -> _Meta | None:
    if len(page) < _PAGE_HEADER + _META.size:
        return None
    magic, version, _, _, last_page, txnid = _META.unpack_from(page, _PAGE_HEADER)
    (page_size,) = _PAGE_SIZE.unpack_from(page, _PAGE_HEADER + 24)
    if magic != _MAGIC or version != _VERSION or page_size < _SMALLEST_PAGE or page_size & (page_size - 1):
        return None
    return _Meta(page_size, last_page, txnid)


def damaged(path: Path, exc: lmdb.Error) -> CorruptRecordError:
    """LMDB's own error on a damaged file, as the ledger's typed error."""
    return CorruptRecordError(
        f"LMDB could not read ledger {path} ({type(exc).__name__}: {exc}); the file is damaged: "
        "verify it with python -m ledger check and restore it from a copy"
    )
