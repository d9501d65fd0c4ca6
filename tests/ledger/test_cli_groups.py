"""``python -m ledger group``: removing and moving consumer groups, as subprocesses, killed half way too."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ledger import open_ledger
from streams import Key, MessageTx, Stream, handle_messages, open_scope

from ._kills import assert_sound
from .test_cli import HOLDER, cli, snapshot

ROOT = Path(__file__).resolve().parents[2]
STREAM = "shop/intake/orders"
ORDERS = Key("orders", Stream[int])


def shop(path: Path) -> Path:
    """5 orders: group 'billing' handled 3 (its state the sum, 6), group 'audit' none."""

    async def add(tx: MessageTx[int], value: int) -> None:
        tx.set_state(tx.state + value)

    async def fill() -> None:
        async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="shop") as scope:
            stream = await scope.open_stream(
                ORDERS, node="intake", groups=("billing", "audit"), resumable=True
            )
            for i in range(1, 6):
                await stream.writer().send(i)
            await handle_messages(stream.reader("billing"), add, initial_state=0, limit=3)

    anyio.run(fill)
    return path


def groups(path: Path) -> dict[str, tuple[int, int]]:
    """Each group's (acked through, lag), as ``inspect --groups --json`` shows them."""
    shown = cli("inspect", str(path), "--groups", "--json")
    assert shown.returncode == 0, shown.stderr
    return {r["group"]: (r["acked_through"], r["lag"]) for r in json.loads(shown.stdout)}


def test_an_operator_removes_and_moves_groups_with_the_cli(tmp_path: Path) -> None:
    path = shop(tmp_path / "ledger")
    assert groups(path) == {"audit": (0, 5), "billing": (3, 2)}
    removed = cli("group", "remove", str(path), STREAM, "audit")
    assert (removed.returncode, removed.stdout, removed.stderr) == (
        0,
        f"removed group 'audit' of {STREAM}\n",
        "",
    )
    assert groups(path) == {"billing": (3, 2)}
    moved = cli("group", "move", str(path), STREAM, "billing", "--to", "2", "--keep-state")
    assert moved.stdout == f"moved group 'billing' of {STREAM}: next message 2, state kept\n", moved.stderr
    assert groups(path) == {"billing": (1, 4)}
    latest = cli("group", "move", str(path), STREAM, "billing", "--to", "latest", "--clear-state")
    assert latest.stdout == f"moved group 'billing' of {STREAM}: next message 6, state cleared\n"
    assert groups(path) == {"billing": (5, 0)}
    table = cli("inspect", str(path), "--groups").stdout.splitlines()
    assert table[0].split()[-5:] == ["DEAD", "STOPPED", "LAST-ACTIVITY", "PARTITION", "OWNER"]
    assert table[1].split()[-3].endswith("Z")  # the move's time, UTC


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["remove", STREAM, "nobody"], "has no consumer group 'nobody'"),
        (["remove", "shop/intake/nothing", "billing"], "never opened"),
        (["move", STREAM, "billing", "--to", "9", "--keep-state"], "only 5 messages were appended"),
        (["move", STREAM, "billing", "--to", "earliest"], "one of the arguments --keep-state --clear-state"),
        (["move", STREAM, "billing", "--to", "0", "--keep-state"], "0 is not a sequence"),
    ],
)
def test_a_refused_group_command_is_one_line_exit_2_and_changes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    path = shop(tmp_path / "ledger")
    before = snapshot(path)
    done = cli("group", args[0], str(path), *args[1:])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert snapshot(path) == before


def test_group_commands_refuse_a_ledger_another_process_owns(tmp_path: Path) -> None:
    path = shop(tmp_path / "ledger")
    before = snapshot(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        done = cli("group", "remove", str(path), STREAM, "audit")
        assert done.returncode == 3, done.stderr
        assert len(done.stderr.splitlines()) == 1
    finally:
        holder.communicate(input="", timeout=30)
    assert snapshot(path) == before


#: The CLI, dying inside the group change's write transaction once every record of it was written.
DIES_HALF_WAY = """
import os, signal, sys
from streams import store
from ledger._cli import main

change = store.change_group

def change_then_die(view, request):
    moved = change(view, request)
    view.flush()  # every record of the change is in the open transaction
    os.kill(os.getpid(), signal.SIGKILL)

store.change_group = change_then_die
sys.exit(main(sys.argv[1:]))
"""


def _state(path: Path) -> Any:
    shown = cli("inspect", str(path), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    return [[(g["group"], g["acked_through"], g["state"]) for g in s["groups"]] for s in report["streams"]]


@pytest.mark.parametrize(
    "args",
    [["remove", STREAM, "audit"], ["move", STREAM, "billing", "--to", "1", "--clear-state"]],
    ids=["remove", "move"],
)
def test_a_group_change_killed_half_way_leaves_the_group_before_or_after(
    tmp_path: Path, args: list[str]
) -> None:
    path = shop(tmp_path / "ledger")
    before = _state(path)
    command = ["group", args[0], str(path), *args[1:]]
    died = subprocess.run(
        [sys.executable, "-c", DIES_HALF_WAY, *command], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert _state(path) == before
    assert_sound(path)
    # killed at random moments: each time before or after, never between
    rng = random.Random(20261130)
    outcomes = set()
    after = None
    for _ in range(6):
        process = subprocess.Popen(
            [sys.executable, "-m", "ledger", *command],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            process.wait(timeout=rng.uniform(0.05, 0.6))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
        finally:
            assert process.stderr is not None
            process.stderr.close()
        now = _state(path)
        if now != before:
            after = after or now
            assert now == after  # a removal run again is refused; a move run again lands the same
        outcomes.add("after" if now != before else "before")
        assert_sound(path)
    done = cli(*command)
    assert done.returncode in (0, 2), done.stderr  # 2: the removal landed already
    final = _state(path)
    assert final != before and (after is None or final == after)
    assert msgspec.json.encode(outcomes)  # which outcomes the random kills saw (both may)
