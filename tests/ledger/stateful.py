"""The ledger's stateful model tests: the real stack against a tiny model, with crashes.

:class:`LedgerMachine` appends messages, handles them (succeeding, failing,
stopping), acks another group's messages out of order, loses commits (before
and after the store confirmed them) and crashes and reopens the ledger.
After every step the store must agree with the model: contiguous sequences,
a contiguous frontier, one transaction per message (the state is the sum of
exactly the acknowledged messages, each produced one output, and the keyed
state holds per key the sum of exactly those, with deletes), budgets that
never refill and generations raised on every open. A failed attempt puts
its keys before it raises: none of that may reach the ledger.

:class:`LockstepMachine` drives ``MemoryStore``, the LMDB ledger and the
PostgreSQL ledger with the same rules and, after every step, requires the
three to agree on everything the endpoints show: the reference store and
the durable ones cannot drift.

``fuzz/`` runs these same machines for longer. Nothing is caught that a
rule does not mean to catch.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger import open_ledger
from ledger.postgres import open_postgres
from streams import (
    CheckpointError,
    Key,
    KeyedState,
    ManagedStream,
    MemoryStore,
    MessageExhaustedError,
    MessageTx,
    Stream,
    StreamHooks,
    handle_messages,
    open_scope,
)
from streams.store import KeyedRange, key_to_plain, live_payload
from streams.testing import FaultyHooks

from ..pg_server import new_ledger_url

NUMBERS = Key("numbers", Stream[int])
SUMS = Key("sums", Stream[int])
ATTEMPTS = 2
#: A value fails on every attempt below ``value % 3``: 0 never fails, 2 exhausts a budget of 2.
FAILING = 3
#: A value that stops the handler after it is confirmed.
STOP = 13
#: The adder's keyed state: per key ``value % KEYS`` the sum of its values, deleted by a multiple of
#: 11, gone ``TTL`` seconds after its last write by the machine's clock; a cache of two entries makes
#: most reads go to the store, prefetched by the same key.
KEYS = 5
TTL = 10


class Clock:
    """The machines' time: it passes only by their rule, so expiry is the model's to predict."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


CLOCK = Clock()
KEYED = KeyedState(
    int, int, cache=2, prefetch=lambda value: value % KEYS, ttl=timedelta(seconds=TTL), clock=CLOCK
)


def attempts_needed(value: int) -> int:
    return value % FAILING if value % 7 == 0 else 0


def adder(sums: ManagedStream[int]) -> Any:
    """The handler every machine runs: add the value to the state, send the running sum."""

    async def add(tx: MessageTx[int], value: int) -> None:
        key = value % KEYS
        if value and value % 11 == 0:
            tx.store.delete(key)
        else:
            tx.store.put(key, await tx.store.get(key, 0) + value)
        if tx.attempt < attempts_needed(value):
            raise ValueError("a business failure")
        tx.set_state(tx.state + value)
        tx.send(sums.writer(), tx.state)
        if value == STOP:
            tx.stop()

    return add


def keyed_model(values: list[int], times: list[float], now: float) -> dict[int, int]:
    """The adder's live keyed state at ``now`` after handling ``values``, each at its time in ``times``."""
    totals: dict[int, tuple[int, float]] = {}  # a key's total and when it is gone
    for value, at in zip(values, times, strict=True):
        key = value % KEYS
        if value and value % 11 == 0:
            totals.pop(key, None)
        else:
            total, gone = totals.get(key, (0, at))
            totals[key] = ((total if gone > at else 0) + value, at + TTL)
    return {key: total for key, (total, gone) in totals.items() if gone > now}


async def open_streams(scope: Any) -> tuple[ManagedStream[int], ManagedStream[int]]:
    numbers = await scope.open_stream(
        NUMBERS, node="src", groups=("adder", "audit"), capacity=10_000, resumable=True
    )
    sums = await scope.open_stream(SUMS, node="adder", groups=("out",), capacity=10_000, resumable=True)
    return numbers, sums


