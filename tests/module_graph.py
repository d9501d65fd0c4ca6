"""The modules' import graph and their use of each other's private members, read from the source.

``imports_of`` lists the modules a module imports (at its top, inside a
function, or under ``TYPE_CHECKING``); ``circles`` finds the import circles
of a graph; ``reaches`` lists where a module's source reads or writes a
private attribute (``x._name``, ``x`` not ``self`` or ``cls``) that the
module does not define itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "MODULES",
    "ROOT",
    "circles",
    "import_graph",
    "imports_of",
    "module_name",
    "own_members",
    "reaches",
]

ROOT = Path(__file__).resolve().parents[1]
#: The packages whose modules are checked: the engine and its stores, and the ledger.
PACKAGES = ("streams", "ledger")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imports_of(name: str) -> Iterator[tuple[str, int, str]]:
    """Every module of the checked packages that module ``name`` imports: (module, line, where: top, function,
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


def import_graph() -> dict[str, set[str]]:
    return {name: {target for target, _, _ in imports_of(name)} for name in MODULES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def own_members(tree: ast.Module) -> set[str]:
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


def reaches(source: str) -> list[str]:
    tree = ast.parse(source)
    own = own_members(tree)
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
