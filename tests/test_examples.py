"""The stream examples run as a user would run them, and resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_order_pipeline_runs_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "examples" / "order_pipeline.py"), str(tmp_path / "l"), "2000"]
    first = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    assert first.stdout.strip() == "billed 2000 orders for 2001000; audited 2000 invoices"
    second = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    assert second.stdout == first.stdout