async def send_from(stream: Any, values: list[int], first: int) -> None:
    """Send ``values`` to ``stream`` as a resumable source does (the i-th at ``send_at=first + i``), flush."""
    writer = stream.writer()
    for i, value in enumerate(values):
        await writer.send(value, send_at=first + i)
    await writer.flush()


class StoreLifetimes:
    """One store across simulated process lifetimes: each ``open_scope`` is a new one, ``close`` ends it."""

    def __init__(self, kind: str, portal: BlockingPortal, path: Path) -> None:
        self.kind = kind
        self.portal = portal
        self.path = path
        self.url = new_ledger_url() if kind == "postgres" else ""
        self.memory = MemoryStore()
        self.session: contextlib.ExitStack | None = None

    def opening(self) -> AbstractAsyncContextManager[Any]:
        """Opens the durable store again: a new process lifetime on the same ledger."""
        return open_postgres(self.url) if self.kind == "postgres" else open_ledger(self.path)

    def open_scope(self, name: str) -> Any:
        """A new lifetime: the store opened again (the same MemoryStore), and scope ``name`` on it."""
        session = contextlib.ExitStack()
        if self.kind in ("lmdb", "postgres"):
            ledger = session.enter_context(self.portal.wrap_async_context_manager(self.opening()))
            self.hooks: StreamHooks = ledger.streams
        else:
            self.hooks = self.memory
        scope = session.enter_context(
            self.portal.wrap_async_context_manager(open_scope(self.hooks, scope=name))
        )
        self.session = session
        return scope

    def close(self) -> None:
        """End this process lifetime: leave the scope and close the store."""
        assert self.session is not None
        session, self.session = self.session, None
        session.close()


class Stack(StoreLifetimes):
    """One store, a scope on it and the two streams, across simulated process lifetimes."""

    def __init__(self, kind: str, portal: BlockingPortal, path: Path) -> None:
        super().__init__(kind, portal, path)
        self.opens = 0

    def open(self) -> None:
        self.numbers, self.sums = self.portal.call(open_streams, self.open_scope("m"))
        self.opens += 1

    def append(self, values: list[int], first: int) -> None:
        self.portal.call(send_from, self.numbers, values, first)

    def finish(self) -> None:
        self.portal.call(self.numbers.writer().finish)

    def handle(self, limit: int) -> bool:
        """Handle up to ``limit`` messages; True if a message exhausted its budget."""

        async def run() -> None:
            await handle_messages(
                self.numbers.reader("adder"),
                adder(self.sums),
                initial_state=0,
                attempts=ATTEMPTS,
                limit=limit,
                keyed=KEYED,
            )

        try:
            self.portal.call(run)
        except MessageExhaustedError:
            return True
        return False

    def ack_audit(self, seqs: list[int]) -> None:
        async def ack() -> None:
            reader = self.numbers.reader("audit")
            for seq in seqs:
                await reader.ack(seq)

        self.portal.call(ack)

    def state(self) -> int:
        group = self.numbers._core.group("adder")
        state: int = 0 if group.state is None else self.numbers._core.codec.decode(group.state)
        return state

    def keyed(self) -> dict[int, int]:
        """The adder's confirmed keyed state, as the store lists it: the keys live by the clock."""

        async def listed() -> dict[int, int]:
            entries = await self.hooks.list_keyed(KeyedRange(self.numbers.ref, "adder", limit=1000))  # type: ignore[attr-defined]
            live = {key_to_plain(e.key): live_payload(e.value, CLOCK.now) for e in entries}
            return {key: KEYED.value_codec.decode(value) for key, value in live.items() if value is not None}

        return self.portal.call(listed)

    def view(self) -> tuple[Any, ...]:
        """Everything the endpoints show, values-free, the adder's state and its keyed state."""
        return (self.numbers.snapshot(), self.sums.snapshot(), self.state(), self.keyed())


