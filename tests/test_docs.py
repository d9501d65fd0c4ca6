"""Every Python block in the README and docs/ runs, in order, one namespace per page; twice, in the
same directory, as a reader runs a page again (what the first run left must not break the second).

A page that sets the process's OpenTelemetry providers, as a program does once at its start, runs in
a process of its own each time: a provider, once set, stays for the process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: docs/graphs.md needs the pydantic-graph extra; tests/ledger/graphs/test_docs.py runs it.
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "graphs.md")]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: Pages that set the global OpenTelemetry providers.
OWN_PROCESS = {"observability.md"}
#: Runs the blocks of the page named by argv[1], in one namespace, as the test does in its process.
RUNNER = """
import re, sys
from pathlib import Path
page = Path(sys.argv[1])
namespace = {"__name__": f"docs_{page.stem}"}
for i, block in enumerate(re.findall(sys.argv[2], page.read_text(), re.MULTILINE | re.DOTALL)):
    exec(compile(block, f"{page.name}[python block {i + 1}, {sys.argv[3]} run]", "exec"), namespace)
"""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(
    page: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if page.name == "postgres.md":  # its examples read the ledger's URL from the environment
        monkeypatch.setenv("STREAMLEDGER_URL", request.getfixturevalue("postgres_url"))
    if page.name in OWN_PROCESS:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        environment["METRICS_PORT"] = "0"  # any free port: the page's program serves its metrics there
        for run in ("first", "second"):
            done = subprocess.run(
                [sys.executable, "-c", RUNNER, str(page), BLOCK.pattern, run],
                cwd=tmp_path,
                env=environment,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
        return
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
