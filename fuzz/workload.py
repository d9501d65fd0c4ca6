"""``python -m fuzz.workload PATH``: a multi-stage pipeline built to be killed, and its exact answer.

Four streams in scope ``fuzz``, five consumer groups, handlers that fail on
chosen messages, and outputs that name the order they came from:

* ``source`` appends orders 1..N (amount ``i``) to ``orders``;
* group ``billing`` of ``orders`` keeps a running total, sends one invoice per
  order and one alert per thousandth order; it fails its first two attempts
  at every 97th order (budget 3), so those succeed at their third;
* group ``shipping`` of ``orders`` sends one shipment per order; it fails the
  first attempt at every 89th order (budget 2);
* group ``audit`` of ``invoices`` and group ``tracking`` of ``shipments``
  count what they see and note every order that does not follow the last one
  (lost, duplicated or out of order);
* group ``pager`` of ``alerts`` fails every attempt at the alert for order
  3,000 (budget 2): that alert is exhausted, here and after every restart, and
  the pager stops there.

Every handled message is one ledger transaction: its ack, its group's state
and its outputs. :func:`check_confirmed` states what that means for a
ledger killed at any instant; :func:`check_answer` what a finished run must
hold. Run the same command again after a kill and it resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Final

import anyio
import msgspec

from ledger import LedgerEnv, LedgerError, inspect_ledger, open_ledger
from ledger._demo import Invoice, Order  # the demo's own records
from streams import Key, MessageExhaustedError, MessageTx, Stream, handle_messages, open_scope
from streams.store import single_error

__all__ = ["SCOPE", "WorkloadViolation", "check_answer", "check_confirmed", "main", "read", "run"]

SCOPE: Final = "fuzz"
#: Billing fails the first two attempts at these orders; shipping the first one at these.
BILL_FLAKY: Final = 97
SHIP_FLAKY: Final = 89
#: Billing sends an alert for every order that is a multiple of this.
ALERT_EVERY: Final = 1000
#: The order whose alert the pager can never handle.
POISON: Final = 3000
_CAPACITY: Final = 4096


class Shipment(msgspec.Struct, frozen=True, gc=False):
    order: int


class Alert(msgspec.Struct, frozen=True, gc=False):
    order: int


class Billing(msgspec.Struct, frozen=True, gc=False):
    total: int = 0
    count: int = 0
    retried: int = 0  # orders that succeeded only at their third attempt


class Shipping(msgspec.Struct, frozen=True, gc=False):
    count: int = 0
    retried: int = 0


class Follower(msgspec.Struct, frozen=True, gc=False):
    """A counting consumer's state: what it saw, and every order that did not follow the last."""

    count: int = 0
    last: int = 0
    out_of_order: int = 0


ORDERS: Final = Key("orders", Stream[Order])
INVOICES: Final = Key("invoices", Stream[Invoice])
SHIPMENTS: Final = Key("shipments", Stream[Shipment])
ALERTS: Final = Key("alerts", Stream[Alert])


class Flaky(Exception):
    """A chosen failure of a handler's attempt."""


class WorkloadViolation(AssertionError):
    """The ledger does not hold what one transaction per message, or a finished run, implies."""


async def run(path: str | os.PathLike[str], messages: int) -> None:
    """Run (or resume) the workload on the ledger at ``path`` until every stage has ended."""
    async with (
        open_ledger(path) as ledger,
        open_scope(ledger.streams, scope=SCOPE) as scope,
    ):

        async def opened(key: Key[Any], node: str, groups: tuple[str, ...]) -> Any:
            return await scope.open_stream(key, node=node, groups=groups, capacity=_CAPACITY, resumable=True)

        orders = await opened(ORDERS, "source", ("billing", "shipping"))
        invoices = await opened(INVOICES, "billing", ("audit",))
        alerts = await opened(ALERTS, "billing", ("pager",))
        shipments = await opened(SHIPMENTS, "shipping", ("tracking",))

        async def source() -> None:
            writer = orders.writer()
            if writer.done:
                return
            for i in range((writer.position or 0) + 1, messages + 1):
                await writer.send(Order(id=i, amount=i), send_at=i)
            await writer.finish()

        async def bill(tx: MessageTx[Billing], order: Order) -> None:
            if order.id % BILL_FLAKY == 0 and tx.attempt < 2:  # attempts count from 0
                raise Flaky(order.id)
            state = tx.state
            tx.set_state(
                Billing(state.total + order.amount, state.count + 1, state.retried + (tx.attempt == 2))
            )
            tx.send(invoices.writer(), Invoice(order.id, order.amount))
            if order.id % ALERT_EVERY == 0:
                tx.send(alerts.writer(), Alert(order.id))

        async def ship(tx: MessageTx[Shipping], order: Order) -> None:
            if order.id % SHIP_FLAKY == 0 and tx.attempt == 0:
                raise Flaky(order.id)
            tx.set_state(Shipping(tx.state.count + 1, tx.state.retried + (tx.attempt == 1)))
            tx.send(shipments.writer(), Shipment(order.id))

        async def follow(tx: MessageTx[Follower], item: Invoice | Shipment) -> None:
            state = tx.state
            tx.set_state(
                Follower(state.count + 1, item.order, state.out_of_order + (item.order != state.last + 1))
            )

        async def page(tx: MessageTx[Follower], alert: Alert) -> None:
            if alert.order == POISON:
                raise Flaky(alert.order)
            state = tx.state
            expected = state.last + ALERT_EVERY
            tx.set_state(
                Follower(state.count + 1, alert.order, state.out_of_order + (alert.order != expected))
            )

        async def billing() -> None:
            await handle_messages(orders.reader("billing"), bill, initial_state=Billing(), attempts=3)
            await invoices.writer().finish()
            await alerts.writer().finish()

        async def shipping() -> None:
            await handle_messages(orders.reader("shipping"), ship, initial_state=Shipping(), attempts=2)
            await shipments.writer().finish()

        async def audit() -> None:
            await handle_messages(invoices.reader("audit"), follow, initial_state=Follower())

        async def tracking() -> None:
            await handle_messages(shipments.reader("tracking"), follow, initial_state=Follower())

        async def pager() -> None:
            with contextlib.suppress(MessageExhaustedError):  # the poisoned alert, exhausted for good
                await handle_messages(alerts.reader("pager"), page, initial_state=Follower(), attempts=2)

        with single_error():
            async with anyio.create_task_group() as tg:
                for stage in (source, billing, shipping, audit, tracking, pager):
                    tg.start_soon(stage)


