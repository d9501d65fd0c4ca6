"""A stateful model test of group members on PostgreSQL: members join, leave, die and are taken over
while a writer appends and restarts, against a list of values and their totals per partition.

:class:`MemberMachine` appends values to the partitioned stream of
:mod:`tests.ledger.partition_machine` (its adder fails a multiple of 7 once,
so budgets are shared by whichever member handles it), and runs members
(``ledger.postgres.consume``) in the background: a member joins; leaves
(giving its partitions up); dies (its rows stay, as a killed process's do,
until a later step lets them run out); stalls past its leases and has them
taken over while it runs on (a zombie, whose commits must be refused); the
writer restarts (its reopen
raises the partitions' generations: the members follow them again).

At every step, each partition's keyed totals are the model's totals over a
prefix of the partition's values, the one its frontier names (read before
and after the totals: the members go on meanwhile). At the end the stream
is finished, a member kept alive, the dead's rows run out, and once every
partition is done each total is exact: nothing lost, nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
import sniffio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger.postgres import consume, open_postgres
from streams import PartitionedStream, StreamRef, open_scope
from streams.store import StreamRead, type_name

from ..pg_server import new_ledger_url
from .partition_machine import NUMBERS, PARTITIONS, TOTALS, add, key_of, open_numbers, partition_of
from .stateful import send_from

#: Short leases, so that a dead member's partitions are taken over within a step or two.
LEASE_SECONDS = 1.0


class _Running:
    """A member running in the background: its task's scope, and whether it died (rows left behind)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.scope = anyio.CancelScope()
        self.ended = anyio.Event()
        self.error: BaseException | None = None  # how it failed, if it did


