"""``run_all``: coroutines run in the caller's task until one waits, equivalent to a task each.

The equivalence its docstring states, checked on asyncio and trio: each
coroutine in its own copy of the context, inside the task group's scopes
(a cancellation reaches it at its awaits), what it raises ending only its
own run, and every coroutine run whatever the others do. A coroutine that
waits for values others settle (``settled``) is parked without a task and
taken up again by the queue once they are.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams._context import Slot
from streams._inline import run_all, settled

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_inline", default="unset")


def test_an_empty_queue_runs_nothing() -> None:
    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await run_all(tg, [])

    anyio.run(main)


async def test_coroutines_that_never_wait_run_in_the_callers_task_one_after_another() -> None:
    order: list[tuple[int, object]] = []
    here = anyio.get_current_task().id

    def step(i: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def run() -> None:
            order.append((i, anyio.get_current_task().id))

        return run

    async with anyio.create_task_group() as tg:
        await run_all(tg, [step(i) for i in range(5)])
        assert order == [(i, here) for i in range(5)]  # all done before run_all returned


async def test_after_one_waits_the_rest_go_on_in_another_task_and_it_stays_in_its_own() -> None:
    seen: dict[str, object] = {}
    go = anyio.Event()

    async def waits() -> None:
        seen["before"] = anyio.get_current_task().id
        await go.wait()
        seen["after"] = anyio.get_current_task().id

    async def then() -> None:
        seen["then"] = anyio.get_current_task().id
        go.set()

    async with anyio.create_task_group() as tg:
        await run_all(tg, [waits, then])
    assert seen["before"] == seen["after"] != seen["then"]


async def test_each_coroutine_sees_its_own_copy_of_the_context() -> None:
    seen: list[str] = []
    VAR.set("caller")

    async def setter() -> None:
        seen.append(VAR.get())
        VAR.set("set by the first")

    async def reader() -> None:
        seen.append(VAR.get())

    async with anyio.create_task_group() as tg:
        await run_all(tg, [setter, reader])
    assert seen == ["caller", "caller"]
    assert VAR.get() == "caller"


async def test_in_a_cancelled_group_each_coroutine_starts_and_is_cancelled_at_its_first_await() -> None:
    started: list[int] = []
    finished: list[int] = []

    def member(i: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def run() -> None:
            started.append(i)
            await anyio.lowlevel.checkpoint()
            finished.append(i)

        return run

    async with anyio.create_task_group() as tg:
        tg.cancel_scope.cancel()
        await run_all(tg, [member(i) for i in range(4)])
    assert started == [0, 1, 2, 3] and finished == []


async def test_what_one_raises_ends_only_its_own_run_and_the_rest_still_run() -> None:
    ran: list[int] = []

    def member(i: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def run() -> None:
            ran.append(i)
            if i == 1:
                raise ValueError("member 1 failed")

        return run

    with pytest.RaisesGroup(ValueError):
        async with anyio.create_task_group() as tg:
            await run_all(tg, [member(i) for i in range(4)])
    assert sorted(ran) == [0, 1, 2, 3]


async def test_a_chain_waiting_for_what_the_one_before_settles_runs_in_the_callers_task() -> None:
    """Started last first, each waits for the next one's value: parked, no task each, no step."""
    slots = [Slot() for _ in range(6)]
    order: list[tuple[int, object]] = []
    here = anyio.get_current_task().id

    def link(i: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def run() -> None:
            await settled([slots[i]])
            order.append((i, anyio.get_current_task().id))
            slots[i + 1].settle(i + 1)

        return run

    slots[0].settle(0)
    async with anyio.create_task_group() as tg:
        await run_all(tg, [link(i) for i in reversed(range(5))])
        assert order == [(i, here) for i in range(5)]  # all done before run_all returned


async def test_a_parked_one_goes_on_in_the_task_of_the_one_that_settled_its_value_once_that_ends() -> None:
    """The settler waited (a task of its own); once it ends, its task takes the queue up: no task more."""
    slot, go = Slot(), anyio.Event()
    seen: dict[str, object] = {}

    async def waits_for_an_event() -> None:
        await go.wait()
        seen["settler"] = anyio.get_current_task().id
        slot.settle("v")

    async def parked() -> None:
        await settled([slot])
        seen["parked"] = anyio.get_current_task().id

    async def go_soon() -> None:
        await anyio.lowlevel.checkpoint()
        go.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(go_soon)
        await run_all(tg, [waits_for_an_event, parked])
    assert seen["parked"] == seen["settler"]


async def test_a_parked_one_does_not_wait_for_the_settler_that_goes_on_waiting() -> None:
    slot, go, done = Slot(), anyio.Event(), anyio.Event()
    order: list[str] = []

    async def settles_then_waits() -> None:
        await go.wait()
        slot.settle("v")
        await done.wait()  # set by the parked one: it must run while this one waits
        order.append("settler ended")

    async def parked() -> None:
        await settled([slot])
        order.append("parked ran")
        done.set()

    async def go_soon() -> None:
        await anyio.lowlevel.checkpoint()
        go.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(go_soon)
        await run_all(tg, [settles_then_waits, parked])
    assert order == ["parked ran", "settler ended"]


async def test_parked_ones_are_cancelled_where_they_wait_with_the_group() -> None:
    never = Slot()
    ended: list[str] = []

    async def parked() -> None:
        try:
            await settled([never])
        except anyio.get_cancelled_exc_class():
            ended.append("cancelled")
            raise
        ended.append("went on")

    async def cancel_soon(scope: anyio.CancelScope) -> None:
        await anyio.lowlevel.checkpoint()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_soon, tg.cancel_scope)
        await run_all(tg, [parked, parked])  # the caller's task waits for the parked ones
    assert ended == ["cancelled", "cancelled"]


