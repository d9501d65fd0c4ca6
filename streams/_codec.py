"""msgspec codecs for the values of typed keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, get_origin

import msgspec
import msgspec.inspect as mi

from ._errors import PayloadTypeError, RecordDecodeError
from ._type_names import type_name

__all__ = [
    "CODEC_ID",
    "CODEC_VERSION",
    "PREPARE_ERRORS",
    "Codec",
    "codec_for",
    "encode_value",
    "is_immutable",
    "to_plain",
]

CODEC_ID: Final = "msgpack"
CODEC_VERSION: Final = 1

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_plain_decoder = msgspec.msgpack.Decoder()

#: The bytes of any value msgspec encodes (the encoder every codec shares): what a caller that
#: checks a value inline, as :meth:`Codec.prepare` does, encodes with.
encode_value: Final = _encoder.encode
#: What encoding a value and reading it back may raise when it is not of the codec's type.
PREPARE_ERRORS: Final = (msgspec.MsgspecError, TypeError, ValueError, ArithmeticError, RecursionError)


class Codec(Generic[T]):
    """Validates, encodes and decodes values of one type with msgspec msgpack.

    A value is checked by reading back what was written: :meth:`prepare`
    encodes it and decodes the bytes as ``T``. That catches what an
    ``isinstance`` check cannot (a Struct field of the wrong type, ``True``
    for an ``int``), and the decoded copy is what readers and handlers get,
    so a run that was restarted sees exactly what an uninterrupted one saw.
    """

    __slots__ = ("_decoder", "atomic", "immutable", "name", "read_back", "type")

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self.name = type_name(tp)
        try:
            self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(tp)
        except TypeError as exc:
            raise PayloadTypeError(f"type {self.name} cannot be stored: {exc}") from None
        #: ``read_back(payload)``: the bytes :func:`encode_value` made, decoded as ``T`` (msgspec's
        #: own call, no Python frame). With it a caller checks a value inline, as :meth:`prepare`
        #: does: what either raises, a :data:`PREPARE_ERRORS`, becomes :meth:`refusal`.
        self.read_back: Callable[[bytes], T] = self._decoder.decode
        #: Whether a decoded value can never change: copies of it need not be made.
        self.immutable = is_immutable(tp)
        #: Whether a value of exactly this type reads back as itself, unchecked (str, int, ...).
        self.atomic = tp in _ATOMIC

    def prepare(self, value: object, *, what: object) -> tuple[T, bytes]:
        """``value`` as it reads back, and its bytes; :class:`PayloadTypeError` if it is not a ``T``."""
        try:
            payload = _encoder.encode(value)
            return self._decoder.decode(payload), payload
        except PREPARE_ERRORS as exc:
            raise self.refusal(value, exc, what) from None

    def refusal(self, value: object, exc: Exception, what: object) -> PayloadTypeError:
        """The error of a ``value`` that does not read back as a ``T`` (``exc``: why)."""
        return PayloadTypeError(
            f"{what} takes {self.name}, got a {type(value).__qualname__} that does not read back "
            f"as one ({exc}); nothing was written"
        )

    def encode(self, value: T) -> bytes:
        return _encoder.encode(value)

    def payload(self, value: object, *, what: object) -> bytes:
        """The bytes of ``value``, checked as :meth:`prepare` checks it (a value of exactly an
        atomic type is its own read-back)."""
        if self.atomic and type(value) is self.type:
            try:
                return _encoder.encode(value)
            except OverflowError:  # an int beyond 64 bits: prepare says so
                pass
        return self.prepare(value, what=what)[1]

    def decode(self, data: bytes, *, what: object = "a stored value") -> T:
        """Decode stored bytes; :class:`RecordDecodeError` if they no longer read as ``T``."""
        try:
            return self._decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise RecordDecodeError(
                f"{what} does not read back as {self.name} ({exc}); its type changed since it was "
                "written: keep the old type readable, or start a new scope"
            ) from None


#: Types whose every value (of exactly that type) encodes and reads back as an equal value.
_ATOMIC: Final = frozenset({str, int, float, bool, bytes})

_codecs: dict[Any, Codec[Any]] = {}


def codec_for(tp: Any) -> Codec[Any]:
    """The shared codec of ``tp``: building a msgspec decoder per value would cost more than using it."""
    try:
        return _codecs[tp]
    except KeyError:
        codec = _codecs[tp] = Codec(tp)
        return codec
    except TypeError:  # an unhashable type expression: nothing to share it under
        return Codec(tp)


_ATOMS: Final = (
    mi.NoneType,
    mi.BoolType,
    mi.IntType,
    mi.FloatType,
    mi.StrType,
    mi.BytesType,
    mi.DateTimeType,
    mi.DateType,
    mi.TimeType,
    mi.TimeDeltaType,
    mi.UUIDType,
    mi.DecimalType,
    mi.LiteralType,
    mi.EnumType,
)


def is_immutable(tp: Any) -> bool:
    """Whether every value of ``tp`` msgspec decodes is deeply immutable.

    True for scalars, enums, literals, and tuples, frozensets, unions and
    frozen Structs built only of those; False for anything else (lists,
    dicts, ``Any``, mutable Structs, dataclasses), so the answer is safe.
    """
    try:
        return _immutable(mi.type_info(tp), set())
    except Exception:  # a type msgspec or this check cannot look into: copy, to be safe
        return False


def _immutable(info: mi.Type, seen: set[Any]) -> bool:
    if isinstance(info, _ATOMS):
        return True
    if isinstance(info, mi.UnionType):
        return all(_immutable(t, seen) for t in info.types)
    if isinstance(info, mi.TupleType):
        return all(_immutable(t, seen) for t in info.item_types)
    if isinstance(info, (mi.VarTupleType, mi.FrozenSetType)):
        return _immutable(info.item_type, seen)
    if isinstance(info, mi.StructType):
        # info.cls is the class, or a parameterization such as Box[int]: each
        # parameterization is its own type (Box[list[int]] is not Box[int])
        if info.cls in seen:  # a recursive type: immutable if the rest of it is
            return True
        config = (get_origin(info.cls) or info.cls).__struct_config__
        if not config.frozen or config.dict:  # dict=True instances take new attributes
            return False
        seen.add(info.cls)
        return all(_immutable(field.type, seen) for field in info.fields)
    return False


def to_plain(data: bytes) -> Any:
    """Decode stored bytes to plain JSON-like values (for inspection)."""
    return _plain_decoder.decode(data)
