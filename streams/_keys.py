"""Typed keys: ``Key("orders", Stream[Order])`` declares a managed stream of ``Order``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Final, Generic, NamedTuple, TypeVar, final, get_args, get_origin, get_type_hints

from ._partition_rules import check_partitions
from ._type_names import qualified_type_name

__all__ = ["Key", "NoValue", "NoValueType", "Stream", "check_name", "refuse_as_key_types"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Stream(Generic[T_co]):
    """Marker for a managed stream of ``T`` in a key declaration: ``Key("k", Stream[T])``.

    It is never instantiated; endpoints are :class:`~streams.StreamWriter` and
    :class:`~streams.StreamReader`.
    """

    def __new__(cls, *args: object, **kwargs: object) -> Stream[T_co]:
        raise TypeError("Stream[T] is a declaration marker; open endpoints through a StreamScope")


@final
class NoValueType:
    """The type of :data:`NoValue`, its only instance: annotate "a value or none" as ``T | NoValueType``."""

    _instance: NoValueType | None = None

    def __new__(cls) -> NoValueType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NoValue"

    def __bool__(self) -> bool:
        return False


#: The value of a key that was skipped rather than set.
NoValue: Final = NoValueType()


class Key(Generic[T]):
    """A named, typed slot. ``Key("orders", Stream[Order])`` is a stream key of ``Order``.

    Keys compare by name, type and partitions. The type is kept at run time
    and used to validate and decode values.

    A stream key may declare the stream partitioned:
    ``Key("orders", Stream[Order], partitions=8, partition_key=lambda o: o.customer)``.
    Its writer node sends each message to its key's partition, and its
    readers handle the partitions at once, each in order
    (:meth:`NodeContext.partitioned_writer`, :meth:`NodeContext.handle_messages`
    with ``concurrency=``). The key function is not part of the key's
    identity; the number of partitions is.
    """

    __slots__ = ("_hash", "item_type", "name", "partition_key", "partitions", "type")

    def __init__(
        self,
        name: str,
        type_: type[T],
        *,
        partitions: int | None = None,
        partition_key: Callable[[Any], Any] | None = None,
    ) -> None:
        check_name(name, "a key name")
        problem = hidden_channel(type_)
        if problem is not None:
            raise TypeError(f"key {name!r}: {problem}")
        self.name = name
        self.type: Any = type_
        self.item_type: Any = get_args(type_)[0] if get_origin(type_) is Stream else None
        if partitions is not None or partition_key is not None:
            if self.item_type is None:
                raise TypeError(f"key {name!r}: only a stream key, Key(name, Stream[T]), has partitions")
            check_partitions(partitions, partition_key)
        #: The number of partitions of the stream it declares (None: a stream of its own).
        self.partitions: int | None = partitions
        #: The function giving a message its partition key (None for a stream of its own).
        self.partition_key: Callable[[Any], Any] | None = partition_key
        # keys are looked up in every graph and execution map
        self._hash = hash((name, repr(type_), partitions))

    @property
    def is_stream(self) -> bool:
        """Whether this key declares a managed stream."""
        return self.item_type is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and (self.name, self.type, self.partitions) == (
            other.name,
            other.type,
            other.partitions,
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self.partitions is not None:
            return f"Key({self.name!r}, {qualified_type_name(self.type)}, partitions={self.partitions})"
        return f"Key({self.name!r}, {qualified_type_name(self.type)})"


def check_name(name: object, what: str) -> None:
    """Names of keys, scopes, nodes and groups: non-empty UTF-8 text without '/' or NUL.

    They form identities and idempotency keys joined by '/', and every store
    must be able to keep them.
    """
    if not isinstance(name, str) or not name or "/" in name or "\x00" in name:
        raise ValueError(f"{what} must be a non-empty string without '/' or NUL, got {name!r}")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid UTF-8 text, got {name!r}") from None


#: Native channels: local objects that no ledger can confirm, each named by the module it is
#: imported from and its name there. A type is refused if it is one of them or a subclass, compared
#: by identity, never by ``__module__``, which packages rewrite (``trio.MemorySendChannel`` says
#: ``trio``, anyio's abstract streams ``anyio.abc``). They are looked up only in modules already
#: imported: a class of a module nobody imported cannot be a key's type. Declare a managed stream as
#: ``Key(name, Stream[T])`` instead.
_NATIVE_CHANNELS: Final = (
    ("asyncio", "Queue"),
    ("queue", "Queue"),
    ("queue", "SimpleQueue"),
    ("multiprocessing.queues", "Queue"),
    ("anyio.abc", "UnreliableObjectReceiveStream"),  # every anyio object stream, memory ones included
    ("anyio.abc", "UnreliableObjectSendStream"),
    ("trio", "MemorySendChannel"),
    ("trio", "MemoryReceiveChannel"),
)


_CHANNEL_MODULES: Final = tuple(dict.fromkeys(module for module, _ in _NATIVE_CHANNELS))


def _native_channels() -> tuple[type, ...]:
    found = (getattr(sys.modules.get(module), name, None) for module, name in _NATIVE_CHANNELS)
    return tuple(cls for cls in found if isinstance(cls, type))


#: The stream endpoints and the engine's side of them, as registered by :func:`refuse_as_key_types`;
#: compared by identity, since the package renames their ``__module__`` to ``streams``.
_endpoints: list[type] = []


def refuse_as_key_types(*classes: type) -> None:
    """Refuse ``classes`` (and their subclasses) in a key's type: the stream endpoints of a running scope.

    Called by the module that defines them, so that this one needs no import of it.
    """
    _endpoints.extend(cls for cls in classes if cls not in _endpoints)
    _answers.refused = None
    _answers.by_type = {}


class _Refused(NamedTuple):
    """The classes a key's type may neither be nor hold, by kind."""

    channels: tuple[type, ...]
    endpoints: tuple[type, ...]


