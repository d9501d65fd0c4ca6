"""Graphs built the way most pydantic-graph code is written: inside a function, under the future import.

Nothing is imported at module level but the future import itself: the step
context, the state, deps and input types are all local to the builders, so
the step annotations are strings that name builder locals. A builder given
``built=False`` returns its ``GraphBuilder`` unbuilt: built elsewhere, the
graph cannot know the builder's locals.
"""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

from typing import Any


def counting() -> Any:
    """start -> bump -> more? (bump again | done) -> end; every type is a builder local.

    The input ``Tick(n, until)`` counts bumps; each bump appends a ``Tally`` to
    the state and the decision loops until ``n == until``. Deps (``Faults``)
    record the bumps that ran and fail the bump numbered ``fail_at`` once.
    Returns the graph and its state, deps and input classes.
    """
    from dataclasses import dataclass, field

    from pydantic_graph import GraphBuilder, StepContext

    @dataclass
    class Tally:
        n: int

    @dataclass
    class Counter:
        tallies: list[Tally] = field(default_factory=list)

    @dataclass
    class Tick:
        n: int
        until: int

    @dataclass
    class Faults:
        fail_at: int | None = None
        ran: list[int] = field(default_factory=list)

    g = GraphBuilder(name="counting", state_type=Counter, deps_type=Faults, input_type=Tick, output_type=int)

    @g.step
    async def bump(ctx: StepContext[Counter, Faults, Tick]) -> Tick:
        tick: Tick = ctx.inputs
        faults: Faults = ctx.deps
        counter: Counter = ctx.state
        n = tick.n + 1
        faults.ran.append(n)
        if n == faults.fail_at:
            faults.fail_at = None
            raise RuntimeError(f"bump {n} fails once")
        counter.tallies.append(Tally(n))
        return Tick(n, tick.until)

    @g.step
    async def done(ctx: StepContext[Counter, Faults, Tick]) -> int:
        counter: Counter = ctx.state
        return len(counter.tallies)

    more = (
        g.decision(node_id="more")
        .branch(g.match(Tick, matches=lambda tick: tick.n < tick.until).to(bump))
        .branch(g.match(Tick).to(done))
    )
    g.add(
        g.edge_from(g.start_node).to(bump),
        g.edge_from(bump).to(more),
        g.edge_from(done).to(g.end_node),
    )
    return g.build(), Counter, Faults, Tick


def journal(ledger: Any = None, *, built: bool = True) -> Any:
    """start -> write -> end, whose state names ``Note``, a class only annotations name.

    Once the builder returns only the locals its ``build()`` kept reach
    ``Note``. Given a ledger, the builder registers the graph itself, where
    ``Note`` is a local, and returns the ``DurableGraph``.
    """
    from dataclasses import dataclass, field

    from pydantic_graph import GraphBuilder, StepContext

    @dataclass
    class Note:
        text: str

    @dataclass
    class Journal:
        notes: list[Note] = field(default_factory=list)

    g = GraphBuilder(name="journal", state_type=Journal, input_type=str, output_type=int)

    @g.step
    async def write(ctx: StepContext[Journal, None, str]) -> int:
        kept: Journal = ctx.state
        return len(kept.notes)

    g.add(g.edge_from(g.start_node).to(write), g.edge_from(write).to(g.end_node))
    if not built:
        return g
    graph = g.build()
    if ledger is not None:
        from ledger.graphs import DurableGraph

        return DurableGraph(graph, ledger)
    return graph


def shouting(*, built: bool = True) -> Any:
    """start -> shout -> end, where ``shout`` is typed with ``Label``, a name only its annotation uses."""
    from typing import NewType

    from pydantic_graph import GraphBuilder, StepContext

    Label = NewType("Label", str)

    g = GraphBuilder(name="shouting", input_type=str, output_type=str)

    @g.step
    async def shout(ctx: StepContext[None, None, Label]) -> str:
        return str(ctx.inputs).upper()

    g.add(g.edge_from(g.start_node).to(shout), g.edge_from(shout).to(g.end_node))
    return g.build() if built else g


def choosing(*, built: bool = True) -> Any:
    """start -> pick -> route? (small | large) -> end; ``pick`` returns ``Choice``, a builder's local Literal.

    Deps (``Faults``) record the steps that ran and, with ``fail_small``, fail
    ``small`` once. Returns the graph (or its builder, unbuilt) and the deps class.
    """
    from dataclasses import dataclass, field
    from typing import Literal

    from pydantic_graph import GraphBuilder, StepContext

    Choice = Literal["small", "large"]

    @dataclass
    class Faults:
        fail_small: bool = False
        ran: list[str] = field(default_factory=list)

    g = GraphBuilder(name="choosing", deps_type=Faults, input_type=int, output_type=str)

    @g.step
    async def pick(ctx: StepContext[None, Faults, int]) -> Choice:
        faults: Faults = ctx.deps
        faults.ran.append("pick")
        return "small" if ctx.inputs < 10 else "large"

    @g.step
    async def small(ctx: StepContext[None, Faults, str]) -> str:
        faults: Faults = ctx.deps
        faults.ran.append("small")
        if faults.fail_small:
            faults.fail_small = False
            raise RuntimeError("small fails once")
        return f"a {ctx.inputs} order"

    @g.step
    async def large(ctx: StepContext[None, Faults, str]) -> str:
        faults: Faults = ctx.deps
        faults.ran.append("large")
        return f"a {ctx.inputs} order"

    route = (
        g.decision(node_id="route")
        .branch(g.match(str, matches=lambda choice: choice == "small").to(small))
        .branch(g.match(str).to(large))
    )
    g.add(
        g.edge_from(g.start_node).to(pick),
        g.edge_from(pick).to(route),
        g.edge_from(small).to(g.end_node),
        g.edge_from(large).to(g.end_node),
    )
    return (g.build() if built else g), Faults
