"""``python -m ledger runs cancel|retry|delete``: by run id or by filter, dry runs, the prompt, ``--json``."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from streams import Graph, Key, NodeContext

from ..ledger_command import ledger_command
from .conftest import Opener
from .test_runs_cli import N, _target, doubling, runs

ROOT = Path(__file__).resolve().parents[2]


def held(entered: anyio.Event) -> Graph:
    g = Graph("held", version="1", inputs=[N])

    @g.node(requires=[N], provides=[Key("doubled", int)])
    async def double(ctx: NodeContext) -> None:
        entered.set()
        await anyio.sleep_forever()

    return g


async def three_kinds(open_any: Opener) -> str:
    """A ledger with runs failed (``f1``, ``f2``), completed (``done``) and not ended (``stopped``)."""
    async with open_any() as ledger:
        for run_id in ("f1", "f2"):
            with pytest.raises(ValueError, match="cannot double today"):
                await ledger.start(doubling("broken", fail=True), {N: 1}, run_id=run_id)
        await ledger.start(doubling("double"), {N: 21}, run_id="done")
        entered = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.start(held(entered), {N: 1}, run_id="stopped"))
            await entered.wait()
            tg.cancel_scope.cancel()  # its record stays running: nothing ended it
        return _target(ledger)


def statuses(target: str) -> dict[str, str]:
    return {run["run_id"]: run["status"] for run in runs(target, "list")}


def act(*args: str) -> dict[str, Any]:
    done = ledger_command("runs", *args, "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


async def test_runs_are_retried_cancelled_and_deleted_by_filter_after_a_dry_run(open_any: Opener) -> None:
    target = await three_kinds(open_any)
    before = statuses(target)
    refused = ledger_command("runs", "retry", target, "--status", "failed", "--reason", "r")  # stdin: no tty
    assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1
    assert "stdin is not a terminal: add --yes" in refused.stderr
    planned = act("retry", target, "--status", "failed", "--reason", "back", "--dry-run")
    assert (planned["action"], planned["dry_run"]) == ("retry", True)
    assert [(r["run_id"], r["status"], r["graph"]) for r in planned["runs"]] == [
        ("f2", "failed", "broken"),
        ("f1", "failed", "broken"),
    ]
    assert statuses(target) == before  # a dry run changes nothing

    retried = act("retry", target, "--graph", "broken", "--reason", "back", "--by", "ops", "--yes")
    assert [(r["run_id"], r["attempt"], r["after"], r["error"], r["by"]) for r in retried["runs"]] == [
        ("f2", 1, "failed", "ValueError", "ops"),
        ("f1", 1, "failed", "ValueError", "ops"),
    ]  # a filter takes the runs the act applies to: the completed run of graph double is not one
    cancelled = act("cancel", target, "--graph", "broken", "--reason", "not now", "--yes")
    assert {r["run_id"]: r["status"] for r in cancelled["runs"]} == {"f1": "cancelled", "f2": "cancelled"}
    assert cancelled["skipped"] == []

    planned = act("delete", target, "done", "--dry-run")
    [plan] = planned["runs"]
    assert (plan["run_id"], plan["attempts"], plan["streams"], plan["messages"]) == ("done", 1, 0, 0)
    assert statuses(target)["done"] == "completed"
    deleted = act("delete", target, "--status", "cancelled", "--yes")
    assert sorted(r["run_id"] for r in deleted["runs"]) == ["f1", "f2"]
    assert all(r["records"] >= 1 for r in deleted["runs"])
    assert set(statuses(target)) == {"done", "stopped"}


async def test_one_run_is_cancelled_retried_and_deleted_with_json_saying_what_changed(
    open_any: Opener,
) -> None:
    target = await three_kinds(open_any)
    cancelled = act("cancel", target, "stopped", "--reason", "stuck", "--by", "ops")
    assert (cancelled["action"], cancelled["dry_run"], cancelled["skipped"]) == ("cancel", False, [])
    [run] = cancelled["runs"]
    assert (run["run_id"], run["status"], run["by"], run["reason"]) == (
        "stopped",
        "cancelled",
        "ops",
        "stuck",
    )
    [run] = act("retry", target, "stopped", "--reason", "unstuck")["runs"]
    assert (run["run_id"], run["attempt"], run["after"]) == ("stopped", 1, "cancelled")
    [run] = act("delete", target, "f1")["runs"]
    assert run["run_id"] == "f1" and run["records"] >= 1 and "f1" not in statuses(target)
    dry = ledger_command("runs", "delete", target, "stopped", "--dry-run")  # not ended: refused as delete is
    assert dry.returncode == 2 and "is running" in dry.stderr and dry.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [
        ("cancel", "--reason", "r"),  # neither a run nor a filter
        ("cancel", "done", "--status", "failed", "--reason", "r"),  # both
        ("delete", "--status", "bogus", "--yes"),
        ("retry", "--since", "yesterday", "--reason", "r", "--yes"),
    ],
)
def test_an_act_given_bad_arguments_is_one_line_and_changes_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    action, *rest = args
    done = ledger_command("runs", action, str(tmp_path / "none"), *rest)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert not (tmp_path / "none").exists()


def _on_a_terminal(target: str, answer: str) -> tuple[int, str, str]:
    """``runs delete TARGET --status completed`` with a terminal for stdin, answering ``answer``."""
    controller, terminal = pty.openpty()
    try:
        os.write(controller, answer.encode() + b"\n")  # typed ahead: the terminal keeps it for the read
        done = subprocess.run(
            [sys.executable, "-m", "ledger", "runs", "delete", target, "--status", "completed"],
            cwd=ROOT,
            stdin=terminal,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    return done.returncode, done.stdout, done.stderr


async def test_an_act_by_filter_asks_on_a_terminal_first(open_any: Opener) -> None:
    target = await three_kinds(open_any)
    code, out, err = await anyio.to_thread.run_sync(_on_a_terminal, target, "n")
    assert (code, out) == (1, "") and err.endswith(
        "delete these 1 run(s)? [y/N] not confirmed: nothing changed\n"
    )
    assert "would delete run 'done' (completed, graph double)" in err
    assert "done" in statuses(target)
    code, out, err = await anyio.to_thread.run_sync(_on_a_terminal, target, "y")
    assert code == 0 and out.startswith("deleted run 'done': ")
    assert "done" not in statuses(target)
