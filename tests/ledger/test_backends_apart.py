"""The two backends are siblings: neither imports the other, nor anything that imports the other.

Read from the source (every import statement, at module level or inside a
function): ``ledger/lmdb`` and ``ledger/postgres`` each import the
backend-neutral modules of ``ledger`` and their own, and the neutral
modules they import reach neither backend. The command line and
``connect`` choose a backend by the target, so they may import both, lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ledger"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _statements(path: Path, *, top_level: bool) -> list[ast.stmt]:
    tree = ast.parse(path.read_text(), str(path))
    if not top_level:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    return [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]


def imports(path: Path, *, top_level: bool = False) -> set[str]:
    """The modules of ``ledger`` that ``path`` imports, by full name (``from x import y`` counts x,
    and x.y when y is a module). ``top_level``: only those run when the module is imported."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(path, top_level=top_level):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        found.add(target)
        found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules)
    return {m for m in found if m == "ledger" or m.startswith("ledger.")}


modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def module_level_closure(start: str) -> set[str]:
    """The ledger modules ``start`` imports when it is imported, and theirs, transitively.

    The package ``ledger`` itself is left out: it re-exports both backends
    for users, and no module of a backend imports it."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo.extend(imports(modules[name], top_level=True) - {"ledger"})
    return seen - {start}


def of(package: str) -> list[str]:
    return sorted(m for m in modules if m == package or m.startswith(package + "."))


def test_neither_backend_imports_the_other() -> None:
    for mine, other in (("ledger.lmdb", "ledger.postgres"), ("ledger.postgres", "ledger.lmdb")):
        for name in of(mine):
            wrong = {m for m in imports(modules[name]) if m == other or m.startswith(other + ".")}
            assert not wrong, f"{name} imports {sorted(wrong)}"


def test_the_neutral_modules_a_backend_imports_reach_neither_backend() -> None:
    for mine, other in (("ledger.lmdb", "ledger.postgres"), ("ledger.postgres", "ledger.lmdb")):
        for name in of(mine):
            reached = module_level_closure(name)
            wrong = {m for m in reached if m == other or m.startswith(other + ".")}
            assert not wrong, f"{name} reaches {sorted(wrong)} through the modules it imports"


def test_the_command_line_reaches_no_private_module_of_a_backend() -> None:
    for name in ("ledger._cli", "ledger._postgres_cli", "ledger._groups", "ledger._tools", "ledger._connect"):
        private = {
            m
            for m in imports(modules[name])
            if m.startswith(("ledger.lmdb.", "ledger.postgres.")) and m.rpartition(".")[2].startswith("_")
        }
        assert not private, f"{name} imports {sorted(private)}"


def test_no_module_of_a_backend_imports_the_package_that_exports_both() -> None:
    for name in of("ledger.lmdb") + of("ledger.postgres"):
        assert "ledger" not in imports(modules[name]), name


def test_streams_imports_no_ledger() -> None:
    for path in (ROOT / "streams").rglob("*.py"):
        assert not imports(path), f"{path} imports {sorted(imports(path))}"
