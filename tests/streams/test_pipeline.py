"""The confirmation pipeline on its own: stage, confirm, land, wake (streams._pipeline)."""

from __future__ import annotations

import contextvars

import anyio
import pytest

from streams import CheckpointError
from streams._pipeline import ConfirmPipeline, Spawn

pytestmark = pytest.mark.anyio


class Recorder:
    """A pipeline over a list of ints: what was confirmed and landed, batch by batch."""

    def __init__(self, spawn: Spawn | None) -> None:
        self.buffer: list[int] = []
        self.confirmed: list[list[int]] = []
        self.landed: list[list[int]] = []
        self.failed: list[list[int]] = []
        self.gate: anyio.Event | None = None  # a confirmation waits for it when set
        self.entered = anyio.Event()  # a confirmation is in the store
        self.refuse: BaseException | None = None
        self.pipeline: ConfirmPipeline[list[int]] = ConfirmPipeline(
            cut=self.cut, confirm=self.confirm, land=self.landed.append, fail=self.fail, spawn=spawn
        )

    def cut(self) -> list[int]:
        batch, self.buffer = self.buffer, []
        return batch

    async def confirm(self, batch: list[int]) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse is not None:
            raise self.refuse
        self.confirmed.append(batch)
        await anyio.lowlevel.checkpoint()

    def fail(self, batch: list[int], exc: Exception) -> CheckpointError:
        self.failed.append(batch)
        return exc if isinstance(exc, CheckpointError) else CheckpointError(f"refused: {exc}")

    def stage(self, *values: int) -> int:
        self.buffer.extend(values)
        return self.pipeline.stage(len(values))


async def test_work_staged_while_a_batch_is_in_the_store_leaves_with_the_next_in_order() -> None:
    async with anyio.create_task_group() as tg:
        r = Recorder(tg.start_soon)
        r.gate = anyio.Event()
        r.stage(1)
        await r.entered.wait()  # the committer took [1] and waits in the store
        r.stage(2)
        mark = r.stage(3, 4)
        assert r.pipeline.in_flight == 4 and r.landed == []
        r.gate.set()
        await r.pipeline.wait(mark)
    assert r.confirmed == [[1], [2, 3, 4]] and r.landed == r.confirmed
    assert r.pipeline.landed == r.pipeline.staged == 4 and r.pipeline.in_flight == 0


async def test_work_a_landing_sets_off_leaves_with_what_was_staged_while_the_batch_was_in_the_store() -> None:
    async with anyio.create_task_group() as tg:
        r = Recorder(tg.start_soon)
        r.gate = anyio.Event()
        first = r.stage(1)
        await r.entered.wait()  # the committer took [1] and waits in the store
        r.stage(2)

        async def react() -> None:  # like a reader of what [1] published: it stages once [1] landed
            await r.pipeline.wait(first)
            r.stage(3)

        tg.start_soon(react)
        await anyio.wait_all_tasks_blocked()
        r.gate.set()
    # the committer let the landing's waiters run before it cut [2]: 3 joined it, not a batch of its own
    assert r.confirmed == [[1], [2, 3]] and r.landed == r.confirmed


async def test_a_refused_batch_fails_its_waiters_and_the_pipeline_takes_nothing_more() -> None:
    async with anyio.create_task_group() as tg:
        r = Recorder(tg.start_soon)
        r.refuse = ValueError("no")
        mark = r.stage(1, 2)
        with pytest.raises(CheckpointError, match="refused: no"):
            await r.pipeline.wait(mark)
        with pytest.raises(CheckpointError, match="refused: no"):
            r.stage(3)
    assert r.failed == [[1, 2]] and r.landed == [] and r.pipeline.landed == 0


