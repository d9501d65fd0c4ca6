"""Dead letters: an exhausted message routed to a stream of its own, with why, so its group moves on."""

# no `from __future__ import annotations`: msgspec reads the fields' types after the class is
# published as streams.DeadLetter, where the type variable T is not a global

import typing
from typing import Any, Generic, TypeVar

import msgspec

from ._errors import HandlerContractError
from ._stream import StreamCore, StreamWriter, core_of

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


def check_dead_letter_writer(writer: object, source: StreamCore[Any]) -> StreamWriter[Any]:
    """``writer``, refused with :class:`HandlerContractError` unless it can take ``source``'s dead letters.

    Checked before the first message, so no budget is spent on a letter that
    could never be written: it writes ``DeadLetter[T]`` of ``source``'s
    item type ``T`` (or ``DeadLetter[Any]``), on the same store.
    """
    item_type = source.key.item_type
    wanted = f"Stream[DeadLetter[{getattr(item_type, '__qualname__', item_type)}]]"
    if not isinstance(writer, StreamWriter):
        raise HandlerContractError(f"dead_letter takes the StreamWriter of a {wanted}, got {writer!r}")
    target = core_of(writer.stream)
    written = target.key.item_type
    args = typing.get_args(written)
    letters = (typing.get_origin(written) or written) is DeadLetter
    if not letters or (args and args[0] not in (item_type, Any)):
        raise HandlerContractError(
            f"dead_letter writes {target.ref}, a stream of {written!r}; the dead letters of "
            f"{source.ref} go to a {wanted}"
        )
    if target.hooks is not source.hooks:
        raise HandlerContractError(
            f"dead_letter writes {target.ref} on another store than {source.ref}'s: a dead letter is "
            "confirmed in the same commit as its message's ack, so both streams share one store"
        )
    return writer
