"""``run_all``: coroutines run in the caller's task until one waits, equivalent to a task each.

The equivalence its docstring states, checked on asyncio and trio: each
coroutine in its own copy of the context, inside the task group's scopes
(a cancellation reaches it at its awaits), what it raises ending only its
own run, and every coroutine run whatever the others do.
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

from streams._inline import run_all

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

        async def main() -> None:
            VAR.set("caller")
            starts = [member(i, p) for i, p in enumerate(programs)]
            async with anyio.create_task_group() as tg:
                if inline:
                    await run_all(tg, starts)
                else:
                    for start in starts:
                        tg.start_soon(start)

        anyio.run(main, backend=backend)
        return seen

    assert traces(inline=True) == traces(inline=False)
