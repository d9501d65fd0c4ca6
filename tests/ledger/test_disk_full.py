"""A full disk: the failing batch fails whole, one line names the cause, the same command resumes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..ledger_command import ledger_command
from ._mounts import remount, tmpfs

ROOT = Path(__file__).resolve().parents[2]
N = 100_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A private 160 KiB tmpfs."""
    with tmpfs(tmp_path / "disk", "160k") as disk:
        yield disk


def demo(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ledger",
            "demo",
            str(path),
            "--messages",
            str(N),
            "--progress-interval",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )


def test_a_full_disk_fails_in_one_line_leaves_a_sound_ledger_and_the_demo_resumes_after_space_is_freed(
    small_disk: Path,
) -> None:
    path = small_disk / "ledger"
    full = demo(path)
    assert full.returncode == 1
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in full.stderr
    assert "the disk holding it is full" in errors[0] and "run the same command again" in errors[0]

    checked = ledger_command("check", str(path))
    assert checked.returncode == 0 and checked.stdout.rstrip().endswith("sound"), checked.stdout

    remount(small_disk, "size=64m")  # space freed
    resumed = demo(path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"billing total {N * (N + 1) // 2}" in resumed.stdout
