"""docs/reference.md lists every public name, each in the section of its module.

A heading whose first backticked span is a public module (``## `streams`: the
engine``, ``### `streams.store`: writing a store``) starts that module's
section; a heading that names no module belongs to the section it is nested in
(``### Keys`` is ``streams``'s), and a top-level heading that names none
(``## Command line``) to no module. A name is listed when a backticked span of
its module's section starts with it, bare or after the module
(```Key(name, T)```, ```streams.testing.FaultyHooks(...)```, ```await
remove_group(...)```): a name mentioned only in another module's section, or
only inside someone else's signature, is not listed.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from .test_exports import PUBLIC

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"

MODULES = PUBLIC

_FENCE = re.compile(r"^```")
_HEADING = re.compile(r"^(#+) (.*)$")
_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")  # a span may wrap, but not across a blank line


def sections(page: str) -> dict[str, str]:
    """The text of each module's section of ``page``, by module (fenced code blocks left out)."""
    found: dict[str, list[str]] = {m: [] for m in MODULES}
    open_headings: list[tuple[int, str | None]] = []  # (level, module) of each heading enclosing the line
    fenced = False
    for line in page.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        if heading := _HEADING.match(line):
            level = len(heading[1])
            while open_headings and open_headings[-1][0] >= level:
                open_headings.pop()
            spans = _SPAN.findall(heading[2])
            named = spans[0] if spans and spans[0] in MODULES else None
            inherited = open_headings[-1][1] if open_headings else None
            open_headings.append((level, named or inherited))
            continue
        module = open_headings[-1][1] if open_headings else None
        if module is not None:
            found[module].append(line)
    return {m: "\n".join(lines) for m, lines in found.items()}


def listed(module: str, text: str) -> set[str]:
    """The names of ``module`` that a backticked span of ``text`` starts with."""
    names = set()
    for span in _SPAN.findall(text):
        span = span.removeprefix("await ").removeprefix("async with ")
        span = span.removeprefix(f"{module}.")
        if name := re.match(r"[A-Za-z_]\w*", span):
            names.add(name[0])
    return names


def unlisted(page: str) -> dict[str, list[str]]:
    """Each module's names of ``__all__`` that its section of ``page`` does not list."""
    text = sections(page)
    missing = {}
    for module in MODULES:
        names = set(importlib.import_module(module).__all__)
        if absent := sorted(names - listed(module, text[module])):
            missing[module] = absent
    return missing


def test_every_public_module_has_a_section() -> None:
    text = sections(REFERENCE.read_text())
    assert [m for m in MODULES if not text[m].strip()] == []


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_is_listed_in_its_modules_section(module: str) -> None:
    assert unlisted(REFERENCE.read_text()).get(module, []) == [], f"{module}: missing from its section"


def test_a_name_removed_from_the_reference_is_found_missing() -> None:
    page = REFERENCE.read_text()
    assert unlisted(page) == {}
    row = "| `tail_floor(desc, frontiers)` |"
    assert page.count(row) == 1
    renamed = page.replace(row, "| `floor(desc, frontiers)` |")
    assert unlisted(renamed) == {"streams.store": ["tail_floor"]}
    # a mention in another module's section does not list it
    assert renamed.count("| `TOOLS` |") == 1  # a row of ledger.postgres
    moved = renamed.replace("| `TOOLS` |", "| `TOOLS`, `tail_floor` |")
    assert unlisted(moved) == {"streams.store": ["tail_floor"]}
    # nor does a mention that does not start its span
    assert unlisted(page.replace(row, "| `floor(tail_floor)` |")) == {"streams.store": ["tail_floor"]}


def test_sections_follow_the_headings() -> None:
    page = (
        "# Reference\n\n## `streams`: the engine\n\n`Key`\n\n### Keys\n\n`Stream`\n\n"
        "### `streams.store`: stores\n\n`append`\n\n```text\n# not a heading `commit`\n```\n\n"
        "### Errors\n\n`StreamsError`\n\n## `ledger`: the ledger\n\n`connect`\n\n"
        "### `ledger.testing`: kills\n\n`kill_until_done`\n\n## Command line\n\n`inspect`\n"
    )
    text = sections(page)
    assert listed("streams", text["streams"]) == {"Key", "Stream", "StreamsError"}
    assert listed("streams.store", text["streams.store"]) == {"append"}
    assert listed("ledger", text["ledger"]) == {"connect"}
    assert listed("ledger.testing", text["ledger.testing"]) == {"kill_until_done"}
