"""docs/architecture.md names only modules and tests that exist, and stays a map: at most 150 lines.

A backticked span of the page names a module by its path or by its dotted
name. A path (```streams/_stream.py```, ```ledger/lmdb/```,
```ledger/console/static/```, ```tests/test_exports.py```) is a file when it
ends in an extension, else a directory, and must be there; one followed by
``:name`` (```streams/_plan.py:check_plan```) must define ``name`` at its
top level. A dotted name (```streams._stream```, ```ledger.postgres._view```) resolves to
the longest run of its parts that is a module or a package of the
repository; a private part after it (``_nope`` in ```streams._nope```) must
be a name that module defines at its top level, so a module that is not
there is found; a public one is an attribute (```ledger.run```,
```streams.store.tail_floor```) and is not looked up here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
MAX_LINES = 150

_SPAN = re.compile(r"`([^`\n]+)`")
#: A path under one of the packages or the tests: ``streams/...``, ``ledger/...``, ``tests/...``, maybe
#: ``:name`` after it.
_PATH = re.compile(r"(?<![\w./])((?:streams|ledger|tests)/(?:\w+/)*(?:\w+(?:\.\w+)?)?)(?::(\w+))?")
#: A dotted name that starts with one of the packages.
_DOTTED = re.compile(r"(?<![\w./])((?:streams|ledger)(?:\.\w+)+)")


def _module_file(parts: list[str]) -> Path | None:
    """The source of the module or package ``parts`` names in the repository, if there is one."""
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(source: Path, name: str) -> bool:
    """Whether ``source`` defines ``name`` at its top level: a def, a class, an assignment or an import."""
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
        ):
            return True
    return False


def _path_problem(path: str, name: str | None) -> str | None:
    where = ROOT / path
    if where.suffix:  # a file
        if not where.is_file():
            return f"{path}: no such file"
        if name is not None and where.suffix == ".py" and not _defines(where, name):
            return f"{path}:{name}: {path} defines no {name}"
        return None
    if not where.is_dir():
        return f"{path}: no such directory"
    return None


def _dotted_problem(dotted: str) -> str | None:
    parts = dotted.split(".")
    known = max(n for n in range(1, len(parts) + 1) if _module_file(parts[:n]) is not None)
    if known == len(parts):
        return None
    rest = parts[known]
    if not rest.startswith("_") or rest.startswith("__"):
        return None  # a public attribute, or a dunder, of a module that exists
    module, source = ".".join(parts[:known]), _module_file(parts[:known])
    assert source is not None
    if _defines(source, rest):
        return None
    return f"{dotted}: no module {module}.{rest}, nor a name {rest} in {module}"


def missing(page: str) -> list[str]:
    """What the backticked spans of ``page`` name that the repository does not hold."""
    problems: list[str] = []
    for span in _SPAN.findall(page):
        for path, name in _PATH.findall(span):
            if problem := _path_problem(path, name or None):
                problems.append(problem)
        for dotted in _DOTTED.findall(span):
            if problem := _dotted_problem(dotted):
                problems.append(problem)
    return problems


def test_every_module_the_page_names_exists() -> None:
    assert missing(PAGE.read_text()) == []


def test_the_page_names_modules_of_every_package() -> None:
    """The page is a map: it names modules, so the check above has something to check."""
    page = PAGE.read_text()
    named = {path for span in _SPAN.findall(page) for path, _ in _PATH.findall(span)}
    packages = (
        "streams/",
        "streams/_store/",
        "ledger/",
        "ledger/lmdb/",
        "ledger/postgres/",
        "ledger/graphs/",
    )
    for package in packages:
        assert any(p.startswith(package) and p.endswith(".py") for p in named), package


def test_the_page_is_at_most_150_lines() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_LINES, f"docs/architecture.md has {lines} lines; keep it a map of {MAX_LINES} at most"


def test_a_module_that_is_not_there_is_found() -> None:
    page = (
        "`streams/_stream.py`, `ledger/lmdb/`, `ledger/console/static/console.js`,"
        " `streams/_plan.py:check_plan`, `streams._stream`, `streams._stream._Group`,"
        " `ledger.postgres._view.PgView`, `ledger.run(graph)`, `streams.store.tail_floor`,"
        " `python -m ledger inspect`, `streams._outcome._shielded_never`\n"
        "`streams/_nope.py`, `ledger/lmdb/_nope.py`, `ledger/nowhere/`, `streams/_stream.py:_nothing_here`,"
        " `streams._nope`, `ledger.postgres._nope`, `ledger/console/static/nope.css`, "
        "a pipeline (`ledger/_committer.py` then `streams/_gone.py`), `tests/streams/test_gone.py`,"
        " `tests/ledger/graphs/test_docs.py`\n"
    )
    assert missing(page) == [
        "streams._outcome._shielded_never: no module streams._outcome._shielded_never, "
        "nor a name _shielded_never in streams._outcome",
        "streams/_nope.py: no such file",
        "ledger/lmdb/_nope.py: no such file",
        "ledger/nowhere/: no such directory",
        "streams/_stream.py:_nothing_here: streams/_stream.py defines no _nothing_here",
        "streams._nope: no module streams._nope, nor a name _nope in streams",
        "ledger.postgres._nope: no module ledger.postgres._nope, nor a name _nope in ledger.postgres",
        "ledger/console/static/nope.css: no such file",
        "streams/_gone.py: no such file",
        "tests/streams/test_gone.py: no such file",
    ]