async def test_what_a_parked_one_raises_for_its_cancellation_reaches_the_group() -> None:
    never = Slot()

    async def parked() -> None:
        try:
            await settled([never])
        finally:
            raise ValueError("raised while cancelled")

    async def cancel_soon(scope: anyio.CancelScope) -> None:
        await anyio.lowlevel.checkpoint()
        scope.cancel()

    with pytest.RaisesGroup(ValueError):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon, tg.cancel_scope)
            await run_all(tg, [parked])


async def test_settled_outside_a_queue_waits_as_the_slots_event_does() -> None:
    slot = Slot()
    seen: list[str] = []

    async def waiter() -> None:
        await settled([slot])
        seen.append(slot.value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)  # a task of its own: no queue takes what it yields
        await anyio.lowlevel.checkpoint()
        assert seen == []
        slot.settle("v")
    assert seen == ["v"]


def run_queue(starts: list[Callable[[], Coroutine[Any, Any, None]]], *, inline: bool, backend: str) -> None:
    """Run ``starts`` from a caller whose context says "caller": by ``run_all``, or a task each."""

    async def main() -> None:
        VAR.set("caller")
        async with anyio.create_task_group() as tg:
            if inline:
                await run_all(tg, starts)
            else:
                for start in starts:
                    tg.start_soon(start)

    anyio.run(main, backend=backend)


#: A coroutine's program: how many times it yields between its steps (0: it never waits).
programs = st.lists(st.lists(st.integers(min_value=0, max_value=2), max_size=4), max_size=8)


@settings(max_examples=60, deadline=None)
@given(programs=programs, backend=st.sampled_from(["asyncio", "trio"]))
def test_run_all_does_what_a_task_each_does(programs: list[list[int]], backend: str) -> None:
    """Every coroutine runs all its steps, in its order, in its own context, as with start_soon."""

    def traces(inline: bool) -> dict[int, list[tuple[int, str]]]:
        seen: dict[int, list[tuple[int, str]]] = {}

        def member(i: int, program: list[int]) -> Callable[[], Coroutine[Any, Any, None]]:
            async def run() -> None:
                seen[i] = []
                for n, yields in enumerate(program):
                    seen[i].append((n, VAR.get()))
                    VAR.set(f"member {i}")
                    for _ in range(yields):
                        await anyio.lowlevel.checkpoint()

            return run

        run_queue([member(i, p) for i, p in enumerate(programs)], inline=inline, backend=backend)
        return seen

    assert traces(inline=True) == traces(inline=False)


#: Coroutines that wait for others: each its yields, and the earlier ones whose values it waits for.
waiting = st.lists(
    st.tuples(st.integers(min_value=0, max_value=2), st.sets(st.integers(min_value=0, max_value=7))),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(waiting=waiting, order=st.randoms(use_true_random=False), backend=st.sampled_from(["asyncio", "trio"]))
def test_run_all_with_parked_coroutines_does_what_a_task_each_does(
    waiting: list[tuple[int, set[int]]], order: Any, backend: str
) -> None:
    """Each waits for the values of earlier ones, yields, then settles its own: queued in any order."""

    def traces(inline: bool) -> dict[int, tuple[str, list[str]]]:
        seen: dict[int, tuple[str, list[str]]] = {}
        slots = [Slot() for _ in waiting]

        def member(i: int, yields: int, needs: set[int]) -> Callable[[], Coroutine[Any, Any, None]]:
            async def run() -> None:
                before = VAR.get()
                VAR.set(f"member {i}")
                await settled([slots[j] for j in sorted(needs) if j < i])
                for _ in range(yields):
                    await anyio.lowlevel.checkpoint()
                seen[i] = (before, [str(slots[j].value) for j in sorted(needs) if j < i])
                slots[i].settle(i)

            return run

        queued = [member(i, y, needs) for i, (y, needs) in enumerate(waiting)]
        order.shuffle(queued)
        run_queue(queued, inline=inline, backend=backend)
        return seen

    assert (
        traces(inline=True)
        == traces(inline=False)
        == {i: ("caller", [str(j) for j in sorted(needs) if j < i]) for i, (_, needs) in enumerate(waiting)}
    )
