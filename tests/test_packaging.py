"""What users install: the wheel holds the library only, the sdist runs its own tests, types are found.

The builds run the project's build backend (setuptools, a dev dependency)
on a copy of the tree, so nothing is written into the project and no
network is needed.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import ledger
import streams

ROOT = Path(__file__).resolve().parents[1]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".mypy_cache", ".ruff_cache"
)

pytestmark = pytest.mark.slow


def _build(kind: str, tmp_path: Path) -> Path:
    """Build the ``wheel`` or the ``sdist`` from a copy of the tree; the path of the artifact."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=_NOT_SOURCE)
    out = tmp_path / "out"
    script = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tree, capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_streams_and_ledger_only_with_their_licence_and_version(tmp_path: Path) -> None:
    wheel = _build("wheel", tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"streamledger-{streams.__version__}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        licence = archive.read(f"{info}/licenses/LICENSE").decode()
    assert {name.split("/")[0] for name in names} == {"streams", "ledger", info}
    assert {"streams/py.typed", "ledger/py.typed"} <= set(names)
    static = {f"ledger/console/static/{name}" for name in ("index.html", "console.js", "console.css")}
    assert static <= set(names)  # the console's pages ship in the wheel: nothing fetched at run time
    assert metadata["Version"] == streams.__version__ == ledger.__version__
    assert metadata["License-Expression"] == "MIT" and licence.startswith("MIT License")
    assert "Typing :: Typed" in metadata.get_all("Classifier", [])


def test_the_sdist_carries_its_tests_and_runs_them(tmp_path: Path) -> None:
    sdist = _build("sdist", tmp_path)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (tree,) = (tmp_path / "unpacked").iterdir()
    for needed in (
        "LICENSE",
        "CHANGELOG.md",
        "tests/conftest.py",
        "docs/nodes.md",
        "examples",
        "bench/__main__.py",
    ):
        assert (tree / needed).exists(), needed
    assert not list(tree.rglob("__pycache__")) and not list(tree.rglob("*.pyc"))
    where = subprocess.run(
        [sys.executable, "-c", "import streams; print(streams.__file__)"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(tree)  # the sdist's own code, not the checkout's
    tests = ["tests/test_exports.py", "tests/test_docs.py", "tests/streams/test_pipeline.py"]
    # in one process (-n 0): the suite around this test keeps the cores busy, and four more workers
    # each importing the packages cost twice the CPU time of running these tests in one
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", *tests],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout


def test_mypy_in_another_project_finds_the_installed_packages_and_their_types(tmp_path: Path) -> None:
    user = tmp_path / "project"
    user.mkdir()
    (user / "use.py").write_text(
        "from ledger import open_ledger\n"
        "from streams import Key\n\n"
        'URL = Key("url", str)\n'
        "opener = open_ledger\n"
        "size: int = URL.name\n"  # a str: the one error a typed library makes mypy see
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "use.py"],
        cwd=user,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.stdout.splitlines()[0].startswith("use.py:6: error: Incompatible types in assignment"), (
        done.stdout
    )
    assert "Found 1 error in 1 file" in done.stdout
