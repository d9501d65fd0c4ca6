"""Types are named by their shape, never their module: a script and a program importing it agree."""

from __future__ import annotations

import dataclasses
import types
from enum import Enum
from typing import Annotated, Any, Literal, NamedTuple, NewType, Optional, TypedDict, Union

import attrs
import msgspec
import pydantic
import pytest

from streams import Graph, Key, NodeContext, Stream
from streams.store import qualified_type_name, type_differences, type_name

#: An application's types and graph, compiled once as ``python app.py`` runs them and once as a
#: program that does ``import app`` loads them.
APP = """
from __future__ import annotations

from enum import Enum

import msgspec

from streams import Graph, Key, Stream


class Size(Enum):
    SMALL = "s"
    LARGE = "l"


class Item(msgspec.Struct):
    sku: str
    size: Size


class Order(msgspec.Struct):
    number: int
    items: list[Item]
    note: str | None = None


COUNT = Key("count", int)
ORDERS = Key("orders", Stream[Order])
TOTAL = Key("total", int)


async def take(ctx):
    pass


graph = Graph("shop", inputs=[COUNT])
graph.add_node("take", take, requires=[COUNT], provides=[ORDERS])
graph.add_node("tally", take, requires=[ORDERS], provides=[TOTAL])
"""


def app(module: str, monkeypatch: pytest.MonkeyPatch, source: str = APP) -> types.ModuleType:
    loaded = types.ModuleType(module)
    monkeypatch.setitem(__import__("sys").modules, module, loaded)  # where annotations are looked up
    exec(compile(source, "app.py", "exec"), loaded.__dict__)
    return loaded


def test_a_type_is_named_alike_whatever_module_loaded_it(monkeypatch: pytest.MonkeyPatch) -> None:
    as_script, as_import = app("__main__", monkeypatch), app("app", monkeypatch)
    assert as_script.Order is not as_import.Order
    named = (
        "Order{number: int, items: list[Item{sku: str, size: Size{SMALL='s', LARGE='l'}}], note: str | None}"
    )
    assert type_name(as_script.Order) == type_name(as_import.Order) == named
    script, imported = as_script.graph.topology(), as_import.graph.topology()
    assert script.fingerprint == imported.fingerprint and script.shape == imported.shape
    # the names releases before gave the types: with the module, so they differed
    assert qualified_type_name(as_script.Order) == "__main__.Order"
    assert qualified_type_name(as_import.ORDERS.type) == "streams.Stream[app.Order]"
    assert script.legacy_fingerprint != imported.legacy_fingerprint


def test_a_field_added_names_the_type_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    before = app("app", monkeypatch)
    after = app(
        "app",
        monkeypatch,
        APP.replace("    note: str | None = None", "    note: str | None = None\n    rush: bool = False"),
    )
    assert type_name(before.Order) != type_name(after.Order)
    assert before.graph.topology().fingerprint != after.graph.topology().fingerprint
    assert type_differences(type_name(before.ORDERS.type), type_name(after.ORDERS.type)) == [
        "type Order: field 'rush' is new"
    ]


class Color(Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass
class Point:
    x: float
    label: Optional[str]  # noqa: UP045 - the spelling is what is named alike


class Pair(NamedTuple):
    left: int
    right: tuple[int, ...]


class Totals(TypedDict):
    by_sku: dict[str, int]


@attrs.define
class Box:
    width: int


class Model(pydantic.BaseModel):
    point: Point
    colors: list[Color]


class Tree(msgspec.Struct):
    value: int
    children: list[Tree]


class Graph2(msgspec.Struct):
    nodes: dict[str, Tree | None]


UserId = NewType("UserId", int)


@pytest.mark.parametrize(
    ("tp", "name"),
    [
        (int, "int"),
        (None, "None"),
        (list[int], "list[int]"),
        (dict[str, bytes], "dict[str, bytes]"),
        (tuple[int, ...], "tuple[int, ...]"),
        (Optional[int], "int | None"),  # noqa: UP045
        (Union[int, str], "int | str"),  # noqa: UP007
        (int | None, "int | None"),
        (Literal["a", 1, Color.RED], "Literal['a', 1, Color.RED]"),
        (Annotated[int, msgspec.Meta(ge=0)], "int"),
        (Any, "Any"),
        (UserId, "UserId(int)"),
        (Stream[int], "Stream[int]"),
        (Color, "Color{RED=1, BLUE=2}"),
        (Point, "Point{x: float, label: str | None}"),
        (Pair, "Pair{left: int, right: tuple[int, ...]}"),
        (Totals, "Totals{by_sku: dict[str, int]}"),
        (Box, "Box{width: int}"),
        (Model, "Model{point: Point{x: float, label: str | None}, colors: list[Color{RED=1, BLUE=2}]}"),
        (Tree, "Tree{value: int, children: list[Tree]}"),  # met again inside itself: by its name
        (Graph2, "Graph2{nodes: dict[str, Tree{value: int, children: list[Tree]} | None]}"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_types_are_named_by_their_structure(tp: Any, name: str) -> None:
    assert type_name(tp) == name


def test_differences_name_the_type_inside_that_changed_and_how() -> None:
    was = "Stream[Order{number: int, items: list[Item{sku: str, size: Size{SMALL='s'}}], note: str}]"
    is_ = "Stream[Order{number: str, items: list[Item{size: Size{SMALL='s', XL='x'}, sku: str}]}]"
    assert type_differences(was, is_) == [
        "type Order: field 'note' is gone",
        "type Order: field 'number' was int, is str",
        "type Size: member 'XL' is new",
        "type Item: its fields are in another order",
    ]
    assert type_differences("int", "str") == []  # the names say it all
    assert type_differences("app.Order", "Order{number: int}") == []  # not a name of this release's
    assert type_differences("streams.Stream[app.Order]", "Stream[Order{a: int}]") == []


def test_a_graphs_mismatch_reads_the_type_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger._identity import topology_differences

    before = app("app", monkeypatch).graph.topology()
    changed = APP.replace("    sku: str\n", "    sku: str\n    weight: float\n")
    after = app("app", monkeypatch, changed).graph.topology()
    found = topology_differences(before.shape, after.shape)
    assert [difference.split(" was ")[0] for difference in found] == [
        "node 'take' provides key 'orders'",
        "node 'tally' requires key 'orders'",
    ]
    assert found[0].endswith(
        ", is Stream[Order{number: int, items: list[Item{sku: str, weight: float, size: Size{SMALL='s', "
        "LARGE='l'}}], note: str | None}] (type Item: field 'weight' is new)"
    )


def test_a_key_and_a_refused_channel_are_named_with_their_module() -> None:
    assert (
        repr(Key("orders", Stream[Tree]))
        == "Key('orders', streams.Stream[tests.streams.test_type_names.Tree])"
    )


async def _never(ctx: NodeContext) -> None:
    raise AssertionError("not run")


def test_a_graph_of_builtin_types_keeps_its_fingerprint() -> None:
    g = Graph("plain", inputs=[Key("n", int)])
    g.add_node("double", _never, requires=[Key("n", int)], provides=[Key("twice", list[int])])
    topology = g.topology()
    assert topology.fingerprint == topology.legacy_fingerprint  # no class, no stream: named as before
