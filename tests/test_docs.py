"""Every Python block in the README and docs/ runs, in order, one namespace per page; twice, in the
same directory, as a reader runs a page again (what the first run left must not break the second)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: docs/graphs.md needs the pydantic-graph extra; tests/ledger/graphs/test_docs.py runs it.
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "graphs.md")]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(
    page: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if page.name == "postgres.md":  # its examples read the ledger's URL from the environment
        monkeypatch.setenv("STREAMLEDGER_URL", request.getfixturevalue("postgres_url"))
    blocks = BLOCK.findall(page.read_text())
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for run in ("first", "second"):
            namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
            for i, block in enumerate(blocks):
                exec(compile(block, f"{page.name}[python block {i + 1}, {run} run]", "exec"), namespace)
    finally:
        os.chdir(cwd)


def test_every_page_with_code_has_python_blocks() -> None:
    for name in ("README.md", "tutorial.md", "testing.md"):
        page = ROOT / name if name == "README.md" else ROOT / "docs" / name
        assert BLOCK.findall(page.read_text()), name
