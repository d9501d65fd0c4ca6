"""The engine's modules talk through named interfaces: no import circle, no reaching into private members.

The engine is the execution tree and its parts (levels, node attempts,
restored members, stream endpoints, events), the context a node and its
aspects see, the aspects, node commits and restore plans, and the graph
definitions they run. Each module imports only those below it, with no
import inside a function or under ``TYPE_CHECKING`` to close a circle, and
uses another module's objects only through their public members: one
module's private attribute (``x._name``, where ``x`` is not ``self`` or
``cls``) is read or written only by the module that defines it.
"""

from __future__ import annotations

import ast

import pytest

from ..module_graph import MODULES, circles, import_graph, imports_of, own_members, reaches

#: The modules of the engine, under ``streams``.
ENGINE = (
    "_aliases",
    "_aspects",
    "_attempt",
    "_checkpoint",
    "_context",
    "_endpoints",
    "_events",
    "_execution",
    "_graph",
    "_in_context",
    "_level",
    "_node_commits",
    "_node_spans",
    "_outcome",
    "_plan",
    "_restore",
    "_tree",
)


def test_every_engine_module_exists() -> None:
    missing = [name for name in ENGINE if f"streams.{name}" not in MODULES]
    assert missing == []


def test_the_circle_finder_finds_a_circle_through_function_and_type_checkingimports_of() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_engine_module_is_in_an_import_circle() -> None:
    """Counting every import: at module level, inside functions and under ``TYPE_CHECKING``."""
    engine = {f"streams.{name}" for name in ENGINE}
    found = [circle for circle in circles(import_graph()) if engine & set(circle)]
    assert found == []


@pytest.mark.parametrize("name", ENGINE)
def test_an_engine_module_imports_at_its_top_only(name: str) -> None:
    """An import inside a function is how a circle hides: the engine has none."""
    inside = [
        f"line {line}: {target}"
        for target, line, where in imports_of(f"streams.{name}")
        if where == "function"
    ]
    assert inside == []


def test_streams_never_imports_ledger_from_any_module() -> None:
    for name, path in MODULES.items():
        if not name.startswith("streams"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] != "ledger", name
            elif isinstance(node, ast.Import):
                assert all(alias.name.split(".")[0] != "ledger" for alias in node.names), name


def test_the_reach_finder_finds_a_reach_into_another_modules_private_member() -> None:
    source = (
        "class A:\n    def f(self, other):\n        self._mine = other._theirs\n        other._mine = 1\n"
    )
    assert own_members(ast.parse(source)) == {"f", "_mine"}
    assert reaches(source) == ["line 3: other._theirs"]
    assert reaches("def g(level):\n    return level.execution._latch\n") == ["line 2: level.execution._latch"]


@pytest.mark.parametrize("name", ENGINE)
def test_an_engine_module_uses_only_the_private_members_it_defines(name: str) -> None:
    assert reaches(MODULES[f"streams.{name}"].read_text()) == []
