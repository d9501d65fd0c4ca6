"""Running many coroutines with a task for each one that waits, not for each one that runs.

A level has a coroutine per member to run (:mod:`streams._level`), and most
members of a wide graph run to their end without ever waiting: a task each
would cost more than the node. :func:`run_all` runs them one after another
in the calling task, each until it first suspends (waits for something the
event loop must deliver). One that finished without suspending costs no
task. When one suspends, the rest of the queue goes on in a new task of the
task group, and the calling task stays with the suspended coroutine to its
end (the task a coroutine began in is the one whose cancel scopes it
entered, whose trio trap or asyncio future it yielded: it must stay there).

The equivalence it keeps with ``for c in coros: tg.start_soon(c)``:

- each coroutine runs in a copy of the context the queue was made in, as a
  task spawned then would (what one sets is never seen by the next);
- each runs inside the task group's cancel scope and the scopes around it,
  in a task of the group, and a cancellation reaches it at its awaits as it
  would reach a task of its own;
- what a coroutine raises ends the task it runs in, as it would have ended
  its own task: the rest of the queue has gone on in another task first.

What differs is only the order in which coroutines that never wait
interleave with other tasks: a coroutine runs when the one before it in the
queue finished or first suspended, not at the next turn of the event loop.

A run of coroutines in one task with no suspension between them (a *step*
of the queue) is what the caller may take advantage of: nothing but their
own code runs meanwhile. ``fresh`` is called as each task takes the queue
up, so the caller knows where a step begins (:meth:`streams._tree.Tree.disturb`).
"""

from __future__ import annotations

import contextvars
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import anyio.abc

__all__ = ["run_all"]

Start = Callable[[], Coroutine[Any, Any, None]]


async def run_all(
    tg: anyio.abc.TaskGroup, starts: list[Start], *, fresh: Callable[[], None] | None = None
) -> None:
    """Run every coroutine ``starts`` makes, in order, in ``tg``; see the module docstring.

    Returns once each one finished or suspended (a suspended one then
    goes on in the task group), but the last to suspend, which the caller's
    task runs to its end before this returns. Call it in ``tg``'s body, or
    in a task of ``tg``. ``fresh``, if given, is called each time a task
    takes the queue up (a new step begins).
    """
    await _drain(tg, deque(starts), contextvars.copy_context(), fresh)


async def _drain(
    tg: anyio.abc.TaskGroup,
    queue: deque[Start],
    base: contextvars.Context,
    fresh: Callable[[], None] | None,
) -> None:
    if fresh is not None:
        fresh()
    while queue:
        start = queue.popleft()
        context = base.copy()
        coro = start()
        try:
            yielded = context.run(coro.send, None)
        except StopIteration:
            continue  # done without waiting: no task
        except BaseException:
            if queue:  # it ends this task, as it would have ended its own; the rest goes on
                tg.start_soon(_drain, tg, queue, base, fresh)
            raise
        if queue:  # it waits: the rest goes on in a task of its own, this one is the coroutine's
            tg.start_soon(_drain, tg, queue, base, fresh)
        await _follow(coro, context, yielded)
        return


@types.coroutine
def _follow(
    coro: Coroutine[Any, Any, None], context: contextvars.Context, yielded: Any
) -> Generator[Any, Any, None]:
    """Go on with ``coro``, which yielded ``yielded`` to this task's event loop: this task is its task."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            context.run(coro.close)
            raise
        except BaseException as exc:  # delivered to the task (an asyncio cancellation): to the coroutine
            try:
                yielded = context.run(coro.throw, exc)
            except StopIteration:
                return
        else:
            try:
                yielded = context.run(coro.send, sent)
            except StopIteration:
                return
