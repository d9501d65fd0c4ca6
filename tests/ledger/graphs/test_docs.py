"""The code in docs/graphs.md and examples/graph_resume.py runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ledger._cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_the_code_blocks_of_docs_graphs_md_run_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = (ROOT / "docs" / "graphs.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    for run in ("first", "second"):  # run again in the same directory, as a reader does
        module = types.ModuleType("docs_graphs")  # a real module: dataclasses and type hints look names up
        monkeypatch.setitem(sys.modules, module.__name__, module)
        for number, block in enumerate(blocks, 1):
            exec(compile(block, f"docs/graphs.md block {number}, {run} run", "exec"), module.__dict__)
    assert (tmp_path / "trip.ledger").is_dir()

    # the inspect listing the page shows is what the command prints for the ledger the blocks left
    (shown,) = re.findall(r"```\n\$ python -m ledger inspect trip.ledger\n(.*?)```", page, flags=re.DOTALL)
    capsys.readouterr()
    assert main(["inspect", "trip.ledger"]) == 0
    assert capsys.readouterr().out == shown


def test_the_graph_resume_example_runs_the_failed_step_again_and_nothing_else(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "graph_resume.py"), str(tmp_path / "ledger")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.splitlines() == [
        "price ran",
        "tax ran",
        "pay ran",
        "attempt 1 failed; retrying",
        "pay ran",
        "attempt 2: paid 360 (order-42); state ['priced', 'taxed']",
    ]
