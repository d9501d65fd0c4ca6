"""Store calls run in a given context's variables, from any task (streams._in_context)."""

from __future__ import annotations

import contextvars

import anyio
import pytest

from streams._in_context import call_in_context, same_context

pytestmark = pytest.mark.anyio

TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


def _context_with(tenant: str) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(TENANT.set, tenant)
    return context


async def _seen_across_awaits() -> tuple[str, str, str]:
    before = TENANT.get()
    await anyio.lowlevel.checkpoint()
    with anyio.CancelScope(shield=True):
        await anyio.lowlevel.checkpoint()
    in_thread = await anyio.to_thread.run_sync(TENANT.get)
    return before, TENANT.get(), in_thread


async def test_a_coroutine_created_in_a_context_still_runs_in_the_awaiting_tasks() -> None:
    TENANT.set("caller")
    created = _context_with("other").run(_seen_across_awaits)
    assert await created == ("caller", "caller", "caller")  # why the call must be stepped in it


async def test_every_step_of_the_call_and_its_threads_see_the_context_and_the_caller_keeps_its_own() -> None:
    TENANT.set("caller")
    assert await call_in_context(_context_with("a"), _seen_across_awaits) == ("a", "a", "a")
    assert TENANT.get() == "caller"


async def test_what_the_call_sets_stays_in_its_context() -> None:
    async def sets() -> str:
        TENANT.set("set by the store")
        await anyio.lowlevel.checkpoint()
        return TENANT.get()

    context = _context_with("a")
    assert await call_in_context(context, sets) == "set by the store"
    assert TENANT.get() == "none" and context[TENANT] == "set by the store"


async def test_a_cancellation_reaches_the_call_and_its_exceptions_reach_the_caller() -> None:
    reached: list[str] = []

    async def waits() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            reached.append(TENANT.get())

    with anyio.CancelScope() as scope:
        scope.cancel()
        await call_in_context(_context_with("a"), waits)
    assert scope.cancelled_caught and reached == ["a"]

    async def refuses() -> None:
        await anyio.lowlevel.checkpoint()
        raise ValueError(TENANT.get())

    with pytest.raises(ValueError, match=r"^a$"):
        await call_in_context(_context_with("a"), refuses)


def test_contexts_are_the_same_when_their_values_are_equal() -> None:
    assert same_context(_context_with("a"), _context_with("a"))
    assert not same_context(_context_with("a"), _context_with("b"))
    assert same_context(contextvars.copy_context(), contextvars.copy_context())

    class Incomparable:
        def __eq__(self, other: object) -> bool:
            raise TypeError("no")

        __hash__ = object.__hash__

    var: contextvars.ContextVar[object] = contextvars.ContextVar("incomparable")
    first, second = contextvars.copy_context(), contextvars.copy_context()
    first.run(var.set, Incomparable())
    second.run(var.set, Incomparable())
    assert not same_context(first, second)
    assert same_context(first, first)
