"""Resume a pydantic-graph run where it stopped: python examples/graph_resume.py [LEDGER]

The graph prices an order in three steps. The first attempt fails in the last
step (a flaky payment service); the second attempt of the same run id resumes
from the ledger and runs only that step. Kill the process at any step instead
and run it again: the same happens.
"""

# mypy cannot read pydantic-graph's infer_variance type variables, so to mypy StepContext takes
# no type arguments; the annotations are what streamledger reads at run time.
# mypy: disable-error-code="type-arg"

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field

import anyio
from pydantic_graph import GraphBuilder, StepContext

from ledger import open_ledger
from ledger.graphs import DurableGraph, current_step


@dataclass
class Order:
    lines: list[str] = field(default_factory=list)


class PaymentDown(Exception):
    pass


class Payments:
    """Deps: a payment service that is down for the first call."""

    def __init__(self) -> None:
        self.calls = 0

    def charge(self, cents: int, idempotency_key: str) -> str:
        self.calls += 1
        if self.calls == 1:
            raise PaymentDown("payment service unavailable")
        return f"paid {cents} ({idempotency_key})"


g = GraphBuilder(name="checkout", state_type=Order, deps_type=Payments, input_type=int, output_type=str)


@g.step
async def price(ctx: StepContext[Order, Payments, int]) -> int:
    order: Order = ctx.state
    order.lines.append("priced")
    print("price ran")
    return ctx.inputs * 100


@g.step
async def tax(ctx: StepContext[Order, Payments, int]) -> int:
    order: Order = ctx.state
    order.lines.append("taxed")
    print("tax ran")
    return ctx.inputs * 120 // 100


@g.step
async def pay(ctx: StepContext[Order, Payments, int]) -> str:
    payments: Payments = ctx.deps
    print("pay ran")
    return payments.charge(ctx.inputs, idempotency_key=current_step().idempotency_key)


g.add(
    g.edge_from(g.start_node).to(price),
    g.edge_from(price).to(tax),
    g.edge_from(tax).to(pay),
    g.edge_from(pay).to(g.end_node),
)
checkout = g.build()


async def main(path: str) -> None:
    payments = Payments()
    async with open_ledger(path) as ledger:
        durable = DurableGraph[Order, Payments, int, str](checkout, ledger)
        try:
            await durable.run("order-42", state=Order(), inputs=3, deps=payments)
        except PaymentDown:
            print("attempt 1 failed; retrying")
        result = await durable.run("order-42", state=Order(), inputs=3, deps=payments)
    print(f"attempt {result.attempt}: {result.output}; state {result.state.lines}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else f"{scratch}/ledger")