# -- what the ledger must hold -------------------------------------------------------------


def read(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The workload's streams as ``inspect`` reports them, by name (nothing may be running on it)."""
    env = LedgerEnv.open_readonly(path)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    return {s["key"]: s for s in report["streams"] if s["scope"] == SCOPE}


def _group(streams: dict[str, dict[str, Any]], key: str, name: str) -> dict[str, Any]:
    for group in streams[key]["groups"]:
        if group["group"] == name:
            return dict(group)
    raise WorkloadViolation(f"stream {key!r} has no group {name!r}")


def _expect(what: str, found: Any, wanted: Any) -> None:
    if found != wanted:
        raise WorkloadViolation(f"{what}: found {found!r}, expected {wanted!r}")


def _state(group: dict[str, Any], empty: dict[str, int]) -> Any:
    return empty if group["state"] is None else group["state"]


def check_confirmed(streams: dict[str, dict[str, Any]]) -> None:
    """What one transaction per message implies of a ledger killed at any instant."""
    if any(key not in streams for key in ("orders", "invoices", "alerts", "shipments")):
        return  # killed while opening the streams, one transaction each: nothing was handled yet
    billing, shipping = _group(streams, "orders", "billing"), _group(streams, "orders", "shipping")
    billed, shipped = billing["acked_through"], shipping["acked_through"]
    # the ack, the state and the outputs of each message are one commit
    _expect("invoices appended vs orders billed", streams["invoices"]["appended"], billed)
    _expect("alerts appended vs orders billed", streams["alerts"]["appended"], billed // ALERT_EVERY)
    _expect("shipments appended vs orders shipped", streams["shipments"]["appended"], shipped)
    _expect(
        "billing state",
        _state(billing, {"total": 0, "count": 0, "retried": 0}),
        {"total": billed * (billed + 1) // 2, "count": billed, "retried": billed // BILL_FLAKY},
    )
    _expect(
        "shipping state",
        _state(shipping, {"count": 0, "retried": 0}),
        {"count": shipped, "retried": shipped // SHIP_FLAKY},
    )
    for key, name in (("invoices", "audit"), ("shipments", "tracking")):
        group = _group(streams, key, name)
        seen = group["acked_through"]
        _expect(
            f"{name} state",
            _state(group, {"count": 0, "last": 0, "out_of_order": 0}),
            {"count": seen, "last": seen, "out_of_order": 0},
        )
    pager = _group(streams, "alerts", "pager")
    paged = pager["acked_through"]
    if paged >= POISON // ALERT_EVERY:
        raise WorkloadViolation(f"the pager acknowledged {paged} alerts, past the poisoned one")
    _expect(
        "pager state",
        _state(pager, {"count": 0, "last": 0, "out_of_order": 0}),
        {"count": paged, "last": paged * ALERT_EVERY, "out_of_order": 0},
    )
    for group in (
        billing,
        shipping,
        _group(streams, "invoices", "audit"),
        _group(streams, "shipments", "tracking"),
    ):
        _expect(f"group {group['group']} exhausted", group["exhausted"], 0)
    _expect("pager exhausted", pager["exhausted"] in (0, 1), True)
    for key, stream in streams.items():
        _expect(f"stream {key} failed", stream["failed"], False)


def check_answer(streams: dict[str, dict[str, Any]], messages: int) -> None:
    """What a finished run of ``messages`` orders must hold, whatever was killed on the way."""
    check_confirmed(streams)
    for key in ("orders", "invoices", "shipments", "alerts"):
        _expect(f"stream {key} finished", streams[key]["finished"], True)
    _expect("orders appended", streams["orders"]["appended"], messages)
    for key, name in (
        ("orders", "billing"),
        ("orders", "shipping"),
        ("invoices", "audit"),
        ("shipments", "tracking"),
    ):
        _expect(f"group {name} acknowledged", _group(streams, key, name)["acked_through"], messages)
    pager = _group(streams, "alerts", "pager")
    poisoned = messages >= POISON
    _expect("alerts poisoned and exhausted", pager["exhausted"], int(poisoned))
    _expect(
        "alerts paged",
        pager["acked_through"],
        POISON // ALERT_EVERY - 1 if poisoned else messages // ALERT_EVERY,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz.workload", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the ledger directory (created if missing)")
    parser.add_argument("--messages", type=int, default=200_000, help="orders in all (default 200,000)")
    args = parser.parse_args(argv)
    try:
        anyio.run(run, args.path, args.messages)
    except LedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    streams = read(args.path)
    check_answer(streams, args.messages)
    billing = _group(streams, "orders", "billing")["state"]
    print(f"workload finished: {args.messages} orders, billing total {billing['total']}, every stage exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
