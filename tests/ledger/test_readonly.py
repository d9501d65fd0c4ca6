"""A ledger on a read-only filesystem: writing is refused with one typed error, reading still works.

We run as root, so permission bits stop nothing; a read-only mount does. Each
test builds a ledger with the demo on a private tmpfs, remounts it read-only
and checks that opening it for writing is :class:`LedgerReadOnlyError` (one
line from the command line, exit 2, no traceback) while ``inspect`` and
``check`` read it, and that nothing on the mount changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import LedgerEnv, LedgerReadOnlyError, inspect_ledger, open_ledger
from ledger.lmdb._demo import run_demo

from ._mounts import remount, tmpfs
from .test_cli import assert_demo_answer, cli

N = 2000


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A private tmpfs, writable until a test remounts it read-only."""
    with tmpfs(tmp_path / "disk", "64m") as mounted:
        yield mounted


def files(root: Path) -> dict[str, bytes]:
    """Every file and directory under ``root`` with its bytes: what must not change."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))
    }


def read_only_ledger(disk: Path, *, lock_file: bool = True) -> Path:
    """A finished demo of N orders on ``disk``, which is then remounted read-only.

    Without ``lock_file`` the ledger has no ``lock.mdb``, as a copy made by
    ``python -m ledger backup`` has none: LMDB cannot create it on the mount.
    """
    path = disk / "ledger"
    built = cli("demo", str(path), "--messages", str(N), "--progress-interval", "60")
    assert built.returncode == 0, built.stderr
    if not lock_file:
        (path / "lock.mdb").unlink()
    remount(disk, "ro")
    return path


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    [line] = stderr.splitlines()
    assert line.startswith("error: "), line
    return line


# -- writing is refused ---------------------------------------------------------------------


def test_opening_a_ledger_on_a_read_only_filesystem_for_writing_is_a_typed_error(disk: Path) -> None:
    path = read_only_ledger(disk)
    before = files(disk)
    for create in (True, False):
        with pytest.raises(
            LedgerReadOnlyError,
            match=rf"^ledger {re.escape(str(path))} is read-only \(its filesystem is mounted",
        ):
            LedgerEnv.open(path, create=create)
    assert files(disk) == before
    # the refused open gave its claim on the path back: the same process may read it
    env = LedgerEnv.open_readonly(path)
    try:
        assert_demo_answer(inspect_ledger(env), N, generation=1)
    finally:
        env.close()


async def test_open_ledger_and_run_demo_on_a_read_only_filesystem_raise_the_typed_error(disk: Path) -> None:
    path = read_only_ledger(disk)
    before = files(disk)
    with pytest.raises(LedgerReadOnlyError, match=f"ledger {re.escape(str(path))} is read-only"):
        async with open_ledger(path):
            pytest.fail("a read-only ledger was opened for writing")
    with pytest.raises(LedgerReadOnlyError, match=f"ledger {re.escape(str(path))} is read-only"):
        await run_demo(path, N)
    assert files(disk) == before


def test_the_demo_on_a_read_only_ledger_exits_6_with_one_line(disk: Path) -> None:
    path = read_only_ledger(disk)
    before = files(disk)
    refused = cli("demo", str(path), "--messages", str(N))
    assert refused.returncode == 6
    line = one_error_line(refused.stderr)
    assert str(path) in line and "is read-only" in line and "mounted read-only" in line
    assert refused.stdout == ""
    assert files(disk) == before


@pytest.mark.parametrize("where", ["missing", "nested", "empty"])
def test_a_ledger_cannot_be_created_on_a_read_only_filesystem(disk: Path, where: str) -> None:
    (disk / "empty").mkdir()
    remount(disk, "ro")
    path = {"missing": disk / "new", "nested": disk / "new" / "deeper", "empty": disk / "empty"}[where]
    refused_at = disk / "empty" if where == "empty" else disk
    before = files(disk)
    with pytest.raises(
        LedgerReadOnlyError,
        match=rf"^ledger {re.escape(str(path))} cannot be created: {re.escape(str(refused_at))} is read-only",
    ):
        LedgerEnv.open(path)
    ran = cli("demo", str(path), "--messages", "10")
    assert ran.returncode == 6
    line = one_error_line(ran.stderr)
    assert f"ledger {path} cannot be created" in line and "mounted read-only" in line
    assert files(disk) == before


# -- reading works ----------------------------------------------------------------------------


@pytest.mark.parametrize("lock_file", [True, False], ids=["with-lock-file", "without-lock-file"])
def test_inspect_and_check_read_a_ledger_on_a_read_only_filesystem(disk: Path, lock_file: bool) -> None:
    path = read_only_ledger(disk, lock_file=lock_file)
    before = files(disk)

    inspected = cli("inspect", str(path), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert_demo_answer(json.loads(inspected.stdout), N, generation=1)
    table = cli("inspect", str(path))
    assert table.returncode == 0 and table.stdout.startswith(f"ledger {path}\n"), table.stderr

    checked = cli("check", str(path))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.rstrip().endswith("sound") and checked.stderr == ""

    env = LedgerEnv.open_readonly(path)
    try:
        assert_demo_answer(inspect_ledger(env), N, generation=1)
    finally:
        env.close()
    assert files(disk) == before
    assert (path / "lock.mdb").exists() == lock_file


def test_a_backup_onto_a_read_only_filesystem_exits_2_with_one_line(disk: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    built = cli("demo", str(source), "--messages", "200", "--progress-interval", "60")
    assert built.returncode == 0, built.stderr
    remount(disk, "ro")
    before = files(disk)
    backup = cli("backup", str(source), str(disk / "copy"))
    assert backup.returncode == 2
    line = one_error_line(backup.stderr)
    assert re.search(r"the copy cannot be written to .*copy: Read-only file system", line), line
    assert files(disk) == before