async def test_a_surfacing_pipeline_fails_the_task_group_it_runs_in_even_with_no_waiter() -> None:
    with pytest.raises(ExceptionGroup) as caught:
        async with anyio.create_task_group() as tg:
            r = Recorder(tg.start_soon)
            r.pipeline = ConfirmPipeline(
                cut=r.cut,
                confirm=r.confirm,
                land=r.landed.append,
                fail=r.fail,
                spawn=tg.start_soon,
                surface=True,
            )
            r.refuse = ValueError("no")
            r.stage(1)
    assert caught.group_contains(CheckpointError, match="refused: no")


async def test_the_caller_that_stages_into_an_idle_pipeline_confirms_and_lands_it_itself() -> None:
    r = Recorder(None)
    r.buffer.append(1)
    await r.pipeline.stage_and_lead()
    assert r.landed == [[1]]  # landed before stage_and_lead returned, with no task of its own
    r.gate = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def lead() -> None:
            r.buffer.append(2)
            await r.pipeline.stage_and_lead()

        r.entered = anyio.Event()
        tg.start_soon(lead)
        await r.entered.wait()  # the leader is in the store with [2]
        r.buffer.append(3)
        await r.pipeline.stage_and_lead()  # a committer runs: this returns at once
        assert r.landed == [[1]]
        r.gate.set()
    assert r.landed == [[1], [2], [3]]  # the leader took what was staged meanwhile


async def test_accepted_work_is_confirmed_even_when_the_stager_is_cancelled() -> None:
    r = Recorder(None)
    r.gate = anyio.Event()
    with anyio.CancelScope() as scope:

        async def release() -> None:
            await r.entered.wait()
            scope.cancel()  # cancel the leader while it is in the store
            assert r.gate is not None
            r.gate.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(release)
            r.buffer.append(1)
            await r.pipeline.stage_and_lead()
    assert r.landed == [[1]]


async def test_a_process_dying_mid_confirmation_fails_the_waiters_before_it_unwinds() -> None:
    class Died(BaseException):
        pass

    r = Recorder(None)
    r.refuse = Died()
    r.buffer.append(1)
    with pytest.raises(Died):
        await r.pipeline.stage_and_lead()
    assert r.failed == [[1]]
    with pytest.raises(CheckpointError, match=r"stopped by .*Died"):
        await r.pipeline.drain()  # never a wait for a committer that is gone


async def test_a_cut_that_takes_a_part_leaves_the_rest_to_the_next_batch_and_counts_what_it_took() -> None:
    r = Recorder(None)

    def odd_first() -> list[int]:  # the oldest unit's kind, then the other
        kind = r.buffer[0] % 2
        batch = [v for v in r.buffer if v % 2 == kind]
        r.buffer = [v for v in r.buffer if v % 2 != kind]
        return batch

    r.pipeline = ConfirmPipeline(
        cut=odd_first, confirm=r.confirm, land=r.landed.append, fail=r.fail, units=len
    )
    r.buffer.extend([1, 2, 3, 4])
    await r.pipeline.stage_and_lead(4)
    assert r.landed == [[1, 3], [2, 4]] and r.pipeline.landed == 4 and r.pipeline.in_flight == 0


async def test_each_batch_is_confirmed_in_the_context_its_caller_gives_for_it() -> None:
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")
    contexts: dict[str, contextvars.Context] = {}
    for name in ("a", "b"):
        contexts[name] = contextvars.copy_context()
        contexts[name].run(tenant.set, name)
    seen: list[str] = []
    buffer: list[str] = []

    def cut() -> list[str]:
        batch = buffer[:1]
        del buffer[:1]
        return batch

    async def confirm(batch: list[str]) -> None:
        await anyio.lowlevel.checkpoint()
        seen.append(tenant.get())

    pipeline: ConfirmPipeline[list[str]] = ConfirmPipeline(
        cut=cut,
        confirm=confirm,
        land=lambda _: None,
        fail=lambda _, exc: CheckpointError(str(exc)),
        context=lambda batch: contexts[batch[0]],
        units=len,
    )
    buffer.extend(["b", "a"])
    await pipeline.stage_and_lead(2)
    assert seen == ["b", "a"] and tenant.get() == "none"
