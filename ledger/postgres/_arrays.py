"""Columns of rows sent to PostgreSQL as one binary array each, dumped in one pass.

A statement of the ledger takes its rows as arrays, one a column
(``unnest(%b::bigint[], ...)``). psycopg dumps a plain ``list`` by looking
at its elements first, to choose an element type (the widest integer, say),
then dumping each through its own dumper: several Python calls an element,
most of a call's client CPU on the store's thread. A column here knows its
element type: :class:`Int8s`, :class:`Texts` and :class:`Byteas` are lists
that dump straight to PostgreSQL's binary array format (``array_send``:
one dimension, no nulls), with the element type's OID, in one pass.
Pass them with ``%b``; PostgreSQL reads them as ``bigint[]``, ``text[]``
and ``bytea[]``. A number outside ``bigint`` is refused as the server
refuses it (``NumericValueOutOfRange``, SQLSTATE 22003), before it is sent.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = ["Byteas", "Int8s", "Texts"]

_INT8, _TEXT, _BYTEA = 20, 25, 17
_INT8_ARRAY, _TEXT_ARRAY, _BYTEA_ARRAY = 1016, 1009, 1001

_header = struct.Struct(">iiIii").pack  # dimensions, has nulls, element type; length, lower bound
_empty = struct.Struct(">iiI").pack  # no dimensions: the empty array
_length = struct.Struct(">i").pack
_int8: Final = struct.Struct(">iq").pack  # an element's length (8) and its value


class Int8s(list[int]):
    """A column of ``bigint`` values."""


class Texts(list[str]):
    """A column of ``text`` values."""


class Byteas(list[bytes]):
    """A column of ``bytea`` values."""


def _array(oid: int, count: int, elements: Iterable[bytes]) -> bytes:
    if not count:
        return _empty(0, 0, oid)
    return b"".join((_header(1, 0, oid, count, 1), *elements))


class _Int8sDumper(Dumper):
    format = Format.BINARY
    oid = _INT8_ARRAY

    def dump(self, obj: Int8s) -> bytes:
        try:
            return _array(_INT8, len(obj), [_int8(8, value) for value in obj])
        except struct.error:  # as the server refuses such a number: the same error, before sending it
            raise psycopg.errors.NumericValueOutOfRange("bigint out of range") from None


class _TextsDumper(Dumper):
    format = Format.BINARY
    oid = _TEXT_ARRAY

    def dump(self, obj: Texts) -> bytes:
        codec = self.connection.info.encoding if self.connection is not None else "utf-8"
        encoded = [text.encode(codec) for text in obj]
        return _array(_TEXT, len(obj), [part for raw in encoded for part in (_length(len(raw)), raw)])


class _ByteasDumper(Dumper):
    format = Format.BINARY
    oid = _BYTEA_ARRAY

    def dump(self, obj: Byteas) -> bytes:
        return _array(_BYTEA, len(obj), [part for raw in obj for part in (_length(len(raw)), raw)])


# Registered once, for every connection made after: only these classes of the ledger's own dump so.
psycopg.adapters.register_dumper(Int8s, _Int8sDumper)
psycopg.adapters.register_dumper(Texts, _TextsDumper)
psycopg.adapters.register_dumper(Byteas, _ByteasDumper)
