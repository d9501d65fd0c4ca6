"""Names of types by what they declare, so that an identity does not depend on the module that loaded them.

A topology fingerprint names the type of every port, and a stream's
descriptor the type of its messages. A program run as ``python app.py``
defines its types in module ``__main__``; a program that does ``import
app`` defines the same types in module ``app``. Both must name them alike,
and a type whose fields changed must be named otherwise. So
:func:`type_name` names a type by its shape:

* a class with declared fields (a msgspec ``Struct``, a dataclass, an attrs
  class, a ``NamedTuple``, a ``TypedDict``, a pydantic model) by its
  qualified name and its fields in order, each with its type's name:
  ``Order{number: int, items: list[Item{sku: str}]}``; a class met again
  inside its own fields by its qualified name alone (``Node{children:
  list[Node]}``);
* an ``Enum`` by its qualified name and its members with their values:
  ``Size{SMALL='s', LARGE='l'}``;
* builtins by their name (``int``, ``None``), generics by their structure
  (``list[int]``, ``dict[str, int]``, ``tuple[int, ...]``, ``Stream[Order{...}]``),
  unions with ``|`` (``Optional[int]`` is ``int | None``), ``Literal`` by its
  values, ``Annotated`` by the type it annotates;
* any other class by its qualified name (``datetime``, ``UUID``).

No module appears in a name. :func:`qualified_type_name` names a type
with its module included (``app.Order``): stores accept a descriptor that
names its type so, and :class:`~streams.Topology` keeps the fingerprint it
gives, so that records written under those names resume with the code that
wrote them. Messages about a
class (a key's repr, a refused channel) name its module too: it says where
the class comes from.

:func:`type_differences` reads two names back and says which types inside
them differ, field by field, for errors that must name the type that changed.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterator
from enum import Enum
from typing import (
    Annotated,
    Any,
    ForwardRef,
    Literal,
    NamedTuple,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

__all__ = ["qualified_type_name", "type_differences", "type_name"]


def type_name(tp: Any) -> str:
    """``tp`` named by its shape, the same in every module that declares it alike (module docstring)."""
    return _name(tp, ())


def qualified_type_name(tp: Any) -> str:
    """``tp`` named with its module (``app.Order``, ``list[app.Order]``): the other name a fingerprint
    or a descriptor may hold (besides :func:`type_name`'s), and how messages name a class."""
    origin = get_origin(tp)
    if origin is not None:
        args = ", ".join(qualified_type_name(a) for a in get_args(tp))
        return f"{qualified_type_name(origin)}[{args}]"
    if isinstance(tp, type):
        if tp.__module__ == "builtins":
            return tp.__qualname__
        return f"{tp.__module__}.{tp.__qualname__}"
    return repr(tp)


def _name(tp: Any, within: tuple[type, ...]) -> str:
    if tp is None or tp is type(None):
        return "None"
    if tp is Ellipsis:
        return "..."
    if isinstance(tp, str):  # an annotation that was never resolved, as written
        return tp
    if isinstance(tp, ForwardRef):
        return tp.__forward_arg__
    if isinstance(tp, TypeVar):
        return tp.__name__
    if isinstance(tp, typing.NewType):
        return f"{tp.__name__}({_name(tp.__supertype__, within)})"
    origin = get_origin(tp)
    if origin is not None:
        args = get_args(tp)
        if origin is Union or origin is types.UnionType:
            return " | ".join(_name(arg, within) for arg in args)
        if origin is Literal:
            return f"Literal[{', '.join(_literal(value) for value in args)}]"
        if origin is Annotated:
            return _name(args[0], within)
        head = _name(origin, within)
        return f"{head}[{', '.join(_name(arg, within) for arg in args)}]" if args else head
    if isinstance(tp, type):
        if tp.__module__ == "builtins" or tp in within:
            return tp.__qualname__
        members = _members(tp, (*within, tp))
        return tp.__qualname__ if members is None else f"{tp.__qualname__}{{{', '.join(members)}}}"
    name = getattr(tp, "_name", None) or getattr(tp, "__name__", None)  # typing's special forms
    return name if isinstance(name, str) else repr(tp)


def _literal(value: object) -> str:
    if isinstance(value, Enum):
        return f"{type(value).__qualname__}.{value.name}"
    return repr(value)


def _members(cls: type, within: tuple[type, ...]) -> list[str] | None:
    """``cls``'s fields (``name: type``) or enum members (``NAME=value``); None for a class of neither."""
    if issubclass(cls, Enum):
        return [f"{member.name}={member.value!r}" for member in cls]
    names = _field_names(cls)
    if names is None:
        return None
    hints = _hints(cls)
    return [f"{name}: {_name(hints.get(name, Any), within)}" for name in names]


def _field_names(cls: type) -> list[str] | None:
    struct_fields = getattr(cls, "__struct_fields__", None)  # a msgspec Struct
    if isinstance(struct_fields, tuple):
        return list(struct_fields)
    if dataclasses.is_dataclass(cls):
        return [field.name for field in dataclasses.fields(cls)]
    attrs = getattr(cls, "__attrs_attrs__", None)
    if attrs is not None:
        return [attribute.name for attribute in attrs]
    pydantic_fields = getattr(cls, "__pydantic_fields__", None)  # a pydantic model (v2)
    if isinstance(pydantic_fields, dict):
        return list(pydantic_fields)
    named_tuple_fields = getattr(cls, "_fields", None)
    if issubclass(cls, tuple) and isinstance(named_tuple_fields, tuple):  # a NamedTuple
        return list(named_tuple_fields)
    if typing.is_typeddict(cls):
        return list(_hints(cls))
    return None


def _hints(cls: type) -> dict[str, Any]:
    """The field types of ``cls``, resolved; an annotation that does not resolve here, as written."""
    pydantic_fields = getattr(cls, "__pydantic_fields__", None)
    if isinstance(pydantic_fields, dict):
        return {name: field.annotation for name, field in pydantic_fields.items()}
    try:
        return get_type_hints(cls)
    except Exception:  # a name the class's module does not define (yet): each field as written
        raw: dict[str, Any] = {}
        for base in reversed(cls.__mro__):
            raw.update(getattr(base, "__annotations__", {}))
        return raw


# -- reading names back -------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<text>b?'(?:[^'\\]|\\.)*'|b?"(?:[^"\\]|\\.)*")
      | (?P<punct>\.\.\.|[\[\]{}(),:=|])
      | (?P<word>[^\s\[\]{}(),:=|'"]+)
    )""",
    re.VERBOSE,
)


class _Token(NamedTuple):
    text: str
    punct: bool
    start: int
    end: int


class _Type(NamedTuple):
    """A name read back: its head (``Order``, ``list``, a literal value), members and arguments."""

    text: str
    head: str
    members: tuple[_Member, ...] | None
    args: tuple[_Type, ...]


class _Member(NamedTuple):
    name: str
    kind: str  # "field" (``name: type``) or "member" (an enum's ``NAME=value``)
    type: _Type


class _Unreadable(Exception):
    """A name :func:`type_name` does not write (one with a module, :func:`qualified_type_name`'s)."""


def type_differences(was: str, is_: str) -> list[str]:
    """What differs inside two type names, type by type: ``type Order: field 'note' is new``.

    Empty when the names are equal, when they differ only at the top (``int``
    and ``str``: the names say it all), or when one is not a name
    :func:`type_name` writes (a module-qualified one, as a record may hold).
    """
    if was == is_:
        return []
    try:
        before, now = _Reader(was).whole(), _Reader(is_).whole()
    except _Unreadable:
        return []
    return list(dict.fromkeys(_differences(before, now)))


def _differences(before: _Type, now: _Type) -> Iterator[str]:
    if before.text == now.text or before.head != now.head:
        return
    if len(before.args) == len(now.args):
        for old, new in zip(before.args, now.args, strict=True):
            yield from _differences(old, new)
    if before.members is None or now.members is None:
        return
    where = f"type {before.head}"
    old_members = {member.name: member for member in before.members}
    new_members = {member.name: member for member in now.members}
    for member in before.members:
        if member.name not in new_members:
            yield f"{where}: {member.kind} {member.name!r} is gone"
    for member in now.members:
        if member.name not in old_members:
            yield f"{where}: {member.kind} {member.name!r} is new"
    for was in before.members:
        is_ = new_members.get(was.name)
        if is_ is None or is_.type.text == was.type.text:
            continue
        inner = list(_differences(was.type, is_.type))
        yield from inner or [f"{where}: {was.kind} {was.name!r} was {was.type.text}, is {is_.type.text}"]
    kept = [member.name for member in now.members if member.name in old_members]
    if kept != [member.name for member in before.members if member.name in new_members]:
        yield f"{where}: its {before.members[0].kind}s are in another order"


class _Reader:
    """Reads one name back, by the grammar :func:`type_name` writes (a recursive descent)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tokens: list[_Token] = []
        at = 0
        while name[at:].strip():
            found = _TOKEN.match(name, at)
            if found is None:
                raise _Unreadable(name)
            kind = found.lastgroup or ""
            self.tokens.append(_Token(found.group(kind), kind == "punct", found.start(kind), found.end()))
            at = found.end()
        self.at = 0

    def whole(self) -> _Type:
        tp = self.union()
        if self.at < len(self.tokens):
            raise _Unreadable(self.name)
        return tp

    def peek(self) -> str | None:
        return self.tokens[self.at].text if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> _Token:
        if self.at >= len(self.tokens) or (expected is not None and self.tokens[self.at].text != expected):
            raise _Unreadable(self.name)
        self.at += 1
        return self.tokens[self.at - 1]

    def union(self) -> _Type:
        start = self.at
        alternatives = [self.term()]
        while self.peek() == "|":
            self.take("|")
            alternatives.append(self.term())
        if len(alternatives) == 1:
            return alternatives[0]
        return _Type(self.text(start), "|", None, tuple(alternatives))

    def term(self) -> _Type:
        start = self.at
        head = self.take()
        if head.punct and head.text != "...":
            raise _Unreadable(self.name)
        members = self.members() if self.peek() == "{" else None
        args: tuple[_Type, ...] = ()
        if self.peek() == "[":
            args = self.listed("[", "]")
        elif self.peek() == "(":  # a NewType's supertype
            args = self.listed("(", ")")
        return _Type(self.text(start), head.text, members, args)

    def members(self) -> tuple[_Member, ...]:
        self.take("{")
        found: list[_Member] = []
        while self.peek() != "}":
            if found:
                self.take(",")
            name = self.take().text
            separator = self.take().text
            if separator not in (":", "="):
                raise _Unreadable(self.name)
            found.append(_Member(name, "field" if separator == ":" else "member", self.union()))
        self.take("}")
        return tuple(found)

    def listed(self, opening: str, closing: str) -> tuple[_Type, ...]:
        self.take(opening)
        found: list[_Type] = []
        while self.peek() != closing:
            if found:
                self.take(",")
            found.append(self.union())
        self.take(closing)
        return tuple(found)

    def text(self, start: int) -> str:
        """The name's text from token ``start`` to the last one taken."""
        return self.name[self.tokens[start].start : self.tokens[self.at - 1].end]
