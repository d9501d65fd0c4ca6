"""The errors: one errors module per package, its drawn tree true, every error exported and documented.

Each package defines its errors in one module (``streams._errors``,
``ledger._errors``, ``ledger.graphs._errors``) whose docstring draws them as
a tree: indentation gives a class's parent, parentheses its other bases.
The drawing is checked against the classes, both ways.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledger import LedgerError
from ledger._cli import _exit_code
from streams import StreamsError

ROOT = Path(__file__).resolve().parent.parent

#: Each package's errors module.
ERRORS_MODULES: Mapping[str, str] = {
    "streams": "streams._errors",
    "ledger": "ledger._errors",
    "ledger.graphs": "ledger.graphs._errors",
}
#: Modules of the testing kits: their exceptions are a test's own (a fault injected, a history
#: broken), exported by the kit's public module, not by the package.
TESTING_KITS = (
    *("streams.testing", "streams._testing", "streams._conformance"),
    *("ledger.testing", "ledger._testing"),
)
#: Exceptions used as signals inside one module pair, never raised to a caller (by qualified name).
INTERNAL_SIGNALS = {
    "ledger.graphs._values.NotWritable": "the runner catches it: the value is not written down",
    "ledger.postgres._view.KeptStale": "the connection catches it: the transaction runs again",
    "ledger.postgres._pipelined.PipelineFailed": "the connection catches it: the batch runs again, a "
    "statement at a time",
}

_BRANCH = re.compile(r"^((?:│   |    )*)(?:├── |└── )([\w.]+)(?: \(([\w, ]+)\))?(?:  |$)")
_ROOT = re.compile(r"^([\w.]+)(?: \(([\w, ]+)\))?(?:  |$)")


@dataclass(frozen=True)
class Drawn:
    """One class of a drawn tree: its parent (``None`` for a root) and the other bases it names."""

    name: str
    parent: str | None
    mixins: frozenset[str]


def drawn_tree(doc: str) -> list[Drawn]:
    """The classes the ``::`` block of an errors module's docstring draws, in order.

    A root starts at the block's margin; a child follows ``├── `` or ``└── ``,
    four columns a level. Other lines (a description carried over, a heading
    of a group) draw no class.
    """
    _, _, block = doc.partition("::\n")
    found: list[Drawn] = []
    parents: list[str] = []  # the path from the root to the last class drawn
    for raw in block.splitlines():
        line = raw.removeprefix("    ")
        if branch := _BRANCH.match(line):
            depth = len(branch[1]) // 4 + 1
            if depth > len(parents):
                raise AssertionError(f"{branch[2]} is drawn deeper than any parent: {raw!r}")
            del parents[depth:]
            found.append(Drawn(branch[2], parents[depth - 1], _names(branch[3])))
            parents.append(branch[2])
        elif root := _ROOT.match(line):
            found.append(Drawn(root[1], None, _names(root[2])))
            parents = [root[1]]
    return found


def _names(text: str | None) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",")) if text else frozenset()


def _resolve(name: str, namespace: Mapping[str, object]) -> type | None:
    if "." in name:
        module, _, attr = name.rpartition(".")
        found = getattr(importlib.import_module(module), attr, None)
    else:
        found = namespace.get(name, getattr(builtins, name, None))
    return found if isinstance(found, type) else None


def tree_problems(doc: str, namespace: Mapping[str, object], defined: set[str]) -> list[str]:
    """What the drawing in ``doc`` gets wrong about the classes of ``namespace``.

    ``defined`` names the classes the module defines: each must be drawn,
    once, under a base it has, with its other bases in parentheses; each
    drawn class must exist.
    """
    problems = []
    drawing = drawn_tree(doc)
    names = [d.name for d in drawing]
    problems += [f"{n} is drawn {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    problems += [f"{n} is not drawn" for n in sorted(defined - set(names))]
    for d in drawing:
        cls = _resolve(d.name, namespace)
        if cls is None:
            problems.append(f"{d.name} is drawn but no such class exists")
            continue
        bases = {b.__name__ for b in cls.__bases__}
        if d.parent is None:
            if d.name in defined and bases - {"Exception"}:
                problems.append(f"{d.name} is drawn as a root, but derives from {sorted(bases)}")
            continue
        parent = _resolve(d.parent, namespace)
        if parent not in cls.__bases__:
            problems.append(f"{d.name} is drawn under {d.parent}, but its bases are {sorted(bases)}")
        elif bases - {parent.__name__} != d.mixins:
            problems.append(
                f"{d.name} is drawn with ({', '.join(sorted(d.mixins))}), but its bases are {sorted(bases)}"
            )
    return problems


def defined_classes(module: types.ModuleType) -> set[str]:
    """The exception and warning classes ``module``'s source defines (not those it imports)."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    names = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    return {n for n in names if isinstance(c := getattr(module, n), type) and issubclass(c, Exception)}


