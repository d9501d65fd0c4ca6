"""Dead letters: an exhausted message routed to a stream of its own, with why, so its group moves on."""

# no `from __future__ import annotations`: msgspec reads the fields' types after the class is
# published as streams.DeadLetter, where the type variable T is not a global

import typing
from typing import Any, Generic, TypeVar

import msgspec

from ._errors import HandlerContractError
from ._stream import StreamWriter

__all__ = ["DeadLetter", "check_dead_letter_writer"]

T = TypeVar("T")


class DeadLetter(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """A message that used its whole attempt budget, as its dead-letter stream holds it.

    It is appended in the same commit as the message's acknowledgement, so
    the group moves on exactly when the letter is confirmed. It names the
    error's type, never its text (which may hold private data).
    """

    source: str  #: the stream the message came from: ``scope/node/key``
    seq: int  #: its sequence there
    group: str  #: the consumer group that gave up on it
    node: str  #: the node whose budget it used
    attempts: int  #: confirmed failed attempts
    error_type: str  #: the qualified name of the last failure's error type; "" if unknown
    message: T  #: the message itself


def check_dead_letter_writer(writer: object, item_type: Any) -> StreamWriter[Any]:
    """``writer``, refused with :class:`HandlerContractError` unless it writes ``DeadLetter[item_type]``."""
    if not isinstance(writer, StreamWriter):
        raise HandlerContractError(
            f"dead_letter takes the StreamWriter of a Stream[DeadLetter[...]], got {writer!r}"
        )
    written = writer.stream.core.key.item_type
    if typing.get_origin(written) is not DeadLetter and written is not DeadLetter:
        raise HandlerContractError(
            f"dead_letter writes {writer.stream.core.ref}, a stream of {written!r}; dead letters go "
            f"to a Stream[DeadLetter[{getattr(item_type, '__qualname__', item_type)}]]"
        )
    return writer