class MemberMachine(RuleBasedStateMachine):
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal(self.backend)
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self._tasks_now = self.portal.call(_task_lister)  # for a teardown whose tasks do not end
        self.url = new_ledger_url()
        self.values: list[int] = []
        self.members: dict[str, _Running] = {}
        self.dead: list[str] = []
        self.joined = 0
        self.done: set[int] = set()
        self.done_changed: anyio.Event | None = None
        self.writer_session: contextlib.ExitStack | None = None
        self._open_writer()

    # -- the writer --------------------------------------------------------------------------

    def _open_writer(self) -> None:
        session = contextlib.ExitStack()
        ledger = session.enter_context(self.portal.wrap_async_context_manager(open_postgres(self.url)))
        scope = session.enter_context(
            self.portal.wrap_async_context_manager(open_scope(ledger.streams, scope="pm"))
        )
        self.numbers: PartitionedStream[int] = self.portal.call(open_numbers, scope)
        self.writer_session = session

    @rule(k=st.integers(1, 25))
    def append(self, k: int) -> None:
        first = len(self.values) + 1
        values = list(range(first, first + k))
        self.portal.call(send_from, self.numbers, values, first)
        self.values.extend(values)

    @rule()
    def restart_writer(self) -> None:
        """The writer's process restarts: its reopen raises every partition's generation."""
        assert self.writer_session is not None
        self.writer_session.close()
        self._open_writer()

    # -- members -----------------------------------------------------------------------------

    def _report(self, partition: int, event: str) -> None:
        if event == "done":
            self.done.add(partition)
            if self.done_changed is not None:
                self.done_changed.set()

    @precondition(lambda self: len(self.members) < 3)
    @rule()
    def join(self) -> None:
        self.joined += 1
        running = self.portal.call(_Running, f"m{self.joined}")  # its scope and event are the loop's
        self.members[running.name] = running

        async def run() -> None:
            try:
                with running.scope:
                    await consume(
                        self.url,
                        NUMBERS,
                        add,
                        scope="pm",
                        node="src",
                        partitions=PARTITIONS,
                        group="adder",
                        keyed=TOTALS,
                        attempts=2,
                        owner=running.name,
                        lease_seconds=LEASE_SECONDS,
                        poll_seconds=0.02,
                        until_done=False,
                        report=self._report,
                    )
            except Exception as exc:  # a member fails only if something is wrong: the invariant says so
                running.error = exc
            finally:
                running.ended.set()

        self.portal.start_task_soon(run)

    def _stop(self, name: str) -> None:
        running = self.members.pop(name)
        assert running.error is None, (running.name, running.error)

        async def stop() -> None:
            running.scope.cancel()
            await running.ended.wait()

        self.portal.call(stop)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        self._stop(data.draw(st.sampled_from(sorted(self.members))))

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        """A member killed: its rows stay behind until they run out (``bury``)."""
        name = data.draw(st.sampled_from(sorted(self.members)))
        with psycopg.connect(self.url, autocommit=True) as conn:
            member = conn.execute("SELECT * FROM streamledger_members WHERE member = %s", (name,)).fetchall()
            leases = conn.execute(
                "SELECT * FROM streamledger_partition_leases WHERE owner = %s", (name,)
            ).fetchall()
        self._stop(name)  # it left (a killed process would not): its rows are put back as they were
        with psycopg.connect(self.url, autocommit=True) as conn:
            for row in member:
                conn.execute("INSERT INTO streamledger_members VALUES (%s, %s, %s, %s)", row)
            for row in leases:
                conn.execute(
                    "INSERT INTO streamledger_partition_leases VALUES (%s, %s, %s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    row,
                )
        self.dead.append(name)

    @precondition(lambda self: self.members)
    @rule(data=st.data())
    def steal(self, data: st.DataObject) -> None:
        """A member stalls past its leases and another takes them over: it runs on, a zombie.

        Its lease rows get a new token (as a claim after its row ran out gives them), held by
        nobody alive, so the live members claim them next. Every commit the zombie still makes
        there must be refused, and it must notice and let go.
        """
        name = data.draw(st.sampled_from(sorted(self.members)))
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE streamledger_partition_leases SET owner = 'thief', token = token + 1"
                " WHERE owner = %s",
                (name,),
            )

    @precondition(lambda self: self.dead)
    @rule()
    def bury(self) -> None:
        """The dead's rows run out (their lease time passes): their leases with them."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            for name in self.dead:
                conn.execute(
                    "UPDATE streamledger_members SET expires_at = now() - interval '1 s' WHERE member = %s",
                    (name,),
                )
        self.dead.clear()

    # -- what the ledger holds -----------------------------------------------------------------

    def _read(self) -> list[tuple[int, dict[int, int]]]:
        """Per partition: its group's frontier, then its keyed totals."""

        async def read() -> list[tuple[int, dict[int, int]]]:
            seen = []
            async with open_postgres(self.url) as ledger:
                for p in range(PARTITIONS):
                    ref = StreamRef("pm", "src", f"numbers#{p}")
                    request = StreamRead(ref, type_name(int), ("adder",), PARTITIONS)
                    opened = await ledger.backend.streams.read_stream(request)
                    assert opened is not None
                    totals = await TOTALS.items(ledger.streams, ref, "adder", limit=1000)
                    seen.append((opened.groups[0].acked_through, dict(totals)))
            return seen

        return self.portal.call(read)

    def _partition_values(self) -> list[list[int]]:
        parts: list[list[int]] = [[] for _ in range(PARTITIONS)]
        for value in self.values:
            parts[partition_of(value)].append(value)
        return parts

    @invariant()
    def no_member_failed(self) -> None:
        for running in self.members.values():
            assert running.error is None, (running.name, running.error)

    @invariant()
    def totals_are_those_of_a_prefix(self) -> None:
        before = self._read()
        after = self._read()
        for p, values in enumerate(self._partition_values()):
            (low, totals), (high, _) = before[p], after[p]  # totals read between the two frontiers
            prefixes = [_totals(values[:f]) for f in range(low, high + 1)]
            assert any(totals == prefix for prefix in prefixes), (p, low, high, totals)

    def teardown(self) -> None:
        try:
            if self.writer_session is not None:
                self.portal.call(self.numbers.writer().finish)
                self.bury()
                if not self.members:
                    self.join()

                async def all_done() -> None:
                    with anyio.fail_after(60):
                        while len(self.done) < PARTITIONS:
                            self.done_changed = anyio.Event()
                            await self.done_changed.wait()

                self.portal.call(all_done)
                for p, values in enumerate(self._partition_values()):
                    frontier, totals = self._read()[p]
                    assert frontier == len(values) and totals == _totals(values), (p, frontier, totals)
        finally:
            for name in list(self.members):
                self._stop(name)
            if self.writer_session is not None:
                self.writer_session.close()
            self._exit_portal()

    def _exit_portal(self) -> None:
        """Stop the portal once its tasks ended; a task left running fails the test, named, not hangs it."""
        ended = threading.Event()

        def exit_portal() -> None:
            try:
                self._portal_cm.__exit__(None, None, None)
            finally:
                ended.set()

        threading.Thread(target=exit_portal, daemon=True).start()
        if not ended.wait(120):
            raise AssertionError(f"tasks still running after every member stopped: {self._tasks_now()}")


def _task_lister() -> Callable[[], list[str]]:
    """On the portal's loop: a function any thread may call to list that loop's tasks and where they wait."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel

        token, root = trio.lowlevel.current_trio_token(), trio.lowlevel.current_root_task()

        def trio_tasks() -> list[str]:
            found: list[str] = []

            def walk(task: Any) -> None:
                frame = task.coro.cr_frame
                found.append(
                    f"{task.name} at {frame.f_code.co_name}:{frame.f_lineno}" if frame else task.name
                )
                for nursery in task.child_nurseries:
                    for child in nursery.child_tasks:
                        walk(child)

            done = threading.Event()

            def list_them() -> None:
                walk(root)
                done.set()

            token.run_sync_soon(list_them)
            done.wait(10)
            return found

        return trio_tasks
    loop = asyncio.get_running_loop()

    def asyncio_tasks() -> list[str]:
        future = asyncio.run_coroutine_threadsafe(_asyncio_tasks(), loop)
        return future.result(10)

    return asyncio_tasks


async def _asyncio_tasks() -> list[str]:
    return [
        f"{task.get_name()} at {stack[-1].f_code.co_name}:{stack[-1].f_lineno}"
        if (stack := task.get_stack())
        else task.get_name()
        for task in asyncio.all_tasks()
    ]


def _totals(values: list[int]) -> dict[int, int]:
    totals: Counter[int] = Counter()
    for value in values:
        totals[key_of(value)] += value
    return dict(totals)
