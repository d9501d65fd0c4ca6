"""Per-key totals: a running total per customer, in keyed state or in one explicit state.

The shape of the issue "Keyed state and partitioned streams": orders
``(customer, amount)`` over K customers; a handler keeps a running total per
customer. With ``state="keyed"`` the group keeps them in keyed state
(``handle_messages(..., keyed=KeyedState(str, int))``): the handler reads
and writes one customer's total per order, and what an order costs does not
depend on K. With ``state="explicit"`` (the baseline) the handler's state
(``tx.state``) is one ``dict[str, int]`` of every customer it has seen,
which the engine decodes for every message, and encodes and reads back for
every ``set_state``: what one message costs grows with K.

One configuration, on a fresh durable LMDB ledger:

1. The N orders are appended to stream ``customer-orders`` (capacity N + 1,
   so the source never waits) and the stream is finished, before any clock
   runs: the figures are the handlers' alone.
2. Each group handles order 1 (``limit=1``) starting from its seeded state,
   every customer it owns at total 0, and commits it: the group starts the
   measured part with all its K customers in its committed state (or keyed
   state), as a group that has seen them before does. Untimed. The keyed
   handler reads ahead (``prefetch``) the customers of each batch of
   orders, and keeps at most ``KeyedState``'s default of 100,000 totals in
   memory: over a million customers, most reads are the ledger's.
3. Timed: each group handles orders 2..N from the committed state. A group
   still handling when ``seconds`` have passed stops (``tx.stop()``) after
   that message; the configuration is then *cut short*, and its rate is
   taken over the messages it did.

With ``members`` M > 1 the stream has M consumer groups ``m0``..``m{M-1}``,
each handling every message but adding only the orders of its customers
(``crc32(customer) % M``) and seeded with those: what one process can do
today to split a keyed workload, since a group is one handler task and a
stream has no partitions. Its rate counts the messages every group has
handled.

Each run is verified: every group's totals as committed (the closed ledger
reopened and read back; with explicit state, its returned state too) must
equal the totals recomputed from the orders it handled, and its frontier
must be at its last handled message. A run that does not verify raises :class:`BenchError`.
"""

from __future__ import annotations

import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec

from ledger import LedgerEnv, inspect_ledger, open_ledger
from streams import (
    HandleResult,
    Key,
    KeyedState,
    MessageTx,
    Stream,
    StreamRef,
    handle_messages,
    open_scope,
)

from ._shape import BenchError

__all__ = [
    "CUSTOMER_ORDERS",
    "CustomerOrder",
    "KeyedRun",
    "STATES",
    "Totals",
    "customer_order",
    "expected_totals",
    "keys_label",
    "member_of",
    "run_keyed",
    "seeded_totals",
]

#: A prime: order ``i`` goes to customer ``i * SPREAD % K``, every customer in turn, in a scrambled order.
SPREAD: Final = 2_654_435_761

Totals = dict[str, int]
#: Where the handler keeps its totals: keyed state (a total per key), the same with a ttl (every total
#: stamped with its expiry and swept as the group goes, none old enough to go), or one explicit state.
STATES: Final = ("keyed", "expiring", "explicit")
#: The ttl of ``expiring`` totals: longer than any run, so the sweep reads every page and drops none.
EXPIRING_TTL: Final = timedelta(days=1)


class CustomerOrder(msgspec.Struct, frozen=True, gc=False):
    """One order: which customer, and how much."""

    customer: str
    amount: int


CUSTOMER_ORDERS: Final = Key("customer-orders", Stream[CustomerOrder])


def customer_order(i: int, keys: int) -> CustomerOrder:
    """Order ``i`` (from 1) over ``keys`` customers."""
    return CustomerOrder(f"c{i * SPREAD % keys}", i % 100 + 1)


def member_of(customer: str, members: int) -> int:
    """The member (group, shard) that owns ``customer``: a hash the same in every process."""
    return zlib.crc32(customer.encode()) % members


def seeded_totals(keys: int, member: int = 0, members: int = 1) -> Totals:
    """Every customer that ``member`` owns, at total 0."""
    names = (f"c{k}" for k in range(keys))
    if members == 1:
        return dict.fromkeys(names, 0)
    return {name: 0 for name in names if member_of(name, members) == member}