class _Machine(RuleBasedStateMachine):
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="streamledger-machine-"))
        self.exit_stack = contextlib.ExitStack()
        self.portal: BlockingPortal = self.exit_stack.enter_context(start_blocking_portal(self.backend))
        self.stacks: list[Stack] = []  # what the machine drives; each machine adds its own
        CLOCK.now = 1_000_000.0

    @rule(seconds=st.sampled_from([1, 4, 9, 10, 30]))
    def time_passes(self, seconds: int) -> None:
        """The keyed state's clock moves on: keys last written ``TTL`` seconds ago are gone."""
        CLOCK.now += seconds

    def teardown(self) -> None:
        try:
            for stack in self.stacks:
                if stack.session is not None:
                    stack.close()
        finally:
            self.exit_stack.close()
            shutil.rmtree(self.dir, ignore_errors=True)


class LedgerMachine(_Machine):
    """One store against the model; subclasses choose the store (``kind``) and event loop (``backend``)."""

    kind = "lmdb"

    def __init__(self) -> None:
        super().__init__()
        self.stack = Stack(self.kind, self.portal, self.dir / "l")
        self.stacks.append(self.stack)
        # the model
        self.values: list[int] = []  # values[i] is message seq i+1
        self.finished = False
        self.handled = 0  # the sum group's contiguous frontier
        self.times: list[float] = []  # times[i]: the clock when message seq i+1 was handled
        self.exhausted_at: int | None = None
        self.stopped = False
        self.audit_acked: set[int] = set()
        self.stack.open()

    # -- rules -----------------------------------------------------------------------------

    @precondition(lambda self: not self.finished)
    @rule(values=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=20))
    def append(self, values: list[int]) -> None:
        self.stack.append(values, len(self.values) + 1)
        self.values.extend(values)

    @precondition(lambda self: not self.finished)
    @rule()
    def finish(self) -> None:
        self.stack.finish()
        self.finished = True

    def _expect_handle(self, limit: int) -> tuple[int, bool]:
        """What handling up to ``limit`` messages must do: (how many commit, exhausted?)."""
        count = 0
        seq = self.handled
        while count < limit and seq < len(self.values) and not self.stopped:
            value = self.values[seq]
            if attempts_needed(value) >= ATTEMPTS:
                return count, True
            seq += 1
            count += 1
            if value == STOP:
                break
        return count, False

    @precondition(lambda self: self.exhausted_at is None)
    @rule(limit=st.integers(min_value=0, max_value=30))
    def handle(self, limit: int) -> None:
        limit = min(limit, len(self.values) - self.handled)
        expected, exhausts = self._expect_handle(limit)
        exhausted = self.stack.handle(limit)
        assert exhausted == exhausts, "an exhausted message was swallowed into success" if exhausts else ""
        if exhausts:
            self.exhausted_at = self.handled + expected + 1
        self.stopped = self.stopped or STOP in self.values[self.handled : self.handled + expected]
        self.handled += expected
        self.times.extend([CLOCK.now] * expected)

    @precondition(lambda self: self.kind != "memory" and self.exhausted_at is None and not self.stopped)
    @rule(call=st.integers(min_value=1, max_value=3), after=st.booleans())
    def lose_a_commit_then_crash(self, call: int, after: bool) -> None:
        """A commit fails (or its answer is lost); the process dies; the ledger decides."""
        before = self.handled
        remaining = len(self.values) - before
        self.stack.close()

        async def run(hooks: StreamHooks) -> None:
            faulty = FaultyHooks(hooks, fail={"commit": call}, after=after)
            async with open_scope(faulty, scope="m") as scope:
                numbers, sums = await open_streams(scope)
                await handle_messages(
                    numbers.reader("adder"),
                    adder(sums),
                    initial_state=0,
                    attempts=ATTEMPTS,
                    limit=remaining,
                    keyed=KEYED,
                )

        # The faulty scope opens the streams again: one more generation.
        with (
            self.portal.wrap_async_context_manager(self.stack.opening()) as ledger,
            # the chosen commit failed, or a message ran out of attempts first: the ledger decides below
            contextlib.suppress(CheckpointError, MessageExhaustedError),
        ):
            self.portal.call(run, ledger.streams)
        self.stack.opens += 1
        self.stack.open()
        frontier = self.stack.numbers.snapshot().groups[0].acked_through
        expected_max, _ = self._expect_handle(len(self.values))
        assert before <= frontier <= before + expected_max
        if frontier > before:
            self.stopped = self.stopped or STOP in self.values[before:frontier]
        self.times.extend([CLOCK.now] * (frontier - self.handled))
        self.handled = frontier
        if self.exhausted_at is None and self.stack.numbers.snapshot().groups[0].exhausted:
            self.exhausted_at = frontier + 1

    @rule(data=st.data())
    def audit_out_of_order(self, data: st.DataObject) -> None:
        available = [s for s in range(1, len(self.values) + 1) if s not in self.audit_acked]
        if not available:
            return
        chosen = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=8))
        self.stack.ack_audit(chosen)
        self.audit_acked.update(chosen)

    @rule()
    def crash_and_reopen(self) -> None:
        self.stack.close()
        self.stack.open()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def ledger_agrees_with_the_model(self) -> None:
        numbers = self.stack.numbers.snapshot()
        sums = self.stack.sums.snapshot()
        assert numbers.appended == len(self.values)
        assert numbers.generation == self.stack.opens
        assert numbers.finished == self.finished
        adder_group, audit = numbers.groups
        assert adder_group.acked_through == self.handled
        assert sums.appended == self.handled  # one output per handled message, same transaction
        assert adder_group.exhausted == (1 if self.exhausted_at is not None else 0)
        frontier = 0
        while frontier + 1 in self.audit_acked:
            frontier += 1
        assert audit.acked_through == frontier
        assert audit.pending == len(self.values) - len(self.audit_acked)

    @invariant()
    def state_is_the_sum_of_exactly_the_handled_messages(self) -> None:
        assert self.stack.state() == sum(self.values[: self.handled])

    @invariant()
    def keyed_state_holds_exactly_the_handled_messages(self) -> None:
        assert self.stack.keyed() == keyed_model(self.values[: self.handled], self.times, CLOCK.now)


