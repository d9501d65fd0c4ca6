"""``python -m ledger inspect`` lists durable graph runs, without their values unless asked."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_graph import Graph, GraphBuilder, StepContext

from ledger import open_ledger
from ledger._cli import main
from ledger.postgres import open_postgres

from .conftest import Opening
from .graphs import Boom, Calls, Log, durable, enter, three_steps


async def _ledger_with_three_runs(path: Path | Opening) -> None:
    opening: Opening = (lambda: open_ledger(path)) if isinstance(path, Path) else path
    async with opening() as ledger:
        runner = durable(three_steps(), ledger)
        await runner.run("done", state=Log(steps=["secret-start"]), inputs=5, deps=Calls())
        with pytest.raises(Boom):
            await runner.run("broken", state=Log(), inputs=7, deps=Calls(fail_at={"three"}))
        with pytest.raises(Boom):
            await runner.run("changed", state=Log(), inputs=1, deps=Calls(fail_at={"two"}))
    async with opening() as ledger:  # the graph changed: its checkpoint is discarded
        changed = durable(one_step("three-v2"), ledger)
        with pytest.raises(Boom):
            await changed.run("changed", state=Log(), inputs=1, deps=Calls(fail_at={"one"}))


def one_step(name: str) -> Graph:
    """start -> one -> end, where ``one`` is another function than three_steps' ``one``."""
    g = GraphBuilder(name=name, state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def one(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "one", ctx.inputs)

    g.add(g.edge_from(g.start_node).to(one), g.edge_from(one).to(g.end_node))
    return g.build()


async def _inspect(path: Path | str, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """What the command prints; run off the event loop, as a command line runs."""
    assert await anyio.to_thread.run_sync(main, ["inspect", str(path), *flags]) == 0
    return capsys.readouterr().out


async def test_inspect_lists_graph_runs_with_status_attempts_checkpoints_and_where_they_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "l"
    await _ledger_with_three_runs(path)
    report: dict[str, Any] = json.loads(await _inspect(path, capsys, "--json"))
    runs = {run["run_id"]: run for run in report["graph_runs"]}
    assert list(runs) == ["broken", "changed", "done"]
    assert runs["done"] | {"graph": None} == {
        "run_id": "done",
        "graph": None,
        "status": "finished",
        "attempts": 1,
        "checkpoints": 4,
        "last_step": "__end__",
        "resumes_at": None,
        "error": None,
        "discarded": None,
        "checkpoint_format": None,
    }
    assert runs["done"]["graph"] == "three"
    broken = runs["broken"]
    assert (broken["status"], broken["error"], broken["resumes_at"], broken["checkpoints"]) == (
        "failed",
        "Boom",
        "three",
        2,
    )
    changed = runs["changed"]
    assert (changed["graph"], changed["attempts"], changed["discarded"], changed["resumes_at"]) == (
        "three-v2",
        2,
        "graph_changed",
        None,
    )
    assert "values" not in json.dumps(report) and "secret-start" not in json.dumps(report)

    table = await _inspect(path, capsys)
    assert "graph runs" in table
    lines = {line.split()[0]: line for line in table.splitlines() if line.startswith("  ")}
    assert lines["broken"].split()[:6] == ["broken", "three", "failed", "1", "2", "three"]
    assert "failed with Boom" in lines["broken"]
    assert "a checkpoint was discarded: graph_changed" in lines["changed"]
    assert lines["done"].split()[:6] == ["done", "three", "finished", "1", "4", "-"]
    assert "secret-start" not in table


async def test_inspect_shows_a_runs_checkpoint_values_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "l"
    await _ledger_with_three_runs(path)
    report: dict[str, Any] = json.loads(await _inspect(path, capsys, "--json", "--values"))
    runs = {run["run_id"]: run for run in report["graph_runs"]}
    assert runs["done"]["values"] == {
        "state": {"steps": ["secret-start", "one", "two", "three"]},
        "inputs": 5,
        "next_inputs": None,
        "output": 9,
    }
    assert runs["broken"]["values"]["next_inputs"] == 16  # (7 + 1) * 2, for step three
    assert "values" not in runs["changed"]  # its checkpoint was discarded: nothing to show
    assert "secret-start" in await _inspect(path, capsys, "--values")


async def test_inspect_on_a_url_lists_the_graph_runs_inspect_on_a_path_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], postgres_url: str
) -> None:
    await _ledger_with_three_runs(tmp_path / "l")
    await _ledger_with_three_runs(lambda: open_postgres(postgres_url))
    on_lmdb = json.loads(await _inspect(tmp_path / "l", capsys, "--json", "--values"))["graph_runs"]
    on_postgres = json.loads(await _inspect(postgres_url, capsys, "--json", "--values"))["graph_runs"]
    assert len(on_postgres) == 3 and on_postgres == on_lmdb
