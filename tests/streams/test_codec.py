"""Which decoded values the engine may share between attempts instead of copying."""

from __future__ import annotations

import datetime
import enum
from typing import Any, Generic, Literal, TypeVar

import msgspec
import pytest

from streams._codec import Codec, is_immutable


class Color(enum.Enum):
    RED = 1


class Frozen(msgspec.Struct, frozen=True):
    total: int
    tags: tuple[str, ...] = ()
    when: datetime.datetime | None = None


class Node(msgspec.Struct, frozen=True):
    value: int
    next: Node | None = None


V = TypeVar("V")


class Box(msgspec.Struct, Generic[V], frozen=True):
    x: V


class FrozenWithDict(msgspec.Struct, frozen=True, dict=True):
    total: int


class Mutable(msgspec.Struct):
    total: int


class FrozenHoldingList(msgspec.Struct, frozen=True):
    items: list[int]


@pytest.mark.parametrize(
    "tp",
    [
        int,
        str,
        bytes,
        float,
        bool,
        None,
        Color,
        Literal["a", "b"],
        int | None,
        tuple[int, str],
        tuple[int, ...],
        frozenset[str],
        Frozen,
        Node,
        tuple[Frozen, ...],
        Box[int],
        Box[Frozen],
    ],
)
def test_deeply_immutable_types_are_shared(tp: Any) -> None:
    assert is_immutable(tp)
    assert Codec(tp).immutable


@pytest.mark.parametrize(
    "tp",
    [
        list[int],
        dict[str, int],
        set[int],
        bytearray,
        Any,
        Mutable,
        FrozenHoldingList,
        tuple[list[int], ...],
        int | list[int],
        tuple[Mutable],
        Box[list[int]],
        FrozenWithDict,
        Box[Box[list[int]]],
        tuple[Box[int], Box[list[int]]],
    ],
)
def test_anything_that_could_change_is_copied(tp: Any) -> None:
    assert not is_immutable(tp)
    assert not Codec(tp).immutable
