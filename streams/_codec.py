"""msgspec codecs for the values of typed keys."""

from __future__ import annotations

from typing import Any, Final, Generic, TypeVar

import msgspec

from ._errors import PayloadTypeError, RecordDecodeError
from ._keys import type_name

__all__ = ["CODEC_ID", "CODEC_VERSION", "Codec", "to_plain"]

CODEC_ID: Final = "msgpack"
CODEC_VERSION: Final = 1

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_plain_decoder = msgspec.msgpack.Decoder()


class Codec(Generic[T]):
    """Validates, encodes and decodes values of one type with msgspec msgpack.

    A value is checked by reading back what was written: :meth:`prepare`
    encodes it and decodes the bytes as ``T``. That catches what an
    ``isinstance`` check cannot (a Struct field of the wrong type, ``True``
    for an ``int``), and the decoded copy is what readers and handlers get,
    so a run that was restarted sees exactly what an uninterrupted one saw.
    """

    __slots__ = ("_decoder", "name", "type")

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self.name = type_name(tp)
        try:
            self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(tp)
        except TypeError as exc:
            raise PayloadTypeError(f"type {self.name} cannot be stored: {exc}") from None

    def prepare(self, value: object, *, what: object) -> tuple[T, bytes]:
        """``value`` as it reads back, and its bytes; :class:`PayloadTypeError` if it is not a ``T``."""
        try:
            payload = _encoder.encode(value)
            return self._decoder.decode(payload), payload
        except (msgspec.MsgspecError, TypeError, ValueError, ArithmeticError, RecursionError) as exc:
            raise PayloadTypeError(
                f"{what} takes {self.name}, got a {type(value).__qualname__} that does not read back "
                f"as one ({exc}); nothing was written"
            ) from None

    def encode(self, value: T) -> bytes:
        return _encoder.encode(value)

    def decode(self, data: bytes, *, what: object = "a stored value") -> T:
        """Decode stored bytes; :class:`RecordDecodeError` if they no longer read as ``T``."""
        try:
            return self._decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise RecordDecodeError(
                f"{what} does not read back as {self.name} ({exc}); its type changed since it was "
                "written: keep the old type readable, or start a new scope"
            ) from None


def to_plain(data: bytes) -> Any:
    """Decode stored bytes to plain JSON-like values (for inspection)."""
    return _plain_decoder.decode(data)
