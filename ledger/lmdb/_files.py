"""A ledger's data file, checked before LMDB maps it.

LMDB maps ``data.mdb`` into memory and trusts its meta pages: a file cut
shorter than the pages they name is read past its end, and the process dies
of SIGBUS with no message. :func:`check_data_file` reads the two meta pages
first (magic, version, page size, last page, transaction id), takes the one
LMDB would use (the higher transaction id), and walks every page it reaches:
one past the end of the file is refused with :class:`DamagedLedgerError`,
as is a file that ends inside its second meta page (and a file that does
not start with a meta page with :class:`NotALedgerError`). The file itself
may end before the meta's last page: LMDB does not write pages a
transaction allocated and freed again. :func:`holds_no_commit` tells a data
file no transaction was ever committed to (what a creation killed before
its first commit leaves) from a ledger.

The meta layout read here is LMDB 0.9's on a 64-bit machine: after a 16-byte
page header, ``mm_magic`` (u32), ``mm_version`` (u32), ``mm_address``,
``mm_mapsize``, two 48-byte ``MDB_db`` records (the first one's leading u32
is the page size), ``mm_last_pg``, ``mm_txnid``; native byte order.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Final, NamedTuple

import lmdb

from .._errors import CorruptRecordError, DamagedLedgerError, NotALedgerError

__all__ = [
    "KeyBytes",
    "check_data_file",
    "check_pages",
    "damaged",
    "holds_no_commit",
    "key_bytes",
    "never_held_records",
]

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
        if size < 2 * first.page_size:
            raise DamagedLedgerError(
                f"{data_file} ends at byte {size}, inside its second meta page: it was cut short (by "
                "damage, or a kill while LMDB wrote a new ledger's first pages); restore the ledger "
                "from a copy, or delete the directory if it never held records"
            )
    # A file may end before the meta's last page: LMDB never writes the pages a transaction
    # allocated and freed again (its loose pages), and the last one may be among them. What
    # matters is that every page LMDB will read is in the file, which check_pages verifies.
    check_pages(path)


def holds_no_commit(path: Path) -> bool:
    """Whether ``path/data.mdb`` is missing, empty, or has two meta pages and no committed transaction.

    LMDB makes a new data file empty, then writes its two meta pages, both of
    transaction 0; its first commit is transaction 1, written to the second
    meta page after the commit's other pages. A file whose two meta pages
    are both of transaction 0 has never been committed to: a creation killed
    before its first commit left it, and it holds nothing. A file without
    both meta pages is never taken for one, since a ledger cut short looks
    the same (:func:`check_data_file` refuses it).
    """
    data_file = path / "data.mdb"
    try:
        f = data_file.open("rb")
    except FileNotFoundError:
        return True
    with f:
        head = f.read(_PAGE_HEADER + _META.size)
        if not head:
            return True
        first = _meta(head)
        if first is None or first.txnid != 0:
            return False
        f.seek(first.page_size)
        second = _meta(f.read(_PAGE_HEADER + _META.size))
        return second is not None and second.txnid == 0


def never_held_records(path: Path) -> bool:
    """Whether neither meta page of ``path/data.mdb`` has ever named a database (what nothing filled).

    A file with a commit whose current meta page holds nothing, while the
    other names databases, is not a new ledger: a damaged transaction id
    made LMDB take an empty meta page for the current one.
    """
    with (path / "data.mdb").open("rb") as f:
        head = f.read(_PAGE_HEADER + _META.size)
        first = _meta(head)
        if first is None:
            return False
        f.seek(first.page_size)
        pages = (head, f.read(_PAGE_HEADER + _META.size))
    return all(
        len(page) >= _META_ROOTS[1] + 8 and _ROOT.unpack_from(page, _META_ROOTS[1])[0] == _INVALID
        for page in pages
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


# -- the pages LMDB will read ---------------------------------------------------------------

_P_BRANCH: Final = 0x01
_P_LEAF: Final = 0x02
_P_OVERFLOW: Final = 0x04
_F_BIGDATA: Final = 0x01
_F_SUBDATA: Final = 0x02
_F_DUPDATA: Final = 0x04
_NODE: Final = struct.Struct("=HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
_HEADER: Final = struct.Struct("=QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper
_PAGES: Final = struct.Struct("=I")  # an overflow page's mp_pages, where lower and upper would be
_ROOT: Final = struct.Struct("=Q")
_META_ROOTS: Final = (_PAGE_HEADER + 24 + 40, _PAGE_HEADER + 72 + 40)  # md_root of the free and main dbs
_SUBDB_ROOT: Final = 40  # md_root inside an MDB_db record
_SUBDB: Final = 48
_INVALID: Final = (1 << 64) - 1


def check_pages(path: Path) -> None:
    """Walk every page the current meta page reaches and refuse one that would send LMDB astray.

    LMDB trusts the offsets and sizes inside its pages; a damaged one makes it
    read past the end of the file or the map, and the process dies of a
    signal. Each page reached from the roots (the free and main databases,
    each named database, each overflow run) is read from the file, not the
    map, and must name itself, hold its node offsets and sizes inside the
    page, hold at least one node (LMDB never keeps an empty page in a tree,
    and would read a node before the first of one), and point only at pages
    the file holds. Raises
    :class:`DamagedLedgerError` naming the page.
    """
    data_file = path / "data.mdb"
    with data_file.open("rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        f.seek(0)
        first = _meta(f.read(_PAGE_HEADER + _META.size))
        if first is None:
            return  # check_data_file said what is wrong
        f.seek(first.page_size)
        second = _meta(f.read(_PAGE_HEADER + _META.size))
        current, index = max(
            ((m, i) for i, m in enumerate((first, second)) if m is not None), key=lambda pair: pair[0].txnid
        )
        psize = current.page_size
        pages = min(current.last_page + 1, size // psize)  # the pages the file holds, of those in use
        f.seek(index * psize)
        meta_page = f.read(psize)
        free_root, main_root = (_ROOT.unpack_from(meta_page, at)[0] for at in _META_ROOTS)
        todo = [main_root]
        free = [free_root]  # the free list's pages: its keys are checked too
        seen: set[int] = set()
        while todo or free:
            in_free = not todo
            pgno = free.pop() if in_free else todo.pop()
            if pgno == _INVALID or pgno in seen:
                continue
            if pgno < 2 or pgno >= pages:
                raise _bad(
                    data_file,
                    pgno,
                    f"is referenced, but the file holds pages 2 to {pages - 1}: it was truncated or is "
                    "damaged; restore the ledger from a copy",
                )
            seen.add(pgno)
            f.seek(pgno * psize)
            page = f.read(psize)
            found = _page_references(data_file, page, pgno, psize, pages, f, ordered=not in_free)
            if in_free:
                _check_free_keys(data_file, page, pgno, current.txnid)
                free.extend(found)
            else:
                todo.extend(found)


def _check_free_keys(data_file: Path, page: bytes, pgno: int, txnid: int) -> None:
    """A free-list page's keys are the ids of past transactions, ascending: LMDB aborts on others.

    Each record of the free list names the pages a transaction freed, keyed
    by its id; a damaged key (an id ahead of the last commit, or out of
    order) makes LMDB's next write fail an assertion and abort the process.
    """
    flags, lower = _HEADER.unpack_from(page)[2:4]
    previous = -1
    for i in range((lower - _PAGE_HEADER) // 2):
        (offset,) = struct.unpack_from("=H", page, _PAGE_HEADER + 2 * i)
        ksize = _NODE.unpack_from(page, offset)[3]
        if flags & _P_BRANCH and i == 0:
            continue  # a branch page's first key is empty
        if ksize != _ROOT.size:
            raise _bad(data_file, pgno, f"holds a free-list key of {ksize} bytes, not a transaction id")
        (key,) = _ROOT.unpack_from(page, offset + _NODE.size)
        if key > txnid or key <= previous:
            raise _bad(
                data_file, pgno, f"holds free-list key {key}, out of order or after the last commit {txnid}"
            )
        previous = key


def _page_references(
    data_file: Path, page: bytes, pgno: int, psize: int, pages: int, f: Any, *, ordered: bool = True
) -> list[int]:
    """The pages ``page`` points at, after checking that LMDB can read it within bounds.

    ``ordered``: its keys compare as bytes (every database but the free list, whose keys are
    native integers) and must ascend: a damaged key out of order would hide its record from
    LMDB's searches, or show it where another belongs, and is refused before anything is written.
    """
    if len(page) < psize:
        raise _bad(data_file, pgno, "is cut short by the end of the file")
    own, _, flags, lower, upper = _HEADER.unpack_from(page)
    if own != pgno:
        raise _bad(data_file, pgno, f"says it is page {own}")
    if not flags & (_P_BRANCH | _P_LEAF) or flags & _P_OVERFLOW:
        raise _bad(data_file, pgno, f"is referenced as a tree page but has flags {flags:#x}")
    if not _PAGE_HEADER <= lower <= upper <= psize or (lower - _PAGE_HEADER) % 2:
        raise _bad(data_file, pgno, f"has free space from {lower} to {upper}, outside the page")
    if lower == _PAGE_HEADER:  # LMDB frees a tree's empty pages; it would read node -1 of one
        raise _bad(data_file, pgno, "is a tree page without nodes")
    found: list[int] = []
    previous: bytes | None = None
    for i in range((lower - _PAGE_HEADER) // 2):
        (offset,) = struct.unpack_from("=H", page, _PAGE_HEADER + 2 * i)
        if not upper <= offset <= psize - _NODE.size:
            raise _bad(data_file, pgno, f"has node {i} at offset {offset}, outside its nodes")
        lo, hi, node_flags, ksize = _NODE.unpack_from(page, offset)
        key_end = offset + _NODE.size + ksize
        if key_end > psize:
            raise _bad(data_file, pgno, f"has node {i} whose key runs past the page")
        if ordered and not (flags & _P_BRANCH and i == 0):  # a branch page's first key is empty
            key = page[offset + _NODE.size : key_end]
            if previous is not None and key <= previous:
                why = "LMDB's searches would miss records or find them where others belong"
                raise _bad(data_file, pgno, f"has node {i} whose key is out of order", why=why)
            previous = key
        if flags & _P_BRANCH:
            found.append(lo | hi << 16 | node_flags << 32)
            continue
        dsize = lo | hi << 16
        if node_flags & _F_BIGDATA:
            if key_end + 8 > psize:
                raise _bad(data_file, pgno, f"has node {i} whose overflow page number runs past the page")
            (first,) = _ROOT.unpack_from(page, key_end)
            _check_overflow(data_file, f, first, dsize, psize, pages)
        elif key_end + dsize > psize:
            raise _bad(data_file, pgno, f"has node {i} whose {dsize} bytes of data run past the page")
        elif node_flags & (_F_SUBDATA | _F_DUPDATA):
            if dsize != _SUBDB or node_flags & _F_DUPDATA:
                raise _bad(
                    data_file, pgno, f"has node {i} with flags {node_flags:#x} no ledger database uses"
                )
            found.append(_ROOT.unpack_from(page, key_end + _SUBDB_ROOT)[0])
    return found


def _check_overflow(data_file: Path, f: Any, first: int, dsize: int, psize: int, pages: int) -> None:
    if first < 2 or first >= pages:
        raise _bad(data_file, first, "is referenced as an overflow page, but the file does not hold it")
    f.seek(first * psize)
    header = f.read(_PAGE_HEADER)
    own, _, flags = _HEADER.unpack_from(header)[:3]
    (count,) = _PAGES.unpack_from(header, 12)
    if own != first or not flags & _P_OVERFLOW:
        raise _bad(data_file, first, "is referenced as an overflow page but is not one")
    if count < 1 or first + count > pages or dsize > count * psize - _PAGE_HEADER:
        raise _bad(data_file, first, f"starts {count} overflow pages that cannot hold {dsize} bytes")


_READ_PAST: Final = "LMDB would read past it"


def _bad(data_file: Path, pgno: int, what: str, *, why: str = _READ_PAST) -> DamagedLedgerError:
    return DamagedLedgerError(
        f"{data_file}: page {pgno} {what}; the file is damaged, and {why}: restore the ledger from a copy"
    )


class KeyBytes(NamedTuple):
    """Where one node's key sits in ``data.mdb``: its database, page kind, file offset and size."""

    database: str  # a named database, "(main)" for LMDB's main one, "(free)" for its free list
    page: str  # "leaf" or "branch"
    offset: int
    size: int


