"""Span, event, metric and attribute names are spelled once, in streams._tracing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_but_the_vocabulary_spells_a_telemetry_name() -> None:
    spelled = re.compile(
        r"""["'](streamledger\.[a-z_.]+|messaging\.[a-z_.]+|error\.type"""
        r"""|invoke_graph |execute_step |execute_node )"""
    )
    found = [
        f"{path.relative_to(ROOT)}: {match.group(1)}"
        for package in ("streams", "ledger")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "streams" / "_tracing.py"
        for match in spelled.finditer(path.read_text())
    ]
    assert found == []
