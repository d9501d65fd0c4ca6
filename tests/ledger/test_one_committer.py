"""One group committer shape for both backends (ledger._committer): how a failure reaches its callers.

Each test runs on an LMDB ledger and on a PostgreSQL one, through the same
stream hooks, with a fault hook on the committer's writer thread that holds
a batch in flight or fails it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import Ledger, LmdbBackend, WriteFailedError
from ledger._committer import GroupCommitter
from ledger.lmdb._env import LedgerEnv
from streams import StaleGenerationError, StreamRef
from streams.store import ATTR, SPAN, AppendBatch, StreamOpen, single_error

pytestmark = pytest.mark.anyio

REF = StreamRef("s", "src", "numbers")
OTHER = StreamRef("s", "src", "other")
BACKENDS = ["lmdb", "postgres"]


class Gate:
    """A fault hook that holds the writer thread in a batch until released, and can fail batches."""

    def __init__(self) -> None:
        self.holding = False
        self.held = threading.Event()  # the writer thread waits in a batch
        self.release = threading.Event()
        self.failure: Exception | None = None

    def __call__(self, writes: int) -> None:
        if self.holding:
            self.holding = False
            self.held.set()
            self.release.wait(10)
        if self.failure is not None:
            raise self.failure

    async def hold(self) -> None:
        """Make the next batch wait on the writer thread until :meth:`let_go`."""
        self.held.clear()
        self.release.clear()
        self.holding = True

    async def in_flight(self) -> None:
        """Wait until the writer thread holds a batch (off the event loop)."""
        await anyio.to_thread.run_sync(self.held.wait, 10)

    def let_go(self) -> None:
        self.release.set()


@asynccontextmanager
async def serving(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, gate: Gate
) -> AsyncIterator[Any]:
    """A ledger of ``backend`` served with ``gate`` as its committer's fault hook."""
    serve: Callable[..., Any]
    if backend == "lmdb":
        env = LedgerEnv.open(tmp_path / "l")
        ledger: Any = Ledger(LmdbBackend(env))
        serve, stop, close = env.serve, env.stop_serving, env.close
    else:
        from ledger.postgres._ledger import PgBackend
        from ledger.postgres._store import PgConnection

        connection = PgConnection(request.getfixturevalue("postgres_url"))
        await anyio.to_thread.run_sync(connection.connect)
        ledger = Ledger(PgBackend(connection))
        serve, stop, close = connection.serve, connection.stop_serving, connection.close
    try:
        with single_error():
            async with anyio.create_task_group() as tg:
                await tg.start(partial(serve, before_commit=gate))
                try:
                    yield ledger
                finally:
                    stop()
    finally:
        close()


def committer_of(ledger: Any) -> GroupCommitter[Any]:
    backend = ledger.backend
    owner: Any = backend.env if isinstance(backend, LmdbBackend) else backend.connection
    committer: GroupCommitter[Any] = owner._committer
    return committer


async def appended(ledger: Any, ref: StreamRef = REF) -> int:
    reopened = await ledger.streams.open(StreamOpen(ref, "int", 16, ("a",), resumable=True))
    count: int = reopened.appended
    return count


@pytest.mark.parametrize("backend", BACKENDS)
async def test_both_backends_commit_through_the_one_group_committer(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, spans: InMemorySpanExporter
) -> None:
    async with serving(backend, tmp_path, request, Gate()) as ledger:
        assert isinstance(committer_of(ledger), GroupCommitter)
        await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
    [batch] = [span for span in spans.get_finished_spans() if span.name == SPAN.COMMIT_BATCH]
    assert batch.attributes is not None
    assert batch.attributes[ATTR.BATCH_WRITES] == 1 and batch.attributes[ATTR.BATCH_FAILED] == 0


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_refused_write_fails_alone_and_the_others_of_its_batch_commit(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, spans: InMemorySpanExporter
) -> None:
    gate = Gate()
    async with serving(backend, tmp_path, request, gate) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        results: dict[str, str] = {}

        async def append() -> None:
            await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01", b"\x02")))
            results["append"] = "ok"

        async def stale() -> None:
            try:
                await ledger.streams.append(AppendBatch(REF, opened.generation + 5, 3, (b"\x09",)))
            except StaleGenerationError:
                results["stale"] = "refused"

        async def other() -> None:
            await ledger.streams.open(StreamOpen(OTHER, "int", 16, ("a",)))
            results["other"] = "ok"

        spans.clear()
        async with anyio.create_task_group() as tg:
            for call in (append, stale, other):  # made in one step of the loop: one batch
                tg.start_soon(call)
        assert results == {"append": "ok", "stale": "refused", "other": "ok"}
        assert await appended(ledger) == 2
    [shared] = [
        span
        for span in spans.get_finished_spans()
        if span.name == SPAN.COMMIT_BATCH and span.attributes and span.attributes[ATTR.BATCH_WRITES] == 3
    ]
    assert shared.attributes is not None and shared.attributes[ATTR.BATCH_FAILED] == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_batch_that_cannot_commit_answers_each_write_and_the_ledger_takes_no_more(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    gate = Gate()
    answers: dict[str, BaseException] = {}
    with pytest.raises(WriteFailedError, match="the disk is gone"):
        async with serving(backend, tmp_path, request, gate) as ledger:
            await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
            await gate.hold()
            gate.failure = WriteFailedError("the disk is gone")

            async def open_other(which: str) -> None:
                try:
                    await ledger.streams.open(StreamOpen(OTHER, "int", 16, ("a",)))
                except WriteFailedError as exc:
                    answers[which] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(open_other, "in the batch")
                await gate.in_flight()
                tg.start_soon(open_other, "queued behind it")
                await anyio.wait_all_tasks_blocked()
                gate.let_go()
    assert str(answers["in the batch"]) == "the disk is gone"
    assert "stopped serving writes after a failed batch" in str(answers["queued behind it"])
    async with serving(backend, tmp_path, request, Gate()) as reopened:  # nothing of the failed batch
        opened = await reopened.streams.open(StreamOpen(OTHER, "int", 16, ("a",), resumable=True))
        assert opened.created


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_write_cancelled_before_its_batch_left_is_never_made(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    gate = Gate()
    async with serving(backend, tmp_path, request, gate) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        await gate.hold()
        committer = committer_of(ledger)
        scope = anyio.CancelScope()

        async def append() -> None:
            with scope:
                await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01",)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ledger.streams.open, StreamOpen(OTHER, "int", 16, ("a",)))  # holds the writer
            await gate.in_flight()
            tg.start_soon(append)
            await anyio.wait_all_tasks_blocked()
            assert len(committer._pending) == 1  # waiting for the next batch
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert scope.cancelled_caught
            assert committer._pending == []  # withdrawn before it left
            gate.let_go()
        assert await appended(ledger) == 0


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_write_cancelled_after_its_batch_left_runs_to_its_end(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    gate = Gate()
    async with serving(backend, tmp_path, request, gate) as ledger:
        opened = await ledger.streams.open(StreamOpen(REF, "int", 16, ("a",)))
        await gate.hold()
        with anyio.CancelScope() as scope:

            async def cancel_once_in_flight() -> None:
                await gate.in_flight()
                scope.cancel()  # its batch is with the writer thread
                gate.let_go()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_in_flight)
                await ledger.streams.append(AppendBatch(REF, opened.generation, 1, (b"\x01",)))
        assert scope.cancelled_caught
        assert await appended(ledger) == 1
