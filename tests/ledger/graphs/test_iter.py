"""``DurableGraph.iter``: a graph driven a task at a time, with the checkpoints and resume of ``run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic_graph import EndMarker, GraphTaskRequest
from pydantic_graph.id_types import NodeID

from ledger import open_ledger

from .graphs import Boom, Calls, Log, durable, three_steps


def nodes(event: Any) -> Any:
    return "end" if isinstance(event, EndMarker) else [task.node_id for task in event]


async def test_iterating_yields_what_graph_iter_yields_and_saves_every_boundary(tmp_path: Path) -> None:
    graph = three_steps()
    async with graph.iter(state=Log(), deps=Calls(), inputs=5, infer_name=False) as plain:
        expected = [nodes(event) async for event in plain]
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(graph, ledger)
        async with runner.iter("r", state=Log(), inputs=5, deps=Calls()) as run:
            seen = [nodes(event) async for event in run]
        status = await runner.status("r")
    assert seen == expected == [["one"], ["two"], ["three"], ["__end__"], "end"]
    assert run.result is not None and (run.result.output, run.result.state.steps) == (
        9,
        ["one", "two", "three"],
    )
    assert status is not None and (status.checkpoints, status.finished) == (4, True)


async def test_a_driver_that_stops_at_a_boundary_resumes_there_and_sees_the_saved_task_first(
    tmp_path: Path,
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(three_steps(), ledger)
        calls = Calls()
        async with runner.iter("r", state=Log(), inputs=5, deps=calls) as run:
            async for event in run:
                if nodes(event) == ["two"]:
                    break  # wait for an approval before step two, say
        stopped = await runner.status("r")

        calls = Calls()
        async with runner.iter("r", state=Log(), inputs=5, deps=calls) as run:
            first = await run.next()
            ran_before_continuing = list(calls.ran)
            rest = [nodes(event) async for event in run]
    assert stopped is not None and (stopped.checkpoints, stopped.next_node, stopped.finished) == (
        1,
        "two",
        False,
    )
    assert nodes(first) == ["two"] and ran_before_continuing == []  # shown, not run yet
    assert rest == [["three"], ["__end__"], "end"]
    assert calls.ran == ["two", "three"]
    assert run.result is not None and run.result.output == 9 and run.resumed_from == 1


async def test_tasks_given_to_next_replace_the_next_task_and_are_what_the_checkpoint_saves(
    tmp_path: Path,
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(three_steps(), ledger)
        calls = Calls()
        async with runner.iter("r", state=Log(), inputs=5, deps=calls) as run:
            await run.next()  # [one]
            after_one = await run.next()  # one ran: [two] comes next
            (task,) = after_one  # type: ignore[misc]
            calls.fail_at = {"three"}
            with pytest.raises(Boom):
                await run.next([GraphTaskRequest(NodeID("three"), 100, task.fork_stack)])
        failed = await runner.status("r")
        calls = Calls()
        result = await runner.run("r", state=Log(), inputs=5, deps=calls)
    assert failed is not None and failed.next_node == "three"  # the driver caught Boom: no failure recorded
    assert calls.ran == ["three"] and calls.seen == [100]  # resumed with the replacement, not step two
    assert result.output == 97


async def test_a_finished_run_iterates_to_its_saved_end_without_running_anything(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(three_steps(), ledger)
        await runner.run("r", state=Log(), inputs=5, deps=Calls())
        calls = Calls()
        async with runner.iter("r", state=Log(), inputs=5, deps=calls) as run:
            assert run.result is not None and run.result.already_finished
            events = [event async for event in run]
    assert [nodes(e) for e in events] == ["end"] and isinstance(events[0], EndMarker)
    assert events[0].value == 9 and calls.ran == [] and run.state.steps == ["one", "two", "three"]


class DriverStopped(Exception):
    """The driving code's own failure, raised between two steps."""


async def test_a_driver_failing_at_a_boundary_saves_it_and_an_override_of_the_saved_task_is_saved(
    tmp_path: Path,
) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        runner = durable(three_steps(), ledger)
        with pytest.raises(DriverStopped):
            async with runner.iter("r", state=Log(), inputs=5, deps=Calls()) as run:
                async for event in run:
                    if nodes(event) == ["two"]:
                        raise DriverStopped
        stopped = await runner.status("r")

        calls = Calls(fail_at={"three"})
        with pytest.raises(Boom):
            async with runner.iter("r", deps=calls) as run:
                (saved,) = await run.next()  # type: ignore[misc]
                await run.next([GraphTaskRequest(NodeID("three"), 100, saved.fork_stack)])
        replaced = await runner.status("r")
    assert stopped is not None and (stopped.next_node, stopped.error) == ("two", "DriverStopped")
    assert calls.ran == ["three"] and calls.seen == [100]  # step two was replaced, never run
    assert replaced is not None and (replaced.next_node, replaced.error) == ("three", "Boom")
