"""The confirmation pipeline: stage, confirm, land, wake.

Every confirmation the engine makes runs through one of these: a handler's
messages (:mod:`streams._handle`), a writer's appends (:mod:`streams._stream`)
and the records of concluded graph nodes (:mod:`streams._node_commits`). The
caller stages work in a buffer of its own and counts it with
:meth:`ConfirmPipeline.stage`, which returns a mark to :meth:`~ConfirmPipeline.wait`
for. One committer task then:

1. **cuts** everything staged into one batch (the caller's ``cut``, with no
   await between the count and the cut, so a batch holds exactly the work
   counted before it); a caller that gives ``units`` may cut a part of it and
   say how much (node records take those of one context), the rest leaving
   with the next batch;
2. **confirms** it with one store call (``confirm``), shielded: a batch handed
   to the store finishes, so local state never disagrees with the ledger.
   The call runs in the batch's ``context`` (:mod:`streams._in_context`): the
   context variables of the caller that staged the batch's first unit, copied
   then, whichever task leads the pipeline;
3. **lands** it (``land``): applies it to local state, publishes what it
   confirmed, and wakes whoever waits on it;
4. goes on while more was staged meanwhile: work staged while a batch is in
   the store leaves together with the next, so concurrent work shares commits.
   Before it cuts that next batch it lets :data:`SETTLE_STEPS` steps of the
   event loop pass, so that what the landing itself set off (a handler given
   the messages just published stages its work) leaves in that batch too,
   not in the one after it. A committer that finds nothing staged after a
   landing ends at once, so an idle pipeline waits for nothing.

Batches are confirmed one at a time and land in the order they were cut
(the order they were staged, unless a cut took a part of what was staged).
The committer is started when work is staged and ends when nothing is left,
so an idle pipeline holds no task; with :meth:`~ConfirmPipeline.stage_and_lead`
the task that stages into an idle pipeline is the committer itself. A failed confirmation has an unknown
outcome: ``fail`` turns it into the owner's latched :class:`CheckpointError`
(recovery reads the ledger, never assumes), the pipeline takes nothing more,
and every waiter whose work had not landed gets that error. With
``surface=True`` the committer raises it too, so the task group it runs in
fails even when nobody waits (a writer's appends, a handler that must stop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from contextvars import Context
from typing import Any, Final, Generic, TypeVar

import anyio
import anyio.lowlevel

from ._errors import CheckpointError
from ._in_context import call_in_context
from ._outcome import is_fault

__all__ = ["SETTLE_STEPS", "ConfirmPipeline", "Spawn"]

B = TypeVar("B")

#: Steps of the event loop a committer lets pass after a landing before it cuts the next batch
#: (see the module docstring): the readers woken by what was published run in the first, and a
#: task woken in the same step as the committer may come after it.
SETTLE_STEPS: Final = 2

#: Starts a background task (a task group's ``start_soon``, or an execution's spawner).
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


class ConfirmPipeline(Generic[B]):
    """One ordered stream of confirmations; see the module docstring.

    ``staged`` and ``landed`` count the caller's units of work (messages,
    appended values, node records); ``in_flight`` is their difference.
    ``running`` says whether a committer runs. A caller that counts its own
    work inline, as :meth:`stage` would (a handler's loop, once a message),
    raises ``failure`` if it is set, adds to ``staged``, and calls
    :meth:`start` when no committer runs.
    """

    __slots__ = (
        "_confirm",
        "_context",
        "_cut",
        "_fail",
        "_land",
        "_progress",
        "_spawn",
        "_surface",
        "_units",
        "confirming",
        "failure",
        "landed",
        "running",
        "staged",
    )

    def __init__(
        self,
        *,
        cut: Callable[[], B],
        confirm: Callable[[B], Awaitable[object]],
        land: Callable[[B], None],
        fail: Callable[[B, Exception], CheckpointError],
        context: Callable[[B], Context] | None = None,
        units: Callable[[B], int] | None = None,
        spawn: Spawn | None = None,
        surface: bool = False,
    ) -> None:
        self._cut = cut
        self._context = context  # the context a batch's confirm runs in (default: the committer's)
        self._units = units  # the units a batch holds, if a cut may leave some staged
        self._confirm = confirm
        self._land = land
        self._fail = fail
        self._spawn = spawn
        self._surface = surface
        self.running = False
        self._progress = anyio.Event()
        self.staged = 0
        self.landed = 0
        self.confirming = False  # a batch is in the store now
        self.failure: CheckpointError | None = None

    @property
    def in_flight(self) -> int:
        """Units staged but not landed."""
        return self.staged - self.landed

    def stage(self, units: int = 1) -> int:
        """Count ``units`` the caller just staged; the mark :meth:`wait` takes for them.

        Raises the pipeline's failure instead: after a failed confirmation
        nothing more is taken.
        """
        # _accept inline: stage() is called for every message of every handler
        if self.failure is not None:
            raise self.failure
        self.staged += units
        if not self.running:
            self.start()
        return self.staged

    def start(self) -> None:
        """Start the committer for the work counted; only when none runs (``running`` is false)."""
        self.running = True
        assert self._spawn is not None, "a pipeline without spawn is led by its callers: stage_and_lead"
        self._spawn(self._commit)

    async def stage_and_lead(self, units: int = 1) -> None:
        """Count ``units`` the caller staged; if no committer runs, the caller's task becomes it.

        The caller then confirms and lands its own work, and whatever is
        staged meanwhile, before it returns; otherwise it returns at once and
        the running committer takes the work. Work that waits for its
        predecessor's confirmation (a chain of nodes) so costs no task of its own.
        """
        if self._accept(units):
            await self._commit()

    def _accept(self, units: int) -> bool:
        """Count accepted work (or raise the failure); whether the caller must start the committer."""
        if self.failure is not None:
            raise self.failure
        self.staged += units
        if self.running:
            return False
        self.running = True
        return True

    async def wait(self, mark: int) -> None:
        """Wait until the work counted up to ``mark`` landed; raises the failure if it never will."""
        while self.landed < mark:
            if self.failure is not None:
                raise self.failure
            await self._progress.wait()

    async def drain(self) -> None:
        """Wait until everything staged so far landed."""
        await self.wait(self.staged)

    async def wait_progress(self) -> None:
        """Wait until the next batch lands or fails."""
        await self._progress.wait()

    async def _commit(self) -> None:
        try:
            # Shielded from its start: work counted by stage() was accepted, so it is
            # confirmed (or fails) even when the caller's scope is cancelled meanwhile.
            with anyio.CancelScope(shield=True):
                cut_through = self.landed
                landed_one = False
                while self.staged > cut_through and self.failure is None:
                    if landed_one:  # let what the landing set off be staged into this batch
                        for _ in range(SETTLE_STEPS):
                            await anyio.lowlevel.checkpoint()
                    landed_one = True
                    cut_through = self.staged
                    batch = self._cut()
                    if self._units is not None:
                        cut_through = self.landed + self._units(batch)
                    self.confirming = True
                    try:
                        if self._context is None:
                            await self._confirm(batch)
                        else:
                            await call_in_context(self._context(batch), self._confirm, batch)
                    except Exception as exc:
                        self.failure = self._fail(batch, exc)
                    except BaseException as exc:
                        self.failure = self._fail(batch, _stopped(exc))
                        if not is_fault(exc, shielded=True):  # the process is going down mid-call
                            raise
                        # a cancellation the store raised itself: a failure of the store, latched
                    else:
                        self.landed = cut_through
                        self._land(batch)
                    finally:
                        self.confirming = False
                        self._wake()
        except BaseException as exc:
            if self.failure is None:  # landing broke: nothing staged after it is confirmed here
                self.failure = self._fail(self._cut(), _stopped(exc))
                self._wake()
            raise
        finally:
            self.running = False
        if self.failure is not None and self._surface:
            raise self.failure

    def _wake(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()


def _stopped(exc: BaseException) -> CheckpointError:
    error = CheckpointError(f"confirmations stopped by {type(exc).__qualname__}; recover from the ledger")
    error.__cause__ = exc
    return error
