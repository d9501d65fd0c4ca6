"""A ledger killed at any instant of its creation opens; what is not a ledger is still refused."""

from __future__ import annotations

import mmap
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import lmdb
import pytest

from ledger import DamagedLedgerError, LedgerEnv, NotALedgerError, UnfinishedLedgerError, open_ledger
from ledger._cli import main
from ledger.lmdb._files import holds_no_commit
from streams import Key, Stream, open_scope

from ._kills import ROOT, assert_sound
from .test_env import snapshot

NUMBERS = Key("numbers", Stream[int])
META_PAGES = 2 * mmap.PAGESIZE  # LMDB's page is the machine's

#: Each instant a creation is killed at: the step of LedgerEnv.open, the system call inside it
#: at which the kernel kills the process (None: SIGKILL at the step itself), and what it leaves.
INSTANTS = [
    ("directory", None, "nothing"),
    ("lock", None, "an empty directory"),
    ("lmdb_files", None, "an empty directory"),
    ("lmdb_files", "ftruncate", "an empty lock file"),
    ("lmdb_files", "pread64", "an empty data file"),
    ("lmdb_files", "pwrite64", "an empty data file"),
    ("schema", None, "meta pages and no commit"),
    ("schema", "writev", "meta pages and no commit"),
    ("schema", "fdatasync", "a commit's pages without its meta page"),
    ("schema", "pwrite64", "a commit's pages without its meta page"),
    ("created", None, "a ledger"),
]


def what_is_left(path: Path) -> str:
    if not path.exists():
        return "nothing"
    names = sorted(os.listdir(path))
    if not names:
        return "an empty directory"
    if names == ["lock.mdb"]:
        return "an empty lock file" if (path / "lock.mdb").stat().st_size == 0 else "a lock file"
    size = (path / "data.mdb").stat().st_size
    if size == 0:
        return "an empty data file"
    if not holds_no_commit(path):
        return "a ledger"
    return "meta pages and no commit" if size == META_PAGES else "a commit's pages without its meta page"


async def command(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``python -m ledger ARGS`` in this process (off the event loop): its exit code and lines."""
    code = await anyio.to_thread.run_sync(main, list(args))
    out, err = capsys.readouterr()
    return code, (out + err).splitlines()


async def write_and_read_back(path: Path) -> list[int]:
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        for n in (1, 2, 3):
            stream.writer().send_nowait(n)  # no checkpoint: the three leave in one append
        await stream.writer().finish()
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        return [message.value async for message in stream.reader("g")]


@pytest.mark.parametrize(("step", "syscall", "left"), INSTANTS)
async def test_a_ledger_killed_at_any_instant_of_its_creation_opens_and_reads_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str, syscall: str | None, left: str
) -> None:
    path = tmp_path / "ledger"
    child = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "tests.ledger.creation_child",
            str(path),
            step,
            *([syscall] if syscall else []),
        ],
        cwd=ROOT,
        check=False,
    )
    assert child.returncode in (-signal.SIGKILL, -signal.SIGSYS), child.stderr.decode()[-500:]
    assert what_is_left(path) == left

    # before it is opened again, inspect and check answer in one typed line and change nothing
    before = snapshot(path / "data.mdb")
    for name in ("inspect", "check"):
        code, lines = await command(name, str(path), capsys=capsys)
        if left in ("nothing", "an empty directory"):
            assert (code, lines) == (
                2,
                [f"error: {path} holds no ledger (and this command does not create one)"],
            )
        elif left == "a ledger":
            assert code == 0 and lines[0].startswith(f"ledger {path}"), lines
        else:
            assert code == 2, lines
            assert lines == [
                f"error: {path} holds a ledger whose creation did not finish: the process creating it "
                "stopped before its first commit, so it holds no records. Open it for writing "
                "(open_ledger) to finish it"
            ]
    assert snapshot(path / "data.mdb") == before

    # opened for writing, it is a ledger: a stream written reads back, and check finds it sound
    assert await write_and_read_back(path) == [1, 2, 3]
    assert await command("check", str(path), capsys=capsys) == (
        0,
        [f"ledger {path}: 11 records checked, sound"],  # the schema, 5 manifests and the stream
    )
    code, lines = await command("inspect", str(path), capsys=capsys)
    assert code == 0 and "stream s/src/numbers  generation 2  appended 3  finished" in lines, lines


def fresh_lmdb_files(path: Path) -> None:
    lmdb.open(str(path), max_dbs=4).close()  # LMDB's lock file and two meta pages, nothing committed


def files(**contents: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        for name, content in contents.items():
            (path / name.replace("_", ".")).write_bytes(content)

    return make


@pytest.mark.parametrize(
    "left",
    [
        files(data_mdb=b""),
        files(data_mdb=b"", lock_mdb=b""),
        files(lock_mdb=b""),
        files(lock_mdb=b"", owner_lock=b""),
        fresh_lmdb_files,
    ],
    ids=["empty-data-file", "empty-data-and-lock-files", "lock-file-only", "older-owner-lock", "no-commit"],
)
async def test_what_a_killed_creation_leaves_reads_as_unfinished_and_opens_as_a_new_ledger(
    tmp_path: Path, left: Callable[[Path], None]
) -> None:
    path = tmp_path / "ledger"
    path.mkdir()
    left(path)
    before = snapshot(path)
    with pytest.raises(UnfinishedLedgerError, match="creation did not finish"):
        LedgerEnv.open_readonly(path)
    with pytest.raises(UnfinishedLedgerError, match="creation did not finish"):
        LedgerEnv.open(path, create=False)
    assert snapshot(path) == before  # refusing it wrote nothing
    assert await write_and_read_back(path) == [1, 2, 3]
    assert_sound(path)


@pytest.mark.parametrize(
    "content",
    [bytes(range(256)) * 64, bytes(META_PAGES), b"hello"],
    ids=["garbage", "zeros", "short"],
)
def test_a_data_file_with_content_that_is_not_lmdb_is_refused_and_left_unchanged(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "ledger"
    path.mkdir()
    (path / "data.mdb").write_bytes(content)
    (path / "lock.mdb").write_bytes(b"")  # the files a creation makes, and nothing else
    before = snapshot(path)
    for opening in (LedgerEnv.open, LedgerEnv.open_readonly):
        with pytest.raises(NotALedgerError, match="is not an LMDB file") as caught:
            opening(path)
        assert not isinstance(caught.value, UnfinishedLedgerError)
    assert snapshot(path) == before


@pytest.mark.parametrize("records", [True, False], ids=["with-records", "just-created"])
async def test_a_ledger_cut_to_its_first_meta_page_is_damaged_never_new(
    tmp_path: Path, records: bool
) -> None:
    path = tmp_path / "ledger"
    if records:
        assert await write_and_read_back(path) == [1, 2, 3]
    else:
        LedgerEnv.open(path).close()  # one commit: meta page 0 is still LMDB's first, of transaction 0
    os.truncate(path / "data.mdb", mmap.PAGESIZE)
    before = snapshot(path)
    for opening in (LedgerEnv.open, LedgerEnv.open_readonly):
        with pytest.raises(DamagedLedgerError, match="inside its second meta page: it was cut short"):
            opening(path)
    assert snapshot(path) == before


async def test_a_ledger_whose_lock_file_was_emptied_keeps_its_records(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    assert await write_and_read_back(path) == [1, 2, 3]
    os.truncate(path / "lock.mdb", 0)  # LMDB's lock file holds no data: LMDB sets it up again
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(NUMBERS, node="src", groups=("g",))
        assert stream.snapshot().appended == 3
    assert_sound(path)
