"""docs/operating.md: every command it shows runs, in order, and succeeds."""

from __future__ import annotations

import shlex
from pathlib import Path

from .ledger_command import ledger_command

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "operating.md"


def commands() -> list[list[str]]:
    """The page's ``$ python -m ledger ...`` lines, in order."""
    return [
        shlex.split(line.removeprefix("$ "))
        for line in PAGE.read_text().splitlines()
        if line.startswith("$ python -m ledger ")
    ]


def test_the_operating_page_shows_watching_viewing_runs_a_dry_run_and_both_repairs() -> None:
    shown = [c[3] for c in commands()]
    assert shown == [
        "demo",
        "inspect",
        "inspect",
        "messages",
        "runs",
        "runs",
        "group",
        "group",
        "group",
        "check",
        "backup",
    ]


def test_every_command_of_the_operating_page_succeeds_in_order(tmp_path: Path) -> None:
    for command in commands():
        done = ledger_command(*command[3:], cwd=tmp_path)
        assert done.returncode == 0, (command, done.stderr)
        assert "Traceback" not in done.stderr
    groups = ledger_command("inspect", "shop-ledger", "--groups", "--json", cwd=tmp_path, check=True)
    assert '"audit"' not in groups.stdout  # the page removed it


def test_the_operating_page_lists_every_status_runs_list_filters_by() -> None:
    from ledger._runs_cli import STATUSES

    text = " ".join(PAGE.read_text().split())
    assert f"`--status {'|'.join(STATUSES)}`" in text
