"""Every command of docs/reference.md's command line, given bad input on an LMDB path and a PostgreSQL
URL: one line on stderr (after argparse's usage, for a usage error), exit 2, never a traceback.

The commands are read from the reference's synopsis, so a command added there is walked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from ledger import connect
from streams import Key, Stream, open_scope

from .test_cli import ROOT, cli

REFERENCE = ROOT / "docs" / "reference.md"
STREAM = "s/n/numbers"

#: Each command's arguments after its target (``{}``), with nothing wrong but the target.
ARGUMENTS = {
    "demo": ("-n", "10"),
    "inspect": (),
    "messages": (STREAM,),
    "keys": (STREAM, "g"),
    "state": (STREAM, "g"),
    "group remove": (STREAM, "g", "--dry-run"),
    "group move": (STREAM, "g", "--to", "1", "--keep-state", "--dry-run"),
    "runs list": (),
    "runs show": ("r",),
    "runs follow": ("r",),
    "runs cancel": ("r", "--reason", "x"),
    "runs retry": ("r", "--reason", "x"),
    "runs delete": ("r",),
    "worker": ("--graphs", "ledger.postgres._demo:GRAPHS", "--until-idle"),
    "migrate": (),
    "metrics": ("--once",),
    "console": ("--port", "0"),
    "check": (),
    "backup": ("{dest}",),
}

#: Commands and the bad value each takes, where its number is not a number.
BAD_NUMBERS = {
    "demo": ("-n", "ten"),
    "messages": (STREAM, "--limit", "0"),
    "keys": (STREAM, "g", "--limit", "-1"),
    "inspect": ("--watch", "soon"),
    "runs list": ("--limit", "many"),
    "metrics": ("--port", "99999"),
    "console": ("--interval", "0"),
}

#: Commands that read a stream, given one the ledger does not hold.
UNKNOWN_STREAM = {
    "messages": ("s/n/nothing",),
    "keys": ("s/n/nothing", "g"),
    "state": ("s/n/nothing", "g", "k"),
    "group remove": ("s/n/nothing", "g"),
    "group move": ("s/n/nothing", "g", "--to", "latest", "--keep-state"),
}


def _documented() -> set[str]:
    """The commands the reference's synopsis lists: ``python -m ledger COMMAND [ACTION] ...``."""
    found = set()
    for match in re.finditer(
        r"^python -m ledger (\w+)(?: (remove|move|list|show|follow|cancel|retry|delete))?",
        REFERENCE.read_text(),
        re.M,
    ):
        found.add(" ".join(part for part in match.groups() if part))
    return found


def _one_line(args: list[str]) -> str:
    done = cli(*args)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == "", (args, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage: "), (args, lines)
    assert "error: " in lines[-1], (args, lines)
    return lines[-1]


def test_every_documented_command_is_walked() -> None:
    assert _documented() - {"version"} <= set(ARGUMENTS), _documented() - set(ARGUMENTS)


@pytest.mark.parametrize("command", sorted(ARGUMENTS))
def test_a_url_of_another_scheme_is_one_line_on_every_command(command: str, tmp_path: Path) -> None:
    rest = [a.format(dest=tmp_path / "copy") for a in ARGUMENTS[command]]
    line = _one_line([*command.split(), "http://example.com/x", *rest])
    assert "http:// is not a ledger's scheme" in line or "takes a postgresql:// URL" in line, line
    assert not (ROOT / "http:").exists() and list(tmp_path.iterdir()) == []


async def _fill(target: str) -> None:
    async with connect(target) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(Key("numbers", Stream[int]), node="n", groups=("g",))
        await stream.writer().send(1)
        await stream.writer().finish()


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    found = str(tmp_path / "l") if request.param == "lmdb" else str(request.getfixturevalue("postgres_url"))
    anyio.run(_fill, found)
    return found


def test_bad_numbers_and_unknown_streams_are_one_line_on_either_backend(target: str) -> None:
    before = cli("inspect", target, "--json").stdout
    for command, rest in {**BAD_NUMBERS, **UNKNOWN_STREAM}.items():
        _one_line([*command.split(), target, *rest])
    assert cli("inspect", target, "--json").stdout == before  # nothing changed


def test_a_missing_ledger_is_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing" / "here")
    for command in ("inspect", "messages", "keys", "state", "check", "runs list", "metrics"):
        rest = [a for a in ARGUMENTS[command] if a != "--once"] if command != "metrics" else ["--once"]
        _one_line([*command.split(), missing, *rest])
    assert not (tmp_path / "nothing").exists()