def key_bytes(path: Path) -> list[KeyBytes]:
    """Every key of every node on the pages the current meta page reaches, by database (for fault tests).

    The walk is :func:`check_pages`'s, over a file it accepted: the free and
    main databases from the meta page, each named database from its main
    entry. Branch nodes' first keys are empty in LMDB and are left out.
    """
    data_file = path / "data.mdb"
    found: list[KeyBytes] = []
    with data_file.open("rb") as f:
        data = f.read()
    first = _meta(data[: _PAGE_HEADER + _META.size])
    if first is None:
        return found
    second = _meta(data[first.page_size : first.page_size + _PAGE_HEADER + _META.size])
    current, index = max(
        ((m, i) for i, m in enumerate((first, second)) if m is not None), key=lambda pair: pair[0].txnid
    )
    psize = current.page_size
    meta_page = data[index * psize : (index + 1) * psize]
    roots = zip(_META_ROOTS, ("(free)", "(main)"), strict=True)
    todo = [(_ROOT.unpack_from(meta_page, at)[0], name) for at, name in roots]
    seen: set[int] = set()
    while todo:
        pgno, db = todo.pop()
        if pgno == _INVALID or pgno in seen:
            continue
        seen.add(pgno)
        base = pgno * psize
        page = data[base : base + psize]
        _, _, flags, lower, _ = _HEADER.unpack_from(page)
        for i in range((lower - _PAGE_HEADER) // 2):
            (offset,) = struct.unpack_from("=H", page, _PAGE_HEADER + 2 * i)
            lo, hi, node_flags, ksize = _NODE.unpack_from(page, offset)
            key_at = offset + _NODE.size
            if flags & _P_BRANCH:
                todo.append((lo | hi << 16 | node_flags << 32, db))
                if ksize:
                    found.append(KeyBytes(db, "branch", base + key_at, ksize))
                continue
            found.append(KeyBytes(db, "leaf", base + key_at, ksize))
            if node_flags & _F_SUBDATA and not node_flags & _F_BIGDATA:
                name = page[key_at : key_at + ksize].decode(errors="replace")
                todo.append((_ROOT.unpack_from(page, key_at + ksize + _SUBDB_ROOT)[0], name))
    return found
