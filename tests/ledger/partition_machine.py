"""A stateful model test of partitioned streams with keyed totals: the real stack against a list and a
dict per partition, with crashes, lost commits and a source resumed from its position.

:class:`PartitionMachine` appends values to a stream of three partitions by
``value % KEYS``, handles a chosen partition (each handler adds its value to
its key's keyed total; a value that is a multiple of 7 fails its first
attempt after writing its key, which must never reach the ledger), crashes
and reopens, loses a commit (before or after the store confirmed it) and
then crashes, and resends every value from the writer's position, which
must append nothing already confirmed. After every step each partition's
messages are the model's list for it, in order, its frontier the model's,
and its keyed totals exactly the sums of the values handled.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from hashlib import blake2b
from pathlib import Path
from typing import Any

import msgspec
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streams import (
    CheckpointError,
    Key,
    KeyedState,
    MessageTx,
    PartitionedStream,
    Stream,
    StreamHooks,
    handle_messages,
    open_scope,
)
from streams.testing import FaultyHooks

from .stateful import StoreLifetimes, send_from

NUMBERS = Key("numbers", Stream[int])
PARTITIONS = 3
KEYS = 7
#: The adder's keyed state: a total per key; a cache of one entry sends most reads to the store.
TOTALS = KeyedState(int, int, cache=1, prefetch=lambda value: value % KEYS)


def key_of(value: int) -> int:
    return value % KEYS


def partition_of(value: int) -> int:
    """Where the stream puts ``value``: the digest of its key's MessagePack, modulo the partitions."""
    digest = blake2b(msgspec.msgpack.encode(key_of(value)), digest_size=8).digest()
    return int.from_bytes(digest, "big") % PARTITIONS


async def add(tx: MessageTx[None], value: int) -> None:
    totals = TOTALS.of(tx)
    totals.put(key_of(value), await totals.get(key_of(value), 0) + value)
    if value % 7 == 0 and tx.attempt == 0:
        raise ValueError("a business failure, retried")


async def open_numbers(scope: Any) -> PartitionedStream[int]:
    opened: PartitionedStream[int] = await scope.open_partitioned(
        NUMBERS,
        node="src",
        partitions=PARTITIONS,
        partition_key=key_of,
        groups=("adder",),
        capacity=10_000,
        resumable=True,
    )
    return opened


class PartitionStack(StoreLifetimes):
    """One store, a scope on it and the partitioned stream, across simulated process lifetimes."""

    def open(self) -> None:
        self.numbers: PartitionedStream[int] = self.portal.call(open_numbers, self.open_scope("pm"))

    def send(self, values: list[int], first: int) -> None:
        self.portal.call(send_from, self.numbers, values, first)

    def handle(self, partition: int, limit: int) -> None:
        async def run() -> None:
            reader = self.numbers.reader("adder").partitions[partition]
            await handle_messages(reader, add, keyed=TOTALS, attempts=2, limit=limit)

        self.portal.call(run)

    def view(self) -> list[tuple[list[int] | None, int, dict[int, int]]]:
        """Per partition: its messages in order (MemoryStore's only), its frontier, its keyed totals."""

        async def read() -> list[tuple[list[int] | None, int, dict[int, int]]]:
            seen: list[tuple[list[int] | None, int, dict[int, int]]] = []
            for part in self.numbers.partitions:
                core = part._core
                values = None
                if self.kind == "memory":
                    values = [core.codec.decode(p) for p in _payloads(self.hooks, part.ref)]
                totals = dict(await TOTALS.items(self.hooks, part.ref, "adder"))
                seen.append((values, core.group("adder").acked_through, totals))
            return seen

        return self.portal.call(read)


def _payloads(hooks: Any, ref: Any) -> list[bytes]:
    return [payload for _, payload in sorted(hooks.stored_messages(ref).items())]


class PartitionMachine(RuleBasedStateMachine):
    """One store against the model; subclasses choose the store (``kind``) and event loop (``backend``)."""

    kind = "lmdb"
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="streamledger-partitions-"))
        self.exit_stack = contextlib.ExitStack()
        self.portal: BlockingPortal = self.exit_stack.enter_context(start_blocking_portal(self.backend))
        self.stack = PartitionStack(self.kind, self.portal, self.dir / "l")
        self.values: list[int] = []  # every value sent, in order (send_at = index + 1)
        self.parts: list[list[int]] = [[] for _ in range(PARTITIONS)]  # the model: a list per partition
        self.handled = [0] * PARTITIONS
        self.stack.open()

    def teardown(self) -> None:
        try:
            if self.stack.session is not None:
                self.stack.close()
        finally:
            self.exit_stack.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(values=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=20))
    def append(self, values: list[int]) -> None:
        self.stack.send(values, len(self.values) + 1)
        self.values.extend(values)
        for value in values:
            self.parts[partition_of(value)].append(value)

    @rule()
    def resend_from_the_writers_position(self) -> None:
        """A resumed source sends again from its position: what was confirmed is skipped."""
        position = self.stack.numbers.writer().position or 0
        self.stack.send(self.values[position:], position + 1)

    @rule(partition=st.integers(min_value=0, max_value=PARTITIONS - 1), limit=st.integers(0, 15))
    def handle(self, partition: int, limit: int) -> None:
        limit = min(limit, len(self.parts[partition]) - self.handled[partition])  # never wait for more
        self.stack.handle(partition, limit)
        self.handled[partition] += limit

    @precondition(lambda self: self.kind != "memory")
    @rule(
        partition=st.integers(min_value=0, max_value=PARTITIONS - 1),
        call=st.integers(1, 2),
        after=st.booleans(),
    )
    def lose_a_commit_then_crash(self, partition: int, call: int, after: bool) -> None:
        """A commit fails (or its answer is lost); the process dies; the ledger decides."""
        remaining = len(self.parts[partition]) - self.handled[partition]
        self.stack.close()

        async def run(hooks: StreamHooks) -> None:
            faulty = FaultyHooks(hooks, fail={"commit": call}, after=after)
            async with open_scope(faulty, scope="pm") as scope:
                numbers = await open_numbers(scope)
                reader = numbers.reader("adder").partitions[partition]
                await handle_messages(reader, add, keyed=TOTALS, attempts=2, limit=remaining)

        with (
            self.portal.wrap_async_context_manager(self.stack.opening()) as ledger,
            contextlib.suppress(CheckpointError),
        ):
            self.portal.call(run, ledger.streams)
        self.stack.open()
        frontier = self.stack.numbers.partitions[partition]._core.group("adder").acked_through
        assert self.handled[partition] <= frontier <= len(self.parts[partition])
        self.handled[partition] = frontier

    @rule()
    def crash_and_reopen(self) -> None:
        self.stack.close()
        self.stack.open()

    @invariant()
    def every_partition_holds_exactly_its_messages_frontier_and_totals(self) -> None:
        for p, (values, frontier, totals) in enumerate(self.stack.view()):
            if values is not None:
                assert values == self.parts[p], p
            assert self.stack.numbers.snapshot()[p].appended == len(self.parts[p]), p
            assert frontier == self.handled[p], p
            expected: dict[int, int] = {}
            for value in self.parts[p][: self.handled[p]]:
                expected[key_of(value)] = expected.get(key_of(value), 0) + value
            assert totals == expected, p
