"""Private tmpfs mounts for the tests of a full disk and a read-only filesystem.

Mounting needs root (as the project's machines and CI have); where it is not
permitted the test that asked for a mount is skipped.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["remount", "tmpfs"]


@contextmanager
def tmpfs(target: Path, size: str) -> Iterator[Path]:
    """Mount a private tmpfs of ``size`` (``160k``, ``64m``) on the new directory ``target``, then unmount."""
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def remount(target: Path, options: str) -> None:
    """Change the options of the tmpfs on ``target``: ``size=64m`` frees space, ``ro`` makes it read-only."""
    subprocess.run(
        ["mount", "-o", f"remount,{options}", str(target)], capture_output=True, text=True, check=True
    )
