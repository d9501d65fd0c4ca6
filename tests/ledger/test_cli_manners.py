"""The command line as operators expect it: a closed pipe ends quietly, a missing extra is one line saying
what to install, and ``group move|remove --dry-run`` says what a change would do and changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import open_ledger
from ledger.postgres import open_postgres
from streams import Key, Stream, open_scope

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = Key("numbers", Stream[int])


def _cli(*args: str, hide: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m ledger ARGS``; ``hide`` makes that module impossible to import, as if not installed."""
    prelude = f"import sys; sys.modules[{hide!r}] = None; " if hide else ""
    code = prelude + "import runpy; runpy.run_module('ledger', run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


async def _numbers(ledger: object, n: int, acked: int) -> None:
    async with open_scope(ledger.streams, scope="s") as scope:  # type: ignore[attr-defined]
        stream = await scope.open_stream(NUMBERS, node="n", groups=("a",), capacity=n)
        writer = stream.writer()
        for i in range(n):
            writer.send_nowait(i)
        await writer.finish()
        reader = stream.reader("a")
        for seq in range(1, acked + 1):
            await reader.receive()
            await reader.ack(seq)


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    async def write() -> None:
        async with open_ledger(tmp_path / "l") as ledger:
            await _numbers(ledger, 20_000, 0)

    anyio.run(write)
    command = [
        sys.executable,
        "-m",
        "ledger",
        "messages",
        str(tmp_path / "l"),
        "s/n/numbers",
        "--limit",
        "20000",
    ]
    reader = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    first = reader.stdout.readline()
    reader.stdout.close()  # as `| head -1` does
    assert reader.wait(timeout=60) == 141  # 128 + SIGPIPE, as other tools end
    line = json.loads(first)
    assert (line["seq"], line["value"]) == (1, 0) and line["appended_at"].endswith("Z")
    assert reader.stderr.read() == b""  # no traceback
    reader.stderr.close()


def test_a_missing_extra_is_one_line_with_the_pip_install_that_fixes_it() -> None:
    done = _cli("inspect", "postgresql:///nowhere", hide="psycopg")
    assert done.returncode == 2
    assert done.stderr == (
        "error: ledger.postgres (the PostgreSQL ledger) needs the postgres extra, which is not installed: "
        "pip install 'streamledger[postgres]'\n"
    )
    graphs = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['pydantic_graph'] = None; import ledger.graphs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        "ledger.MissingExtraError: ledger.graphs (durable pydantic-graph runs) needs the pydantic-graph "
        in (graphs.stderr)
    )
    assert "pip install 'streamledger[pydantic-graph]'" in graphs.stderr


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger of either backend holding s/n/numbers: 10 messages, group ``a`` acknowledged through 6."""
    if request.param == "lmdb":
        where = str(tmp_path / "l")

        async def write() -> None:
            async with open_ledger(where) as ledger:
                await _numbers(ledger, 10, 6)

    else:
        where = request.getfixturevalue("postgres_url")

        async def write() -> None:
            async with open_postgres(where) as ledger:
                await _numbers(ledger, 10, 6)

    anyio.run(write)
    return where


def _frontier(target: str) -> list[object]:
    shown = subprocess.run(
        [sys.executable, "-m", "ledger", "inspect", target, "--groups", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [(row["acked_through"], row["stream"]) for row in json.loads(shown.stdout)]


def test_a_dry_run_says_what_a_group_change_would_do_and_changes_nothing(target: str) -> None:
    before = _frontier(target)
    back = _cli("group", "move", target, "s/n/numbers", "a", "--to", "2", "--keep-state", "--dry-run")
    assert back.returncode == 0, back.stderr
    assert back.stdout == (
        "would move group 'a' of s/n/numbers: next message 7 -> 2 (5 acknowledged messages handled again), "
        "0 exhausted and 0 failing forgotten, state kept\ndry run: nothing was changed\n"
    )
    on = _cli("group", "move", target, "s/n/numbers", "a", "--to", "latest", "--clear-state", "--dry-run")
    assert "next message 7 -> 11 (4 messages skipped unhandled)" in on.stdout and "state cleared" in on.stdout
    gone = _cli("group", "remove", target, "s/n/numbers", "a", "--dry-run")
    assert gone.stdout.startswith("would remove group 'a' of s/n/numbers: acknowledged through 6 of 10")
    past = _cli("group", "move", target, "s/n/numbers", "a", "--to", "12", "--keep-state", "--dry-run")
    assert past.returncode == 2 and "it has 10 messages (nothing was changed)" in past.stderr
    nobody = _cli("group", "remove", target, "s/n/numbers", "b", "--dry-run")
    assert nobody.returncode == 2 and "has no consumer group 'b'" in nobody.stderr
    assert _frontier(target) == before  # nothing moved, on either backend


def _following(target: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ledger", "messages", target, "s/n/live", "--follow", "--interval", "0.05"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("backend", ["lmdb", "postgres"])
async def test_messages_follow_prints_what_is_confirmed_after_until_the_stream_ends(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    opened: AbstractAsyncContextManager[Any]
    if backend == "lmdb":
        target = str(tmp_path / "l")
        opened = open_ledger(target)
    else:
        target = request.getfixturevalue("postgres_url")
        opened = open_postgres(target)
    async with opened as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(Key("live", Stream[int]), node="n", groups=("g",))
        writer = stream.writer()
        await writer.send(1)
        await writer.flush()
        follower = _following(target)
        assert follower.stdout is not None
        first = await anyio.to_thread.run_sync(follower.stdout.readline)  # it prints what was there
        for value in (2, 3):  # then what is confirmed after it started
            await writer.send(value)
        await writer.finish()
        out, err = await anyio.to_thread.run_sync(follower.communicate)
    assert follower.returncode == 0, err
    assert [json.loads(line)["value"] for line in (first + out).splitlines()] == [1, 2, 3]
    assert err == "stream s/n/live finished\n"
