"""The command line on a terminal: a progress line on stderr for ``check``, ``backup`` and ``messages``,
colour on stdout, and neither in a pipe, with ``--json`` or with ``NO_COLOR``; through subprocesses on a
pseudo-terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import tty
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from ledger import open_ledger
from ledger._colour import Colours, colours_for
from ledger._progress import Progress, progress_on
from ledger.postgres import open_postgres
from streams import Key, Stream, open_scope

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = Key("numbers", Stream[int])
ESCAPE = "\x1b["


def _environment(**changes: str) -> dict[str, str]:
    """This process's environment without its colour preferences, on a capable terminal, with ``changes``."""
    kept = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return {**kept, "TERM": "xterm", **changes}


@dataclass(frozen=True)
class Shown:
    """What a command wrote: its exit code, its files' stdout and stderr, and what the terminal got."""

    code: int
    stdout: str
    stderr: str
    terminal: str


def _run(
    *args: str,
    stdout_tty: bool = False,
    stderr_tty: bool = False,
    tmp: Path,
    env: dict[str, str] | None = None,
) -> Shown:
    """``python -m ledger ARGS`` with stdout and stderr each on a pseudo-terminal (raw: bytes as written)
    or in a file of ``tmp`` (a regular file, not a pipe)."""
    controller, terminal = pty.openpty()
    tty.setraw(terminal)
    with open(tmp / "out", "w+b") as out_file, open(tmp / "err", "w+b") as err_file:
        run = subprocess.Popen(
            [sys.executable, "-m", "ledger", *args],
            stdin=subprocess.DEVNULL,
            stdout=terminal if stdout_tty else out_file,
            stderr=terminal if stderr_tty else err_file,
            cwd=ROOT,
            env=_environment(**(env or {})),
        )
        os.close(terminal)
        seen = b""
        while True:
            ready, _, _ = select.select([controller], [], [], 60)
            assert ready, "the command wrote nothing for a minute"
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            seen += chunk
        os.close(controller)
        code = run.wait(timeout=60)
        out_file.seek(0)
        err_file.seek(0)
        return Shown(code, out_file.read().decode(), err_file.read().decode(), seen.decode())


def _piped(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_environment(**env),
        timeout=60,
        check=False,
    )


async def _numbers(ledger: object, n: int) -> None:
    async with open_scope(ledger.streams, scope="s") as scope:  # type: ignore[attr-defined]
        stream = await scope.open_stream(NUMBERS, node="n", groups=("a",), capacity=n)
        writer = stream.writer()
        for i in range(n):
            writer.send_nowait(i)
        await writer.finish()


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger of either backend holding s/n/numbers: 300 messages, of which group ``a`` handled none."""
    if request.param == "lmdb":
        where = str(tmp_path / "l")

        async def write() -> None:
            async with open_ledger(where) as ledger:
                await _numbers(ledger, 300)

    else:
        where = request.getfixturevalue("postgres_url")

        async def write() -> None:
            async with open_postgres(where) as ledger:
                await _numbers(ledger, 300)

    anyio.run(write)
    return where


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A directory for a command's output files."""
    made = tmp_path / "shown"
    made.mkdir()
    return made


def _lines_drawn(text: str) -> list[str]:
    """The progress lines drawn on a terminal: each from a carriage return to the erasing of the rest."""
    return re.findall(r"\r([^\r\n\x1b]+)\x1b\[K", text)


# -- progress -------------------------------------------------------------------------------------


def test_check_draws_its_progress_on_a_terminal_and_erases_it(target: str, scratch: Path) -> None:
    shown = _run("check", target, stderr_tty=True, tmp=scratch)
    assert shown.code == 0, shown.terminal
    drawn = _lines_drawn(shown.terminal)
    assert drawn and all(line.startswith("checking") and "records" in line for line in drawn)
    assert re.search(r"checking \[[#-]{24}\] +\d+%  [\d,]+/[\d,]+ records", shown.terminal)
    assert shown.terminal.endswith("\r\x1b[K")  # erased before the command ended
    assert shown.stdout.endswith("records checked, sound\n") and ESCAPE not in shown.stdout


def test_backup_draws_the_copy_then_its_check(target: str, scratch: Path, tmp_path: Path) -> None:
    shown = _run("backup", target, str(tmp_path / "copy"), stderr_tty=True, tmp=scratch)
    assert shown.code == 0, shown.terminal
    phases = list(dict.fromkeys(line.split()[0] for line in _lines_drawn(shown.terminal)))
    # LMDB copies, then checks the copy; PostgreSQL checks its snapshot, then pg_dump writes it (no total)
    assert phases == (["checking", "dumping:"] if "://" in target else ["copying", "checking"])
    assert shown.terminal.endswith("\r\x1b[K")
    assert " copied to " in shown.stdout and ESCAPE not in shown.stdout


def test_messages_draws_the_read_then_the_writing_into_a_file(target: str, scratch: Path) -> None:
    shown = _run("messages", target, "s/n/numbers", stderr_tty=True, tmp=scratch)
    assert shown.code == 0, shown.terminal
    phases = [line.split()[0] for line in _lines_drawn(shown.terminal)]
    assert phases[0] == "reading" and "writing" in phases  # stdout is a file: its writing is drawn too
    assert "reading s/n/numbers" in shown.terminal and "/300 messages" in shown.terminal
    assert [json.loads(line)["seq"] for line in shown.stdout.splitlines()] == list(range(1, 301))


