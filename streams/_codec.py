"""msgspec codecs for the values of typed keys."""

from __future__ import annotations

from typing import Any, Final, Generic, TypeVar, get_origin

import msgspec

from ._errors import PayloadTypeError
from ._keys import type_name

__all__ = ["CODEC_ID", "CODEC_VERSION", "Codec", "to_plain"]

CODEC_ID: Final = "msgpack"
CODEC_VERSION: Final = 1

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_plain_decoder = msgspec.msgpack.Decoder()


class Codec(Generic[T]):
    """Validates, encodes and decodes values of one type with msgspec msgpack."""

    __slots__ = ("_class", "_decoder", "name", "type")

    def __init__(self, tp: Any) -> None:
        self.type = tp
        self.name = type_name(tp)
        try:
            self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(tp)
        except TypeError as exc:
            raise PayloadTypeError(f"type {self.name} cannot be stored: {exc}") from None
        plain = isinstance(tp, type) and get_origin(tp) is None and tp is not float
        self._class: type | None = tp if plain else None

    def check(self, value: object, *, what: object) -> None:
        """Raise :class:`PayloadTypeError` unless ``value`` is a ``T``; ``what`` names the target."""
        if self._class is not None:
            if isinstance(value, self._class):
                return
            raise PayloadTypeError(
                f"{what} takes {self.name}, got a {type(value).__qualname__}; nothing was written"
            )
        try:
            msgspec.convert(value, self.type, strict=True)
        except (msgspec.ValidationError, TypeError) as exc:
            raise PayloadTypeError(
                f"{what} takes {self.name}, got a {type(value).__qualname__} ({exc}); nothing was written"
            ) from None

    def encode(self, value: T) -> bytes:
        return _encoder.encode(value)

    def decode(self, data: bytes) -> T:
        return self._decoder.decode(data)


def to_plain(data: bytes) -> Any:
    """Decode stored bytes to plain JSON-like values (for inspection)."""
    return _plain_decoder.decode(data)