@pytest.mark.parametrize("package", sorted(ERRORS_MODULES))
def test_each_errors_modules_tree_draws_every_class_under_its_real_parent(package: str) -> None:
    module = importlib.import_module(ERRORS_MODULES[package])
    assert module.__doc__ is not None
    assert tree_problems(module.__doc__, vars(module), defined_classes(module)) == []


def test_the_tree_check_finds_a_missing_a_misplaced_and_an_invented_class() -> None:
    class RootError(Exception):
        pass

    class LeafError(RootError, ValueError):
        pass

    class DeepError(LeafError):
        pass

    namespace = {"RootError": RootError, "LeafError": LeafError, "DeepError": DeepError}
    right = "::\n\n    RootError\n    └── LeafError (ValueError)  x\n        └── DeepError  y\n"
    assert tree_problems(right, namespace, set(namespace)) == []
    missing = "::\n\n    RootError\n    └── LeafError (ValueError)  x\n"
    assert tree_problems(missing, namespace, set(namespace)) == ["DeepError is not drawn"]
    misplaced = "::\n\n    RootError\n    ├── LeafError (ValueError)  x\n    └── DeepError  y\n"
    assert tree_problems(misplaced, namespace, set(namespace)) == [
        "DeepError is drawn under RootError, but its bases are ['LeafError']"
    ]
    no_mixin = "::\n\n    RootError\n    └── LeafError  x\n        └── DeepError  y\n"
    assert tree_problems(no_mixin, namespace, set(namespace)) == [
        "LeafError is drawn with (), but its bases are ['RootError', 'ValueError']"
    ]
    invented = right + "    └── GoneError  z\n"
    assert tree_problems(invented, namespace, set(namespace)) == [
        "GoneError is drawn but no such class exists"
    ]


def _library_modules() -> Iterator[types.ModuleType]:
    for package in ("streams", "ledger"):
        root = importlib.import_module(package)
        yield root
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith("__main__"):
                yield importlib.import_module(info.name)


def test_every_error_of_the_library_is_defined_in_its_packages_errors_module() -> None:
    stray = []
    for module in _library_modules():
        if module.__name__ in ERRORS_MODULES.values() or module.__name__.startswith(TESTING_KITS):
            continue
        for name in defined_classes(module):
            if not name.startswith("_") and f"{module.__name__}.{name}" not in INTERNAL_SIGNALS:
                stray.append(f"{module.__name__}.{name}")
    assert stray == []


@pytest.mark.parametrize("package", sorted(ERRORS_MODULES))
def test_every_error_is_exported_from_its_package(package: str) -> None:
    public = importlib.import_module(package)
    errors = importlib.import_module(ERRORS_MODULES[package])
    for name in defined_classes(errors):
        assert getattr(public, name, None) is getattr(errors, name), f"{package}.{name} is missing"
        assert name in public.__all__, f"{package}.__all__ lacks {name}"


@pytest.mark.parametrize("kit", ["streams.testing", "ledger.testing"])
def test_the_testing_kits_export_their_exceptions(kit: str) -> None:
    module = importlib.import_module(kit)
    for name in defined_classes(module):
        assert name in module.__all__, f"{kit}.__all__ lacks {name}"


def exported_errors() -> dict[str, type[Exception]]:
    """Every exception and warning class a package exports, by name."""
    found: dict[str, type[Exception]] = {}
    for package in ERRORS_MODULES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, Exception):
                assert found.setdefault(name, obj) is obj, f"two exported classes named {name}"
    return found


_ROW = re.compile(r"^\| `(\w+)` \| (.*?) \| (.+?) \| (.*?) \|$", re.MULTILINE)


def documented_errors() -> dict[str, tuple[str, str]]:
    """The error tables of docs/reference.md: each error's bases and exit code, as written."""
    page = (ROOT / "docs" / "reference.md").read_text()
    return {
        row[1]: (row[2], row[4])
        for row in _ROW.finditer(page)
        if row[1].endswith(("Error", "Failure", "Warning"))
    }


def test_every_exported_error_is_documented_in_the_reference_with_its_bases_and_exit_code() -> None:
    documented = documented_errors()
    exported = exported_errors()
    assert sorted(set(exported) - set(documented)) == [], "exported errors missing from docs/reference.md"
    assert sorted(set(documented) - set(exported)) == [], "docs/reference.md documents errors not exported"
    for name, cls in exported.items():
        bases, exit_code = documented[name]
        assert bases == ", ".join(f"`{b.__name__}`" for b in cls.__bases__), name
        met = issubclass(cls, LedgerError | StreamsError)  # what the command line turns into an exit code
        expected = str(_exit_code(cls.__new__(cls))) if met else "—"
        assert exit_code == expected, (
            f"{name}: docs/reference.md says exit {exit_code}, the command line {expected}"
        )
