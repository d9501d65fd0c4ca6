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
from typing import Any, Final, Literal

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
    """Whether ``value`` is, or holds in a container, dataclass or model, an iterator."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) in _ATOMIC:  # the common case first: no ABC check for plain values
            continue
        if isinstance(item, Iterator | AsyncIterator):
            return True
        if isinstance(item, str | bytes | bytearray | int | float | bool | None) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            stack.extend(getattr(item, name) for name in _attribute_names(type(item)))
    return False


def _attribute_names(cls: type[object]) -> tuple[str, ...]:
    """The fields of a pydantic model or dataclass, which may hold iterators; none for other classes."""
    names = _ATTRIBUTE_NAMES.get(cls)
    if names is None:
        if issubclass(cls, BaseModel):
            names = tuple(cls.model_fields)
        elif dataclasses.is_dataclass(cls):
            names = tuple(field.name for field in dataclasses.fields(cls))
        else:
            names = ()
        _ATTRIBUTE_NAMES[cls] = names
    return names


_ATTRIBUTE_NAMES: Final[weakref.WeakKeyDictionary[type[object], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


_ATOMIC: Final = frozenset({str, bytes, bytearray, int, float, bool, type(None)})
_MAX_ERRORS: Final = 5


def describe_invalid(part: str, error: ValidationError, adapter: TypeAdapter[Any]) -> str:
    """Where and why a saved value no longer validates, without the value.

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
