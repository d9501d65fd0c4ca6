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
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "streams"

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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> Iterator[tuple[str, int, str]]:
    """Every module of ``streams`` that module ``name`` imports: (module, line, where: top, function,
    type-checking)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for inner in child.body:
                    yield from walk_one(inner, "type-checking")
                for inner in child.orelse:
                    yield from walk_one(inner, where)
                continue
            yield from walk_one(child, where)

    def walk_one(node: ast.AST, where: str) -> Iterator[tuple[str, int, str]]:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for candidate in (target, *(f"{target}.{alias.name}" for alias in node.names)):
                if candidate in MODULES and candidate != name:
                    yield candidate, node.lineno, where
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name, node.lineno, where
        inner = "function" if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else where
        yield from walk(node, inner)

    yield from walk(ast.parse(path.read_text()), "top")


def _graph() -> dict[str, set[str]]:
    return {name: {target for target, _, _ in _imports(name)} for name in MODULES}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_engine_module_exists() -> None:
    missing = [name for name in ENGINE if f"streams.{name}" not in MODULES]
    assert missing == []


def test_the_circle_finder_finds_a_circle_through_function_and_type_checking_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_engine_module_is_in_an_import_circle() -> None:
    """Counting every import: at module level, inside functions and under ``TYPE_CHECKING``."""
    engine = {f"streams.{name}" for name in ENGINE}
    circles = [circle for circle in _circles(_graph()) if engine & set(circle)]
    assert circles == []


@pytest.mark.parametrize("name", ENGINE)
def test_an_engine_module_imports_at_its_top_only(name: str) -> None:
    """An import inside a function is how a circle hides: the engine has none."""
    inside = [
        f"line {line}: {target}" for target, line, where in _imports(f"streams.{name}") if where == "function"
    ]
    assert inside == []


def test_streams_never_imports_ledger_from_any_module() -> None:
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] != "ledger", name
            elif isinstance(node, ast.Import):
                assert all(alias.name.split(".")[0] != "ledger" for alias in node.names), name


def _own_members(tree: ast.Module) -> set[str]:
    """The private attributes a module defines: its classes' slots, class-level names and methods, and
    whatever its code assigns to ``self._x`` or ``cls._x``."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    own.add(item.name)
                value: ast.expr | None
                if isinstance(item, ast.Assign):
                    targets, value = item.targets, item.value
                elif isinstance(item, ast.AnnAssign):
                    targets, value = [item.target], item.value
                else:
                    continue
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    own.add(target.id)
                    if target.id == "__slots__" and isinstance(value, ast.Tuple | ast.List):
                        own.update(
                            e.value
                            for e in value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
            and isinstance(node.ctx, ast.Store)
        ):
            own.add(node.attr)
    return own


def _reaches(source: str) -> list[str]:
    tree = ast.parse(source)
    own = _own_members(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if attr not in own:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_reach_finder_finds_a_reach_into_another_modules_private_member() -> None:
    source = (
        "class A:\n    def f(self, other):\n        self._mine = other._theirs\n        other._mine = 1\n"
    )
    assert _own_members(ast.parse(source)) == {"f", "_mine"}
    assert _reaches(source) == ["line 3: other._theirs"]
    assert _reaches("def g(level):\n    return level.execution._latch\n") == [
        "line 2: level.execution._latch"
    ]


@pytest.mark.parametrize("name", ENGINE)
def test_an_engine_module_uses_only_the_private_members_it_defines(name: str) -> None:
    assert _reaches(MODULES[f"streams.{name}"].read_text()) == []
