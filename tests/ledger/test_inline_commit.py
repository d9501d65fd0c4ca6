"""A lone write commits on the loop's own thread when nothing else is ready to run (``ledger/_committer.py``).

It saves the two wake-ups between the loop and the writer thread; the loop's
other tasks wait at most one commit for it, and a disk that commits slowly
has its commits made on the writer thread again.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import lmdb
import pytest
import sniffio

import ledger._committer as committer
from ledger import LedgerEnv
from ledger._committer import INLINE_LIMIT
from ledger.lmdb._commit import CommitElsewhere, on_the_loop

Write = Callable[[lmdb.Transaction], Any]


@asynccontextmanager
async def served(path: Path) -> AsyncIterator[LedgerEnv]:
    env = LedgerEnv.open(path)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(env.serve)
            try:
                yield env
            finally:
                env.stop_serving()
    finally:
        env.close()


def put(env: LedgerEnv, key: bytes, seen: list[str], *, pause: float = 0.0) -> Write:
    """A write of ``key`` that notes the thread it ran on (and takes ``pause`` seconds: a slow disk)."""
    db = env.db("messages")

    def fn(txn: lmdb.Transaction) -> bool:
        seen.append(threading.current_thread().name)
        if pause:
            time.sleep(pause)
        return bool(txn.put(key, b"v", db=db))

    return fn


def stored(env: LedgerEnv) -> list[bytes]:
    with env.read() as txn:
        return [bytes(key) for key, _ in txn.cursor(db=env.db("messages"))]


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """However slow this machine's disk is today, the loop's thread keeps committing lone writes."""
    monkeypatch.setattr(committer, "INLINE_LIMIT", 60.0)


@contextmanager
def always_ready() -> Iterator[None]:
    """A function on the loop that queues itself again each time it runs: the loop is never idle."""
    running = [True]
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel

        soon: Callable[[Callable[[], None]], object] = trio.lowlevel.current_trio_token().run_sync_soon
    else:
        soon = asyncio.get_running_loop().call_soon

    def again() -> None:
        if running[0]:
            soon(again)

    soon(again)
    try:
        yield
    finally:
        running[0] = False


@pytest.mark.usefixtures("patient")
async def test_a_lone_write_on_an_idle_loop_commits_on_the_loops_thread(tmp_path: Path) -> None:
    seen: list[str] = []
    async with served(tmp_path / "l") as env:
        for i in range(3):
            assert await env.write(put(env, b"k%d" % i, seen)) is True
        assert seen == [threading.current_thread().name] * 3
        assert stored(env) == [b"k0", b"k1", b"k2"]


@pytest.mark.usefixtures("patient")
async def test_a_write_while_the_loop_has_other_work_commits_on_the_writer_thread(tmp_path: Path) -> None:
    seen: list[str] = []
    async with served(tmp_path / "l") as env:
        with always_ready():
            for i in range(3):
                await env.write(put(env, b"k%d" % i, seen))
        assert all(name.startswith("streamledger-writer") for name in seen), seen
        assert stored(env) == [b"k0", b"k1", b"k2"]


@pytest.mark.usefixtures("patient")
async def test_a_write_while_a_timer_is_due_before_its_commit_would_end_commits_on_the_writer_thread(
    tmp_path: Path,
) -> None:
    seen: list[str] = []
    async with served(tmp_path / "l") as env, anyio.create_task_group() as tg:
        await env.write(put(env, b"slow", seen, pause=0.2))  # the commits take 0.2 s, judging by this one
        tg.start_soon(anyio.sleep, 0.05)  # due before the next commit would end
        await anyio.lowlevel.checkpoint()
        await env.write(put(env, b"beside", seen))
        tg.cancel_scope.cancel()
    assert seen[0] == threading.current_thread().name
    assert seen[1].startswith("streamledger-writer")


@pytest.mark.usefixtures("patient")
async def test_a_write_that_asks_to_commit_elsewhere_is_made_on_the_writer_thread(tmp_path: Path) -> None:
    """What would hold the loop long (a keyed log's merge) asks to move; nothing of it stays written."""
    seen: list[str] = []
    async with served(tmp_path / "l") as env:
        db = env.db("messages")

        def fn(txn: lmdb.Transaction) -> str:
            seen.append(threading.current_thread().name)
            txn.put(b"k", b"v", db=db)
            if on_the_loop():
                raise CommitElsewhere
            return "made"

        assert await env.write(fn) == "made"
        assert seen[0] == threading.current_thread().name
        assert seen[1].startswith("streamledger-writer")
        assert stored(env) == [b"k"]


@pytest.mark.usefixtures("patient")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timer_is_seen_after_asyncio_rebuilt_its_timer_heap(tmp_path: Path) -> None:
    """asyncio replaces its heap of timers when most are cancelled: the committer asks for it afresh."""
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    async with served(tmp_path / "l") as env, anyio.create_task_group() as tg:
        await env.write(put(env, b"slow", seen, pause=0.2))  # the commits take 0.2 s, judging by this one
        timers = [loop.call_later(3600, lambda: None) for _ in range(300)]
        for timer in timers[:250]:
            timer.cancel()
        heap = loop._scheduled  # type: ignore[attr-defined]
        await anyio.lowlevel.checkpoint()  # the loop's step rebuilds it
        assert loop._scheduled is not heap  # type: ignore[attr-defined]
        tg.start_soon(anyio.sleep, 0.05)  # due before the next commit would end
        await anyio.lowlevel.checkpoint()
        await env.write(put(env, b"beside", seen))
        tg.cancel_scope.cancel()
        for timer in timers:
            timer.cancel()
    assert seen[1].startswith("streamledger-writer")


async def test_writes_submitted_together_commit_on_the_writer_thread(tmp_path: Path) -> None:
    seen: list[str] = []
    async with served(tmp_path / "l") as env:
        tickets = [env.submit(put(env, b"k%d" % i, seen)) for i in range(3)]
        for ticket in tickets:
            assert await ticket.wait() is True
        assert all(name.startswith("streamledger-writer") for name in seen)


async def test_a_ticker_runs_between_any_two_slow_commits_and_a_slow_disk_goes_back_to_the_thread(
    tmp_path: Path,
) -> None:
    """The loop's other tasks wait at most one commit, never a queue of them."""
    pause = 5 * INLINE_LIMIT  # a disk slower than the loop's thread commits for
    events: list[str] = []
    seen: list[str] = []
    async with served(tmp_path / "l") as env, anyio.create_task_group() as tg:
        ticking = True

        async def ticker() -> None:
            while ticking:
                events.append("tick")
                await anyio.sleep(pause / 10)

        def slow(key: bytes) -> Write:
            inner = put(env, key, seen, pause=pause)

            def fn(txn: lmdb.Transaction) -> bool:
                events.append("commit")
                return bool(inner(txn))

            return fn

        tg.start_soon(ticker)
        for i in range(4):
            await env.write(slow(b"k%d" % i))
        ticking = False
    commits = [i for i, event in enumerate(events) if event == "commit"]
    assert len(commits) == 4
    for before, after in itertools.pairwise(commits):
        assert "tick" in events[before:after], events
    # the first found the disk slow; the loop's thread commits no more until the disk is quick again
    assert all(name.startswith("streamledger-writer") for name in seen[1:]), seen


async def test_the_loops_thread_commits_again_once_the_disk_is_quick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "INLINE_LIMIT", 0.25)
    seen: list[str] = []
    async with served(tmp_path / "l") as env:
        await env.write(put(env, b"slow", seen, pause=0.3))
        await env.write(put(env, b"quick", seen))  # timed on the writer thread: quick
        await env.write(put(env, b"here", seen))
    loop_thread = threading.current_thread().name
    assert seen[0] == loop_thread
    assert seen[1].startswith("streamledger-writer")
    assert seen[2] == loop_thread