class LockstepMachine(_Machine):
    """``MemoryStore``, the LMDB ledger and the PostgreSQL one, driven alike, compared after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = Stack("memory", self.portal, self.dir / "unused")
        self.lmdb = Stack("lmdb", self.portal, self.dir / "l")
        self.postgres = Stack("postgres", self.portal, self.dir / "unused")
        self.stacks.extend((self.memory, self.lmdb, self.postgres))
        self.appended = 0
        self.finished = False
        self.exhausted = False
        self.audit_acked: set[int] = set()
        for stack in self.stacks:
            stack.open()

    @precondition(lambda self: not self.finished)
    @rule(values=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=20))
    def append(self, values: list[int]) -> None:
        for stack in self.stacks:
            stack.append(values, self.appended + 1)
        self.appended += len(values)

    @precondition(lambda self: not self.finished)
    @rule()
    def finish(self) -> None:
        for stack in self.stacks:
            stack.finish()
        self.finished = True

    @precondition(lambda self: not self.exhausted)
    @rule(limit=st.integers(min_value=0, max_value=30))
    def handle(self, limit: int) -> None:
        (group, _) = self.lmdb.numbers.snapshot().groups
        limit = min(limit, self.appended - group.acked_through)  # no waiting for messages never sent
        outcomes = {stack.kind: stack.handle(limit) for stack in self.stacks}
        assert outcomes["memory"] == outcomes["lmdb"], (
            f"one store exhausted a message, the other not: {outcomes}"
        )
        self.exhausted = outcomes["lmdb"]

    @rule(data=st.data())
    def audit_out_of_order(self, data: st.DataObject) -> None:
        available = [s for s in range(1, self.appended + 1) if s not in self.audit_acked]
        if not available:
            return
        chosen = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=8))
        for stack in self.stacks:
            stack.ack_audit(chosen)
        self.audit_acked.update(chosen)

    @rule()
    def crash_and_reopen(self) -> None:
        for stack in self.stacks:
            stack.close()
            stack.open()

    @invariant()
    def both_stores_show_the_same(self) -> None:
        assert self.memory.view() == self.lmdb.view() == self.postgres.view()
