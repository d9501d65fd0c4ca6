"""A level's step: members that run one after another in one task check anyio once per node, not twice.

A node's finding that it is not cancelled, after its chain, stands for the
check of the next member of the same step before its attempt opens, as long
as nothing could have cancelled a scope since (streams._level.Level.clear).
These tests pin what disturbs it: a cancellation in between is always seen
before the next node runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from streams import (
    ExecCheckpoint,
    Execution,
    ExecutionEvent,
    Graph,
    Key,
    MemoryStore,
    NodeContext,
    Waiting,
)

N = Key("n", int)
NAMES = [f"n{i}" for i in range(6)]
KEYS = {name: Key(f"k_{name}", int) for name in NAMES}


def _wide(ran: list[str], before: Callable[[str], None] = lambda name: None) -> Graph:
    g = Graph("wide", inputs=[N])

    def setter(name: str) -> Callable[[NodeContext], Awaitable[None]]:
        async def node(ctx: NodeContext) -> None:  # never waits: the whole level is one step
            before(name)
            ran.append(name)
            ctx.set(KEYS[name], ctx[N])

        return node

    for name in NAMES:
        g.add_node(name, setter(name), requires=[N], provides=[KEYS[name]])
    return g


@pytest.mark.parametrize("new_scope", [True, False])
async def test_a_cancellation_by_the_observer_between_two_nodes_of_a_step_stops_the_next(
    new_scope: bool,
) -> None:
    ran: list[str] = []
    store = MemoryStore()

    def observe(event: ExecutionEvent) -> None:
        if isinstance(event, Waiting) and event.node == "n3":
            host.cancel()  # the host's code, between n2's end and n3's attempt, in the same step

    with anyio.CancelScope() as host:
        checkpoint = ExecCheckpoint("r", store, new_scope=new_scope)
        async with Execution(_wide(ran), {N: 1}, checkpoint=checkpoint, on_event=observe) as execution:
            await execution.wait()
    assert host.cancelled_caught
    assert ran == ["n0", "n1", "n2"]  # n3 and after were cancelled before their attempts opened
    committed = {record.node for record in await store.node_records("r")}
    assert committed <= {"n0", "n1", "n2"}


async def test_a_node_that_cancels_the_host_confirms_nothing_and_the_rest_of_its_step_does_not_run() -> None:
    ran: list[str] = []
    store = MemoryStore()

    def before(name: str) -> None:
        if name == "n2":
            host.cancel()  # synchronously, from node code: no await between it and the node's end

    with anyio.CancelScope() as host:
        checkpoint = ExecCheckpoint("r", store, new_scope=True)
        async with Execution(_wide(ran, before), {N: 1}, checkpoint=checkpoint) as execution:
            await execution.wait()
    assert host.cancelled_caught
    assert ran == ["n0", "n1", "n2"]
    committed = {record.node for record in await store.node_records("r")}
    assert "n2" not in committed and committed <= {"n0", "n1"}  # n2 returned after the cancellation
    assert execution.result().statuses[("n2",)] == "cancelled"


async def test_every_node_of_an_undisturbed_step_is_confirmed() -> None:
    ran: list[str] = []
    store = MemoryStore()
    async with Execution(
        _wide(ran), {N: 1}, checkpoint=ExecCheckpoint("r", store, new_scope=True)
    ) as execution:
        result = await execution.wait()
    assert ran == NAMES
    assert {record.node for record in await store.node_records("r")} == set(NAMES)
    assert all(result[KEYS[name]] == 1 for name in NAMES)
