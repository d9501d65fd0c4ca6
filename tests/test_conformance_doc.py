"""Every test docs/conformance.md names exists, so the page cannot point at a test that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_the_conformance_page_names_exists() -> None:
    page = (ROOT / "docs" / "conformance.md").read_text()
    missing: list[str] = []
    named = 0
    for line in page.splitlines():
        path: str | None = None
        for ref in re.findall(r"`([^`]*::[^`]*)`", line):
            where, _, name = ref.partition("::")
            if where:
                path = where if where.startswith(("tests/", "streams/")) else f"tests/ledger/graphs/{where}"
            if path is None:
                continue
            test = re.sub(r"\[.*$", "", name).strip()
            source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
            named += 1
            if not re.search(rf"\bdef {re.escape(test)}\(", source):
                missing.append(f"{path}::{test}")
    assert named > 40
    assert missing == []