class Stop(BaseException):
    """What a signal's handler may raise on the main thread between two bytecodes."""


def counting(env: LedgerEnv, runs: list[str], *, stop_first: bool) -> Write:
    """A write that adds one to a count (made twice, it would count two), stopped on its first run."""
    db = env.db("messages")

    def fn(txn: lmdb.Transaction) -> int:
        runs.append(threading.current_thread().name)
        count = int(txn.get(b"count", b"0", db=db)) + 1
        txn.put(b"count", b"%d" % count, db=db)
        if stop_first and len(runs) == 1:
            raise Stop
        return count

    return fn


@pytest.mark.usefixtures("patient")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_commit_on_the_loop_cut_short_by_a_handlers_exception_is_still_made_once(
    tmp_path: Path,
) -> None:
    """Before its transaction committed, the batch goes to the writer thread; after, its answer lands."""
    caught: list[BaseException] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda loop, context: caught.append(context["exception"]))
    runs: list[str] = []
    async with served(tmp_path / "l") as env:
        assert await env.write(counting(env, runs, stop_first=True)) == 1
        assert runs[0] == threading.current_thread().name  # cut short on the loop
        assert runs[1].startswith("streamledger-writer")  # made on the writer thread

        def stop_once(handed: float, began: float, ended: float) -> None:
            env.batch_timer = None
            raise Stop  # after the commit, before its answer landed

        env.batch_timer = stop_once
        assert await env.write(counting(env, runs, stop_first=False)) == 2
        assert await env.write(counting(env, runs, stop_first=False)) == 3  # the committer goes on
        with env.read() as txn:
            assert txn.get(b"count", db=env.db("messages")) == b"3"
    assert [type(exc) for exc in caught] == [Stop, Stop]  # and the exceptions went on their way


@pytest.mark.usefixtures("patient")
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_trio_a_commit_cut_short_is_made_once_and_the_exception_ends_serving(tmp_path: Path) -> None:
    runs: list[str] = []
    env = LedgerEnv.open(tmp_path / "l")
    try:
        with pytest.raises(BaseExceptionGroup) as raised:
            async with anyio.create_task_group() as tg:
                await tg.start(env.serve)
                assert await env.write(counting(env, runs, stop_first=True)) == 1
        assert raised.group_contains(Stop)
        assert len(runs) == 2 and runs[1].startswith("streamledger-writer")
        with env.read() as txn:
            assert txn.get(b"count", db=env.db("messages")) == b"1"
    finally:
        env.close()