def hidden_channel(tp: Any) -> str | None:
    """Why ``tp`` cannot be a key's type, or None: a native channel, an endpoint, or a nested stream.

    Walks generic arguments and the fields of msgspec Structs and dataclasses,
    once per type (recursive types are fine). The answer is kept per type
    until a module of a native channel is imported (or unloaded): a graph
    declares many keys of the same few types.
    """
    imported = tuple(id(sys.modules.get(module)) for module in _CHANNEL_MODULES)
    if imported != _answers.imported:
        _answers.imported, _answers.refused, _answers.by_type = imported, None, {}
    try:
        return _answers.by_type[tp]
    except KeyError:
        pass
    except TypeError:  # an unhashable annotation: asked each time
        return _hidden_channel(tp)
    answer = _answers.by_type[tp] = _hidden_channel(tp)
    return answer


class _Answers:
    """:func:`hidden_channel`'s answers, for the native channel modules imported when they were given."""

    imported: tuple[int, ...] = ()
    refused: _Refused | None = None
    by_type: dict[Any, str | None] = {}  # noqa: RUF012 - replaced whole, never shared


_answers = _Answers()


def _hidden_channel(tp: Any) -> str | None:
    refused = _answers.refused
    if refused is None:
        refused = _answers.refused = _Refused(_native_channels(), tuple(_endpoints))
    if get_origin(tp) is Stream:
        args = get_args(tp)
        return _channel_in(args[0], refused, set(), "the message type") if args else None
    return _channel_in(tp, refused, set(), "the type")


def _channel_in(tp: Any, refused: _Refused, seen: set[int], where: str) -> str | None:
    if id(tp) in seen:
        return None
    seen.add(id(tp))
    origin = get_origin(tp)
    if origin is Stream:
        return (
            f"{where} holds {qualified_type_name(tp)}: a managed stream is declared only as a key of its "
            "own, Key(name, Stream[T]), never inside another type"
        )
    cls = origin if isinstance(origin, type) else tp
    inner: list[Any] = list(get_args(tp))
    if isinstance(cls, type):
        if issubclass(cls, refused.endpoints):
            return (
                f"{where} is or holds {qualified_type_name(cls)}, a stream endpoint of a running scope: "
                "declare the stream as Key(name, Stream[T]) and open its endpoints from the key"
            )
        if issubclass(cls, refused.channels):
            return (
                f"{where} is or holds {qualified_type_name(cls)}, a local channel no ledger can confirm: "
                "declare a managed stream as Key(name, Stream[T])"
            )
        inner.extend(_field_types(cls))
    for part in inner:
        found = _channel_in(part, refused, seen, where)
        if found is not None:
            return found
    return None


def _field_types(cls: type) -> list[Any]:
    """The declared field types of a msgspec Struct or a dataclass; none for other classes."""
    if not (hasattr(cls, "__struct_fields__") or hasattr(cls, "__dataclass_fields__")):
        return []
    try:
        return list(get_type_hints(cls).values())
    except Exception:  # an annotation that does not resolve here: the codec reports it when built
        return []
