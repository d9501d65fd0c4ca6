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

**Waiting for what others settle, without a task.** A coroutine that must
wait until values other coroutines of the queue provide are settled (a
node's inputs: :class:`streams._context.Slot`) awaits :func:`settled`. Sent
on by the queue, it is parked there instead of suspending: no task is made
for it, the queue goes on with the next, and once the last of its values
settled it is ready again. It has entered no cancel scope before that wait,
so going on in another task of the group is what a task of its own would do.

**Who runs the queue.** A task running it (a *drainer*) that meets a
coroutine that suspends hands the rest over (to a drainer waiting for parked
coroutines, or to a new one) and follows that coroutine; once it ends, the
same task takes the queue up again. So a chain of members, each made ready
by the one before it (whose landing settles the next one's input), runs in
one task, without a task per member or one ending per member. What a
coroutine makes ready while a task sends it on is left to that task, which
looks right after; what it makes ready before waiting again is handed over
at once, so a ready coroutine never waits for another to end. While
coroutines are parked one drainer waits for them; cancelled there, it throws
the cancellation into each, which ends as its own wait would have ended it.
Awaited where no queue sends it on (a coroutine that suspended before and
goes on in its task, a task it started), :func:`settled` waits as
``slot.arrived.wait()`` does.
"""

from __future__ import annotations

import contextvars
import threading
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

__all__ = ["Settles", "run_all", "settled"]

Start = Callable[[], Coroutine[Any, Any, None]]


class Settles(Protocol):
    """A value settled once, that tells its listeners (:class:`streams._context.Slot`)."""

    @property
    def settled(self) -> bool: ...

    @property
    def arrived(self) -> anyio.Event: ...

    def on_settle(self, listener: Callable[[Any], None]) -> None: ...


class _Park:
    """What :func:`settled` yields to the task that runs its coroutine: wait for these, with no task."""

    __slots__ = ("pending",)

    def __init__(self, pending: list[Settles]) -> None:
        self.pending = pending


#: Whether a queue is sending a coroutine on, on this thread (its event loop's): what that
#: coroutine yields goes to the queue, not to the event loop.
_queue_sends = threading.local()


@types.coroutine
def settled(values: Sequence[Settles]) -> Generator[Any, Any, None]:
    """Wait until every one of ``values`` is settled; see the module docstring."""
    pending = [value for value in values if not value.settled]
    if not pending:
        return
    if getattr(_queue_sends, "on", False):
        yield _Park(pending)
        return
    for value in pending:
        yield from value.arrived.wait().__await__()


class _Resume:
    """A parked coroutine whose values settled: the queue sends it on from where it waited."""

    __slots__ = ("context", "coro")

    def __init__(self, coro: Coroutine[Any, Any, None], context: contextvars.Context) -> None:
        self.coro, self.context = coro, context


class _Queue:
    """One :func:`run_all`'s coroutines, and who runs them.

    ``todo`` holds what is ready to start or to go on; ``parked`` what waits
    for values. A *drainer* is a task running the queue (:func:`_drain`):
    ``active`` counts those in its loop now. A task following a coroutine
    that suspended takes the queue up again once that coroutine ends, so a
    chain of members, each made ready by the one before, runs in one task.
    ``waiting`` is the event the one drainer waiting for parked coroutines
    waits on. ``sending`` counts the sends into coroutines under way: what
    they make ready is seen by their task right after, so no other is woken.
    """

    __slots__ = ("active", "base", "fresh", "parked", "sending", "tg", "todo", "waiting")

    def __init__(
        self,
        tg: anyio.abc.TaskGroup,
        starts: list[Start],
        base: contextvars.Context,
        fresh: Callable[[], None] | None,
    ) -> None:
        self.tg, self.base, self.fresh = tg, base, fresh
        self.todo: deque[Start | _Resume] = deque(starts)
        self.parked: dict[Coroutine[Any, Any, None], contextvars.Context] = {}
        self.active = 0
        self.sending = 0
        self.waiting: anyio.Event | None = None

    def park(self, coro: Coroutine[Any, Any, None], context: contextvars.Context, park: _Park) -> None:
        self.parked[coro] = context
        left = [len(park.pending)]

        def one(_value: Any) -> None:
            left[0] -= 1
            if left[0] == 0 and self.parked.pop(coro, None) is not None:
                self.todo.append(_Resume(coro, context))
                if not self.parked and self.waiting is not None:
                    self.waiting.set()  # nothing left to wait for: the waiting drainer goes on or ends
                elif not self.sending:
                    self.hand_over()

        for value in park.pending:
            value.on_settle(one)

    def hand_over(self) -> None:
        """Make sure some task runs what is ready, and one waits for what is parked."""
        if self.active:
            return  # a drainer in its loop (or about to start) sees them
        if self.todo and self.waiting is not None:
            self.waiting.set()
        elif self.todo or (self.parked and self.waiting is None):
            self.active += 1  # counted from now: no second one is started meanwhile
            self.tg.start_soon(_drain, self, True)

    def hand_over_after_send(self) -> None:
        """A follower's send into its coroutine ended with a wait (or an exception)."""
        self.sending -= 1
        if self.todo:
            self.hand_over()

    def cancel_parked(self, exc: BaseException) -> None:
        """The waiting drainer was cancelled: each parked coroutine ends as its wait would.

        What one raises instead of the cancellation ends the drainer, as it would have
        ended the coroutine's own task.
        """
        parked, self.parked = self.parked, {}
        raised: BaseException | None = None
        for coro, context in parked.items():
            try:
                context.run(coro.throw, exc)
            except BaseException as other:
                if other is not exc and raised is None:
                    raised = other
            else:  # it went on past the cancellation: nothing is left to run it
                context.run(coro.close)
        if raised is not None:
            raise raised


async def run_all(
    tg: anyio.abc.TaskGroup, starts: list[Start], *, fresh: Callable[[], None] | None = None
) -> None:
    """Run every coroutine ``starts`` makes, in order, in ``tg``; see the module docstring.

    Returns once each one finished or suspended (a suspended one then
    goes on in the task group), but the last to suspend, which the caller's
    task runs to its end before this returns; a coroutine parked by
    :func:`settled` is taken up by the task draining the queue (the
    caller's, if none suspended), which waits for it. Call it in ``tg``'s
    body, or in a task of ``tg``. ``fresh``, if given, is called each time
    a task takes the queue up (a new step begins).
    """
    await _drain(_Queue(tg, starts, contextvars.copy_context(), fresh))


async def _drain(queue: _Queue, counted: bool = False) -> None:
    """Run the queue: each ready coroutine until it ends, parks or suspends (then follow it).

    ``counted``: started by :meth:`_Queue.hand_over`, which counted it active already.
    """
    todo, fresh, base, local = queue.todo, queue.fresh, queue.base, _queue_sends
    if not counted:
        queue.active += 1
    try:
        while True:
            if fresh is not None:
                fresh()  # a task takes the queue up: a new step of it
            outer = getattr(local, "on", False)
            local.on = True  # what the coroutines sent on here yield comes here (settled)
            try:
                while todo:
                    item = todo.popleft()
                    if isinstance(item, _Resume):
                        coro, context = item.coro, item.context
                    else:
                        context = base.copy()
                        coro = item()
                    try:
                        yielded = context.run(coro.send, None)
                    except StopIteration:
                        continue  # done without waiting: no task
                    except BaseException:  # it ends this task, as it would have ended its own
                        queue.active -= 1
                        queue.hand_over()
                        queue.active += 1  # (left again below)
                        raise
                    if isinstance(yielded, _Park):  # waits for what others settle: parked, no task
                        queue.park(coro, context, yielded)
                        continue
                    break
                else:
                    coro = None
            finally:
                local.on = outer
            if coro is not None:  # it waits: this task is its task now; the rest to another
                queue.active -= 1
                queue.hand_over()
                try:
                    await _follow(coro, context, yielded, queue)
                finally:
                    queue.active += 1
                continue
            if not queue.parked or queue.waiting is not None or queue.active > 1:
                return
            queue.waiting = waiting = anyio.Event()  # the one that waits for the parked ones
            queue.active -= 1
            try:
                await waiting.wait()
            except BaseException as exc:
                queue.cancel_parked(exc)
                raise
            finally:
                queue.active += 1
                queue.waiting = None
    finally:
        queue.active -= 1
        if not queue.active and not todo and not queue.parked and queue.waiting is not None:
            queue.waiting.set()  # nothing is left: the waiting drainer ends too


@types.coroutine
def _follow(
    coro: Coroutine[Any, Any, None], context: contextvars.Context, yielded: Any, queue: _Queue
) -> Generator[Any, Any, None]:
    """Go on with ``coro``, which yielded ``yielded`` to this task's event loop: this task is its task.

    What each send makes ready is handed over once the coroutine waits again (or raises);
    once it ends, the caller takes the queue up.
    """
    while True:
        go_on: Callable[[Any], Any]
        try:
            sent = yield yielded
        except GeneratorExit:
            context.run(coro.close)
            raise
        except BaseException as exc:  # delivered to the task (an asyncio cancellation): to the coroutine
            go_on, sent = coro.throw, exc
        else:
            go_on = coro.send
        queue.sending += 1
        try:
            yielded = context.run(go_on, sent)
        except StopIteration:
            queue.sending -= 1
            return  # the caller takes the queue up
        except BaseException:
            queue.hand_over_after_send()
            raise
        queue.hand_over_after_send()