def expected_totals(last: int, keys: int, member: int = 0, members: int = 1) -> Totals:
    """The seeded totals of ``member`` after orders 1..``last``."""
    totals = seeded_totals(keys, member, members)
    for i in range(1, last + 1):
        order = customer_order(i, keys)
        if members == 1 or member_of(order.customer, members) == member:
            totals[order.customer] += order.amount
    return totals


def keys_label(keys: int) -> str:
    """``10``, ``10k``, ``1m``: how a number of keys is named in the figures' keys."""
    for size, suffix in ((1_000_000, "m"), (1_000, "k")):
        if keys >= size and keys % size == 0:
            return f"{keys // size}{suffix}"
    return str(keys)


@dataclass(frozen=True)
class KeyedRun:
    """One timed, verified configuration."""

    keys: int
    members: int
    state: str
    #: Messages every group handled in the timed part (orders 2..N, or fewer if cut short).
    messages: int
    seconds: float
    cut_short: bool
    #: CPU seconds of the event-loop thread in the timed part.
    loop_cpu: float
    #: Bytes of the largest group's committed totals (their msgpack encoding as one dict).
    state_bytes: int

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds

    def summary(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "members": self.members,
            "state": self.state,
            "messages": self.messages,
            "seconds": self.seconds,
            "msgs_per_s": self.msgs_per_s,
            "cut_short": self.cut_short,
            "loop_cpu_us_per_msg": self.loop_cpu / self.messages * 1e6,
            "state_bytes": self.state_bytes,
        }


def _handler(
    member: int, members: int, *, always_set: bool, deadline: list[float]
) -> Callable[[MessageTx[Totals], CustomerOrder], Any]:
    """The handler of group ``m{member}``: add the orders of its customers; stop once past the deadline."""
    clock = time.perf_counter

    async def add(tx: MessageTx[Totals], order: CustomerOrder) -> None:
        if members == 1 or member_of(order.customer, members) == member:
            totals = tx.state  # the engine's own copy for this attempt: changing it in place is safe
            totals[order.customer] += order.amount
            tx.set_state(totals)
        elif always_set:
            tx.set_state(tx.state)
        if clock() > deadline[0]:
            tx.stop()

    return add


def _keyed_handler(
    member: int, members: int, seed: Totals | None, *, deadline: list[float]
) -> Callable[[MessageTx[None], CustomerOrder], Any]:
    """The keyed handler of group ``m{member}``: ``seed`` puts every customer it owns at 0 first."""
    clock = time.perf_counter

    async def add(tx: MessageTx[None], order: CustomerOrder) -> None:
        totals = tx.store
        if seed is not None:
            for customer, total in seed.items():
                totals.put(customer, total)
        if members == 1 or member_of(order.customer, members) == member:
            customer = order.customer
            totals.put(customer, (0 if seed is not None else await totals.get(customer, 0)) + order.amount)
        if clock() > deadline[0]:
            tx.stop()

    return add


def _keyed_state(state: str) -> KeyedState[str, int]:
    ttl = EXPIRING_TTL if state == "expiring" else None
    return KeyedState(str, int, prefetch=lambda order: order.customer, ttl=ttl)