def test_messages_on_one_terminal_erase_the_progress_before_the_first_message(
    target: str, scratch: Path
) -> None:
    shown = _run(
        "messages", target, "s/n/numbers", "--limit", "3", stdout_tty=True, stderr_tty=True, tmp=scratch
    )
    assert shown.code == 0, shown.terminal
    before, first, after = shown.terminal.partition('{"seq": 1,')
    assert first and "reading s/n/numbers" in before and before.endswith("\r\x1b[K")
    assert "\r" not in after and "writing" not in after  # the terminal shows the messages as they come
    assert [json.loads(line)["seq"] for line in (first + after).splitlines()] == [1, 2, 3]


def test_no_progress_in_a_pipe_or_with_json(target: str, scratch: Path, tmp_path: Path) -> None:
    for command in (
        ("check", target),
        ("check", target, "--json"),
        ("messages", target, "s/n/numbers"),
        ("backup", target, str(tmp_path / "copy")),
    ):
        piped = _piped(*command)
        assert piped.returncode == 0, piped.stderr
        assert piped.stderr == ""  # a pipe's stderr gets nothing but the command's own lines
    shown = _run("check", target, "--json", stderr_tty=True, tmp=scratch)
    assert shown.code == 0 and shown.terminal == ""  # --json is for programs: no line on the terminal
    assert json.loads(shown.stdout)["sound"] is True


def test_progress_is_drawn_a_few_times_a_second_and_erased_at_the_end() -> None:
    moments = iter([0.0, 0.01, 0.02, 0.5, 2.0, 2.01])
    screen = _Terminal()
    progress = Progress(screen, now=lambda: next(moments))  # a clock the test moves
    progress.phase("checking", 100)  # 0.0: drawn at once
    progress.advance(10)  # 0.01: too soon to draw
    progress.advance(10)  # 0.02: too soon
    progress.advance(30)  # 0.5: drawn, its rate not yet steady
    progress.reached(80)  # 2.0: drawn, with rate and ETA
    progress.clear()
    assert _lines_drawn(screen.getvalue()) == [
        "checking [------------------------]   0%  0/100 records  ETA --:--",
        "checking [############------------]  50%  50/100 records  ETA --:--",
        "checking [###################-----]  80%  80/100 records  40/s  ETA 0:01",
    ]
    assert screen.getvalue().endswith("\r\x1b[K")
    quiet = io.StringIO()
    with progress_on(quiet) as silent:  # no terminal: nothing drawn, whatever is reported
        silent.phase("checking", 100)
        silent.advance(100)
    assert not silent.live and quiet.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- colour ---------------------------------------------------------------------------------------


def _ageless(table: str) -> str:
    """The groups view without the ages of its AGE column, which the clock moves between two reads."""
    return re.sub(r"(?<=  )\d+(?:s|m\d\ds|h\d\dm)(?=  )", "AGE", table)


def test_status_words_and_headers_are_coloured_on_a_terminal(target: str, scratch: Path) -> None:
    groups = _run("inspect", target, "--groups", stdout_tty=True, tmp=scratch)
    assert groups.code == 0, groups.stderr
    header, row = groups.terminal.splitlines()[:2]
    assert header.startswith("\x1b[1mGROUP") and header.endswith("\x1b[0m")
    assert "\x1b[33m300\x1b[0m" in row  # a group 300 behind: lagging, in yellow
    plain = re.sub(r"\x1b\[\d+m", "", groups.terminal)
    piped = _piped("inspect", target, "--groups").stdout
    assert _ageless(plain) == _ageless(piped)  # the columns line up as in a pipe (read a moment apart)
    checked = _run("check", target, stdout_tty=True, tmp=scratch)
    assert checked.terminal.endswith("records checked, \x1b[32msound\x1b[0m\n")


@pytest.mark.parametrize(
    ("env", "args"),
    [
        ({"NO_COLOR": "1"}, ()),
        ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, ()),
        ({}, ("--json",)),
        ({"TERM": "dumb"}, ()),
    ],
)
def test_no_colour_with_no_color_json_or_a_dumb_terminal(
    target: str, scratch: Path, env: dict[str, str], args: tuple[str, ...]
) -> None:
    shown = _run("inspect", target, "--groups", *args, stdout_tty=True, tmp=scratch, env=env)
    assert shown.code == 0, shown.stderr
    assert "GROUP" in shown.terminal or "acked_through" in shown.terminal
    assert ESCAPE not in shown.terminal


def test_no_colour_in_a_pipe_unless_forced(target: str) -> None:
    assert ESCAPE not in _piped("inspect", target, "--groups").stdout
    assert ESCAPE not in _piped("check", target).stdout
    forced = _piped("inspect", target, "--groups", FORCE_COLOR="1")
    assert forced.stdout.startswith("\x1b[1mGROUP")


def test_the_colour_decision_follows_no_color_then_force_color_then_the_terminal() -> None:
    screen, pipe = _Terminal(), io.StringIO()
    assert colours_for(screen, environ={}).enabled
    assert not colours_for(pipe, environ={}).enabled
    assert not colours_for(screen, environ={"NO_COLOR": "x"}).enabled  # any value but empty (no-color.org)
    assert colours_for(screen, environ={"NO_COLOR": ""}).enabled
    assert not colours_for(screen, environ={"NO_COLOR": "1", "FORCE_COLOR": "1"}).enabled
    assert colours_for(pipe, environ={"FORCE_COLOR": "1"}).enabled
    assert not colours_for(screen, environ={"TERM": "dumb"}).enabled
    assert not colours_for(screen, json=True, environ={"FORCE_COLOR": "1"}).enabled
    on = Colours(enabled=True)
    assert on.status("failed") == "\x1b[31mfailed\x1b[0m"
    assert on.status("3", "exhausted") == "\x1b[31m3\x1b[0m"
    assert on.status("open") == "open"  # no status word: as it is
