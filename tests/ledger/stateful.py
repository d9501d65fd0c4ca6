"""The ledger's stateful model test: the real stack against a tiny model, with crashes.

Rules append messages, handle them (succeeding, failing, stopping), ack
another group's messages out of order, lose commits (before and after the
store confirmed them) and crash and reopen the ledger. After every step the
ledger must agree with the model: contiguous sequences, a contiguous
frontier, one transaction per message (the state is the sum of exactly the
acknowledged messages and each produced one output), budgets that never
refill and generations raised on every open. ``fuzz/`` runs this same
machine for longer.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger import open_ledger
from streams import (
    CheckpointError,
    Key,
    ManagedStream,
    MemoryStore,
    MessageExhaustedError,
    MessageTx,
    Stream,
    StreamHooks,
    handle_messages,
    open_scope,
)
from streams.testing import FaultyHooks, InjectedFault

NUMBERS = Key("numbers", Stream[int])
SUMS = Key("sums", Stream[int])
ATTEMPTS = 2
#: A value fails on every attempt below ``value % 3``: 0 never fails, 2 exhausts a budget of 2.
FAILING = 3


def attempts_needed(value: int) -> int:
    return value % FAILING if value % 7 == 0 else 0


class LedgerMachine(RuleBasedStateMachine):
    """Subclasses choose the store (``kind``) and the event loop (``backend``)."""

    kind = "lmdb"
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="streamledger-machine-"))
        self.memory = MemoryStore()
        self.exit_stack = contextlib.ExitStack()
        self.portal: BlockingPortal = self.exit_stack.enter_context(start_blocking_portal(self.backend))
        # the model
        self.values: list[int] = []  # values[i] is message seq i+1
        self.finished = False
        self.opens = 0
        self.handled = 0  # the sum group's contiguous frontier
        self.exhausted_at: int | None = None
        self.stopped = False
        self.audit_acked: set[int] = set()
        self.audit_delivered: list[int] = []
        self.session: contextlib.ExitStack | None = None
        self._open()

    # -- sessions --------------------------------------------------------------------------

    def _open(self) -> None:
        session = contextlib.ExitStack()
        if self.kind == "lmdb":
            ledger = session.enter_context(
                self.portal.wrap_async_context_manager(open_ledger(self.dir / "l"))
            )
            hooks: StreamHooks = ledger.streams
        else:
            hooks = self.memory
        self.hooks = hooks
        self.scope = session.enter_context(
            self.portal.wrap_async_context_manager(open_scope(hooks, scope="m"))
        )
        self.numbers: ManagedStream[int] = self.portal.call(self._open_stream, NUMBERS, "src")
        self.sums: ManagedStream[int] = self.portal.call(self._open_stream, SUMS, "adder")
        self.opens += 1
        self.audit_delivered = []
        self.session = session

    async def _open_stream(self, key: Key[Stream[int]], node: str) -> ManagedStream[int]:
        groups = ("adder", "audit") if key is NUMBERS else ("out",)
        return await self.scope.open_stream(key, node=node, groups=groups, capacity=10_000, resumable=True)

    def _close(self) -> None:
        assert self.session is not None
        with contextlib.suppress(BaseException):
            self.session.close()
        self.session = None

    def teardown(self) -> None:
        self._close()
        self.exit_stack.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules -----------------------------------------------------------------------------

    @precondition(lambda self: not self.finished)
    @rule(values=st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=20))
    def append(self, values: list[int]) -> None:
        async def send() -> None:
            writer = self.numbers.writer()
            for v in values:
                await writer.send(v, send_at=len(self.values) + 1)
                self.values.append(v)
            await writer.flush()

        self.portal.call(send)

    @precondition(lambda self: not self.finished)
    @rule()
    def finish(self) -> None:
        self.portal.call(self.numbers.writer().finish)
        self.finished = True

    async def _add(self, tx: MessageTx[int], value: int) -> None:
        if tx.attempt < attempts_needed(value):
            raise ValueError("a business failure")
        tx.set_state(tx.state + value)
        tx.send(self.sums.writer(), tx.state)
        if value == 13:
            tx.stop()

    def _expect_handle(self, limit: int) -> tuple[int, bool]:
        """What handling up to ``limit`` messages must do: (how many commit, exhausted?)."""
        count = 0
        seq = self.handled
        while count < limit and seq < len(self.values) and not self.stopped:
            value = self.values[seq]
            needed = attempts_needed(value)
            if needed >= ATTEMPTS:
                return count, True
            seq += 1
            count += 1
            if value == 13:
                break
        return count, False

    @precondition(lambda self: self.exhausted_at is None)
    @rule(limit=st.integers(min_value=0, max_value=30))
    def handle(self, limit: int) -> None:
        limit = min(limit, len(self.values) - self.handled)
        expected, exhausts = self._expect_handle(limit)

        async def run() -> None:
            await handle_messages(
                self.numbers.reader("adder"), self._add, initial_state=0, attempts=ATTEMPTS, limit=limit
            )

        if exhausts:
            try:
                self.portal.call(run)
            except MessageExhaustedError:
                pass
            else:
                raise AssertionError("an exhausted message was swallowed into success")
            self.exhausted_at = self.handled + expected + 1
        else:
            self.portal.call(run)
        self.stopped = self.stopped or any(
            v == 13 for v in self.values[self.handled : self.handled + expected]
        )
        self.handled += expected

    @precondition(lambda self: self.kind == "lmdb" and self.exhausted_at is None and not self.stopped)
    @rule(call=st.integers(min_value=1, max_value=3), after=st.booleans())
    def lose_a_commit_then_crash(self, call: int, after: bool) -> None:
        """A commit fails (or its answer is lost); the process dies; the ledger decides."""
        before = self.handled
        remaining = len(self.values) - before
        faulty = FaultyHooks(self.hooks, fail={"commit": call}, after=after)

        async def run() -> None:
            async with open_scope(faulty, scope="m") as scope:
                numbers = await scope.open_stream(
                    NUMBERS, node="src", groups=("adder", "audit"), capacity=10_000, resumable=True
                )
                sums = await scope.open_stream(
                    SUMS, node="adder", groups=("out",), capacity=10_000, resumable=True
                )

                async def add(tx: MessageTx[int], value: int) -> None:
                    if tx.attempt < attempts_needed(value):
                        raise ValueError("a business failure")
                    tx.set_state(tx.state + value)
                    tx.send(sums.writer(), tx.state)
                    if value == 13:
                        tx.stop()

                await handle_messages(
                    numbers.reader("adder"), add, initial_state=0, attempts=ATTEMPTS, limit=remaining
                )

        self._close()
        self.session = None
        # The faulty scope opens the streams again: one more generation.
        ledger_cm = self.portal.wrap_async_context_manager(open_ledger(self.dir / "l"))
        with ledger_cm as ledger:
            faulty.inner = ledger.streams
            with contextlib.suppress(
                CheckpointError, InjectedFault, MessageExhaustedError, ExceptionGroup, anyio.EndOfStream
            ):
                self.portal.call(run)
        self.opens += 1
        self._open()
        frontier = self.numbers.snapshot().groups[0].acked_through
        expected_max, _ = self._expect_handle(len(self.values))
        assert before <= frontier <= before + expected_max
        if frontier > before:
            self.stopped = self.stopped or any(v == 13 for v in self.values[before:frontier])
        self.handled = frontier
        if self.exhausted_at is None and self.numbers.snapshot().groups[0].exhausted:
            self.exhausted_at = frontier + 1

    @rule(data=st.data())
    def audit_out_of_order(self, data: st.DataObject) -> None:
        available = [s for s in range(1, len(self.values) + 1) if s not in self.audit_acked]
        if not available:
            return
        chosen = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=8))

        async def ack() -> None:
            reader = self.numbers.reader("audit")
            for seq in chosen:
                await reader.ack(seq)

        self.portal.call(ack)
        self.audit_acked.update(chosen)

    @rule()
    def crash_and_reopen(self) -> None:
        self._close()
        self._open()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def ledger_agrees_with_the_model(self) -> None:
        numbers = self.numbers.snapshot()
        sums = self.sums.snapshot()
        assert numbers.appended == len(self.values)
        assert numbers.generation == self.opens
        assert numbers.finished == self.finished
        adder, audit = numbers.groups
        assert adder.acked_through == self.handled
        assert sums.appended == self.handled  # one output per handled message, same transaction
        assert adder.exhausted == (1 if self.exhausted_at is not None else 0)
        frontier = 0
        while frontier + 1 in self.audit_acked:
            frontier += 1
        assert audit.acked_through == frontier
        assert audit.pending == len(self.values) - len(self.audit_acked)

    @invariant()
    def state_is_the_sum_of_exactly_the_handled_messages(self) -> None:
        group = self.numbers._groups["adder"]
        state: Any = 0 if group.state is None else self.numbers.codec.decode(group.state)
        assert state == sum(self.values[: self.handled])