async def _run(
    path: Path, n: int, keys: int, members: int, seconds: float, window: int, state: str
) -> KeyedRun:
    groups = tuple(f"m{m}" for m in range(members))
    async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="keyed") as scope:
        stream = await scope.open_stream(
            CUSTOMER_ORDERS, node="source", groups=groups, capacity=n + 1, resumable=True
        )
        if stream.snapshot().appended:
            raise BenchError("the keyed bench's ledger is not fresh")
        writer = stream.writer()
        for i in range(1, n + 1):
            order = customer_order(i, keys)
            try:
                writer.send_nowait(order, send_at=i)
            except anyio.WouldBlock:
                await writer.send(order, send_at=i)
        await writer.finish()

        never = [float("inf")]
        keyed = state != "explicit"
        for m, group in enumerate(groups):  # order 1 commits the seeded state of every group
            if keyed:
                seeded: HandleResult[Any] = await handle_messages(
                    stream.reader(group),
                    _keyed_handler(m, members, seeded_totals(keys, m, members), deadline=never),
                    keyed=_keyed_state(state),
                    window=window,
                    limit=1,
                )
            else:
                seeded = await handle_messages(
                    stream.reader(group),
                    _handler(m, members, always_set=True, deadline=never),
                    initial_state=seeded_totals(keys, m, members),
                    state_type=Totals,
                    window=window,
                    limit=1,
                )
            if seeded.handled != 1:
                raise BenchError(f"group {group} handled {seeded.handled} messages of its seed, not 1")

        results: dict[int, HandleResult[Any]] = {}
        ended: dict[int, float] = {}
        deadline = [float("inf")]

        async def member(m: int) -> None:
            if keyed:
                results[m] = await handle_messages(
                    stream.reader(groups[m]),
                    _keyed_handler(m, members, None, deadline=deadline),
                    keyed=_keyed_state(state),
                    window=window,
                )
            else:
                results[m] = await handle_messages(
                    stream.reader(groups[m]),
                    _handler(m, members, always_set=False, deadline=deadline),
                    initial_state={},
                    state_type=Totals,
                    window=window,
                )
            ended[m] = time.perf_counter()

        cpu = time.thread_time()
        started = time.perf_counter()
        deadline[0] = started + seconds
        async with anyio.create_task_group() as tg:
            for m in range(members):
                tg.start_soon(member, m)
        elapsed = max(ended.values()) - started
        loop_cpu = time.thread_time() - cpu

    handled = {m: results[m].handled for m in range(members)}
    cut_short = any(results[m].stopped for m in range(members))
    if not cut_short and any(count != n - 1 for count in handled.values()):
        raise BenchError(f"the groups handled {handled} of the {n - 1} timed orders without stopping")
    expected = {m: expected_totals(1 + handled[m], keys, m, members) for m in range(members)}
    for m in range(members):
        if not keyed and results[m].state != expected[m]:
            raise BenchError(f"group {groups[m]} returned totals that differ from its orders' ({keys} keys)")
    _verify_ledger(path, groups, handled, expected, keyed=keyed)
    if keyed:
        await _verify_keyed(path, groups, expected, _keyed_state(state))
    state_bytes = max(len(msgspec.msgpack.encode(totals)) for totals in expected.values())
    return KeyedRun(keys, members, state, min(handled.values()), elapsed, cut_short, loop_cpu, state_bytes)


async def _verify_keyed(
    path: Path, groups: Sequence[str], expected: dict[int, Totals], spec: KeyedState[str, int]
) -> None:
    """Reopen the closed ledger: every group's keyed totals, as the ledger holds them."""
    ref = StreamRef("keyed", "source", CUSTOMER_ORDERS.name)  # the stream _run opened
    async with open_ledger(path) as ledger:
        for m, group in enumerate(groups):
            found = dict(await spec.items(ledger.streams, ref, group, limit=len(expected[m]) + 1))
            if found != expected[m]:
                raise BenchError(f"group {group} of the ledger at {path} committed keyed totals that differ")


def _verify_ledger(
    path: Path, groups: Sequence[str], handled: dict[int, int], expected: dict[int, Totals], *, keyed: bool
) -> None:
    """Reopen the closed ledger: every group's frontier and committed totals, as the ledger holds them."""
    env = LedgerEnv.open(path, create=False)
    try:
        found = {s["key"]: s for s in inspect_ledger(env)["streams"]}
    finally:
        env.close()
    stream = found.get(CUSTOMER_ORDERS.name)
    if stream is None:
        raise BenchError(f"the ledger at {path} lacks stream {CUSTOMER_ORDERS.name!r}")
    frontiers = {g["group"]: g for g in stream["groups"]}
    for m, group in enumerate(groups):
        frontier = frontiers.get(group)
        if frontier is None or frontier["acked_through"] != 1 + handled[m]:
            raise BenchError(f"group {group} of the ledger at {path} is not at order {1 + handled[m]}")
        if not keyed and frontier["state"] != expected[m]:
            raise BenchError(f"group {group} of the ledger at {path} committed totals that differ")


def run_keyed(
    n: int,
    *,
    keys: int,
    members: int = 1,
    state: str = "keyed",
    seconds: float = 10.0,
    window: int = 1024,
    backend: str = "asyncio",
    workdir: Path | None = None,
) -> KeyedRun:
    """One configuration on a fresh durable LMDB ledger in a temporary directory, verified."""
    if n < 2 or keys < 1 or members < 1:
        raise ValueError("the keyed bench needs at least 2 orders, 1 key and 1 member")
    if state not in STATES:
        raise ValueError(f"the keyed bench keeps its totals in {' or '.join(STATES)} state, not {state!r}")
    with tempfile.TemporaryDirectory(prefix="streamledger-keyed-", dir=workdir) as tmp:
        path = Path(tmp) / "ledger"
        return anyio.run(_run, path, n, keys, members, seconds, window, state, backend=backend)
