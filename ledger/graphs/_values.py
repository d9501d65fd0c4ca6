"""Writing values down through their types, and reading them back.

A checkpoint holds a value only if it reads back as it was: written down and
read back through its type, it must compare equal (and, before a decision,
be of the same class, since a decision routes by class). A one-shot iterator
is never written down, since writing it would use it up. A value that fails
any of this is not written, and the boundary is skipped.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, Literal, cast

from pydantic import BaseModel, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

__all__ = ["NotWritable", "SkipReason", "describe_invalid", "holds_one_shot", "write_down"]

SkipReason = Literal[
    "untyped", "one_shot", "not_serializable", "reads_back_different", "reads_back_as_other_class"
]


class NotWritable(Exception):
    """A value that cannot be written into a checkpoint (internal: the boundary is skipped)."""

    def __init__(self, reason: SkipReason) -> None:
        super().__init__(reason)
        self.reason: SkipReason = reason


def write_down(
    adapter: TypeAdapter[Any], value: Any, *, same_class: bool = False, one_shot_checked: bool = False
) -> bytes:
    """``value`` as JSON through ``adapter``, if it reads back equal; else raise :class:`NotWritable`.

    ``one_shot_checked`` says the caller has already found no iterator in ``value``.
    """
    if not one_shot_checked and holds_one_shot(value):
        raise NotWritable("one_shot")
    try:
        data = adapter.dump_json(value, warnings=False)
    except (PydanticSerializationError, TypeError, ValueError):
        raise NotWritable("not_serializable") from None
    try:
        back = adapter.validate_json(data)
    except ValidationError:
        raise NotWritable("reads_back_different") from None
    if same_class and type(back) is not type(value):
        raise NotWritable("reads_back_as_other_class")
    try:
        equal = bool(back == value)
    except (TypeError, ValueError):  # e.g. an array whose == is element-wise
        equal = False
    if not equal:
        raise NotWritable("reads_back_different")
    return data


def holds_one_shot(value: Any) -> bool:
    """Whether ``value`` is, or holds in a container, dataclass or model, an iterator.

    What to do with a value is decided once per class (:func:`_kind`): a
    step's state and inputs are of a few classes, met at every step.
    """
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        cls = type(item)
        if cls in _ATOMIC:  # the common case first
            continue
        kind = _KINDS.get(cls)
        if kind is None:
            kind = _KINDS[cls] = _kind(cls)
        if kind is _LEAF:
            continue
        if kind is _ONE_SHOT:
            return True
        if id(item) in seen:
            continue
        seen.add(id(item))
        if kind is _ITEMS:
            stack.extend(item)
        elif kind is _MAPPING:
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            stack.extend(getattr(item, name) for name in cast(tuple[str, ...], kind))
    return False


class _Kind:
    """What :func:`holds_one_shot` does with a value of a class (the classes' fields are tuples)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_LEAF: Final = _Kind("leaf")  # holds nothing that could be an iterator
_ONE_SHOT: Final = _Kind("one_shot")  # an iterator (async or not)
_ITEMS: Final = _Kind("items")  # a list, tuple, set or frozenset: look at its items
_MAPPING: Final = _Kind("mapping")  # a dict: look at its keys and values


def _kind(cls: type[object]) -> _Kind | tuple[str, ...]:
    """What a value of ``cls`` is to :func:`holds_one_shot`; a tuple names the fields to look into.

    ``isinstance`` against the iterator ABCs asks the class, so the answer
    holds for every instance of it.
    """
    if cls in _ATOMIC:
        return _LEAF
    if issubclass(cls, Iterator | AsyncIterator):
        return _ONE_SHOT
    if issubclass(cls, str | bytes | bytearray | int | float | bool):
        return _LEAF
    if issubclass(cls, list | tuple | set | frozenset):
        return _ITEMS
    if issubclass(cls, dict):
        return _MAPPING
    return _attribute_names(cls) or _LEAF


def _attribute_names(cls: type[object]) -> tuple[str, ...]:
    """The fields of a pydantic model or dataclass, which may hold iterators; none for other classes."""
    if issubclass(cls, BaseModel):
        return tuple(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return tuple(field.name for field in dataclasses.fields(cls))
    return ()


_KINDS: Final[weakref.WeakKeyDictionary[type[object], _Kind | tuple[str, ...]]] = weakref.WeakKeyDictionary()


_ATOMIC: Final = frozenset({str, bytes, bytearray, int, float, bool, type(None)})
_MAX_ERRORS: Final = 5


def describe_invalid(part: str, error: ValidationError, adapter: TypeAdapter[Any]) -> str:
    """Where and why a saved value fails validation, without the value.

    Each error gives its pydantic error type and location; location segments
    that are not field names of the type (dictionary keys, which may be
    private) are shown as ``*``.
    """
    fields = _field_names(adapter)
    problems = []
    for detail in error.errors(include_url=False, include_input=False, include_context=False)[:_MAX_ERRORS]:
        loc = ".".join(str(seg) if isinstance(seg, int) or seg in fields else "*" for seg in detail["loc"])
        problems.append(f"{detail['type']} at {loc or '(root)'}")
    more = error.error_count() - len(problems)
    suffix = f"; and {more} more" if more > 0 else ""
    return f"{part}: {'; '.join(problems)}{suffix}"


def _field_names(adapter: TypeAdapter[Any]) -> frozenset[str]:
    try:
        schema = adapter.json_schema()
    except PydanticUserError:  # a type with no JSON schema: show no names
        return frozenset()
    names: set[str] = set()
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict):
                names.update(properties)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return frozenset(names)
