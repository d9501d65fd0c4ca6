"""A checkpoint is saved only if what it restores reads back as it was."""

# mypy: disable-error-code="type-arg"

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from pydantic_graph import BaseNode, End, Graph, GraphBuilder, GraphRunContext, StepContext, reduce_sum

from ledger.graphs import UntypedNodeWarning
from ledger.graphs._values import holds_one_shot

from .graphs import Calls, Log, enter, events, fail_then_retry


def skip_reasons(spans: Any) -> set[tuple[str, str]]:
    return {
        (e["streamledger.checkpoint.next_node"], e["streamledger.checkpoint.reason"])
        for e in events(spans, "streamledger.checkpoint.skipped")
    }


# -- 3 into a float step ---------------------------------------------------------------------


def int_into_float() -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=float)

    @g.step
    async def first(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "first", 3)

    @g.step
    async def second(ctx: StepContext[Log, Calls, float]) -> float:
        return enter(ctx, "second", ctx.inputs)

    g.add(
        g.edge_from(g.start_node).to(first), g.edge_from(first).to(second), g.edge_from(second).to(g.end_node)
    )
    return g.build()


async def test_a_value_that_reads_back_equal_as_another_class_is_saved_before_a_step(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, int_into_float(), "second", inputs=0, provider=provider, exporter=exporter
    )
    assert trail.retry == ["second"]
    assert trail.seen == [3.0]
    assert type(trail.seen[0]) is float  # 3 given to a step typed float resumes as 3.0


async def test_input_types_overrides_a_step_annotation(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path,
        int_into_float(),
        "second",
        inputs=0,
        provider=provider,
        exporter=exporter,
        input_types={"second": int},
    )
    assert trail.retry == ["second"]
    assert type(trail.seen[0]) is int


# -- subclasses routed by a decision ---------------------------------------------------------


class Animal(BaseModel):
    name: str


class Dog(Animal):
    pass


def routed(make: type[Animal]) -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=str, output_type=str)

    @g.step
    async def adopt(ctx: StepContext[Log, Calls, str]) -> Animal:
        return enter(ctx, "adopt", make(name=ctx.inputs))

    @g.step
    async def walk(ctx: StepContext[Log, Calls, Dog]) -> str:
        dog: Dog = ctx.inputs
        return enter(ctx, "walk", f"walked {dog.name}")

    @g.step
    async def feed(ctx: StepContext[Log, Calls, Animal]) -> str:
        animal: Animal = ctx.inputs
        return enter(ctx, "feed", f"fed {animal.name}")

    kind = g.decision(node_id="kind").branch(g.match(Dog).to(walk)).branch(g.match(Animal).to(feed))
    g.add(
        g.edge_from(g.start_node).to(adopt),
        g.edge_from(adopt).to(kind),
        g.edge_from(walk, feed).to(g.end_node),
    )
    return g.build()


async def test_the_boundary_before_a_decision_is_skipped_when_inputs_read_back_as_another_class(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, routed(Dog), "walk", inputs="rex", provider=provider, exporter=exporter
    )
    assert trail.retry == ["adopt", "walk"]  # a Dog written as an Animal would have been fed
    assert trail.result.output == "walked rex"
    assert skip_reasons(trail.spans) == {("kind", "reads_back_as_other_class")}


async def test_the_boundary_before_a_decision_is_saved_when_inputs_keep_their_class(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, routed(Animal), "feed", inputs="tom", provider=provider, exporter=exporter
    )
    assert trail.retry == ["feed"]
    assert trail.result.output == "fed tom"


# -- one-shot iterators ----------------------------------------------------------------------


def generator_into_map(stream: bool) -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    async def numbers(ctx: StepContext[Log, Calls, int]) -> AsyncIterator[int]:
        for i in range(ctx.inputs):
            yield i

    async def sync_numbers(ctx: StepContext[Log, Calls, int]) -> Iterable[int]:
        return enter(ctx, "numbers", iter(range(ctx.inputs)))

    source = g.stream(numbers, node_id="numbers") if stream else g.step(sync_numbers, node_id="numbers")

    @g.step
    async def square(ctx: StepContext[Log, Calls, int]) -> int:
        return int(ctx.inputs) ** 2

    @g.step
    async def final(ctx: StepContext[Log, Calls, int]) -> int:
        return enter(ctx, "final", ctx.inputs)

    total = g.join(reduce_sum, initial=0)
    g.add(
        g.edge_from(g.start_node).to(source),
        g.edge_from(source).map().to(square),
        g.edge_from(square).to(total),
        g.edge_from(total).to(final),
        g.edge_from(final).to(g.end_node),
    )
    return g.build()


@pytest.mark.parametrize("stream", [False, True], ids=["generator", "stream-step"])
async def test_a_one_shot_iterator_is_never_written_down(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter, stream: bool
) -> None:
    trail = await fail_then_retry(
        tmp_path, generator_into_map(stream), "final", inputs=4, provider=provider, exporter=exporter
    )
    assert trail.first[-1] == "final"
    assert trail.result.output == 0 + 1 + 4 + 9  # the fork still read every item
    assert ("map", "one_shot") in skip_reasons(trail.spans)


# -- stream steps and BaseNode steps read their input type as Any ----------------------------


class Item(BaseModel):
    n: int


def into_stream(value: Any) -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def make(ctx: StepContext[Log, Calls, int]) -> Any:
        return enter(ctx, "make", value)

    async def echo(ctx: StepContext[Log, Calls, Any]) -> AsyncIterator[int]:
        enter(ctx, "echo", ctx.inputs)
        given: Any = ctx.inputs
        yield given["n"] if isinstance(given, dict) else given.n

    streamed = g.stream(echo, node_id="echo")
    total = g.join(reduce_sum, initial=0)
    g.add(
        g.edge_from(g.start_node).to(make),
        g.edge_from(make).to(streamed),
        g.edge_from(streamed).map().to(total),
        g.edge_from(total).to(g.end_node),
    )
    return g.build()


async def test_a_stream_step_given_json_values_is_saved_without_input_types(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, into_stream({"n": 7}), "echo", inputs=0, provider=provider, exporter=exporter
    )
    assert trail.retry == ["echo"]
    assert trail.result.output == 7


async def test_a_model_given_to_a_stream_step_is_not_saved_as_a_dict(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path, into_stream(Item(n=7)), "echo", inputs=0, provider=provider, exporter=exporter
    )
    assert trail.retry == ["make", "echo"]
    assert trail.seen == [0, Item(n=7)]  # the stream step got the model, not a dict
    assert ("echo", "reads_back_different") in skip_reasons(trail.spans)


async def test_input_types_names_a_stream_steps_type(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path,
        into_stream(Item(n=7)),
        "echo",
        inputs=0,
        provider=provider,
        exporter=exporter,
        input_types={"echo": Item},
    )
    assert trail.retry == ["echo"]
    assert trail.seen == [Item(n=7)]


@dataclass
class First(BaseNode[Log, Calls, int]):
    n: int

    async def run(self, ctx: GraphRunContext[Log, Calls]) -> Second:
        ctx.deps.enter("First", self)
        return Second(self.n + 1)


@dataclass
class Second(BaseNode[Log, Calls, int]):
    n: int

    async def run(self, ctx: GraphRunContext[Log, Calls]) -> End[int]:
        ctx.deps.enter("Second", self)
        return End(self.n * 2)


def base_nodes() -> Graph:
    g = GraphBuilder(name="g", state_type=Log, deps_type=Calls, input_type=int, output_type=int)

    @g.step
    async def begin(ctx: StepContext[Log, Calls, int]) -> First:
        return enter(ctx, "begin", First(ctx.inputs))

    g.add(g.edge_from(g.start_node).to(begin), g.node(First), g.node(Second))
    return g.build()


async def test_a_base_node_step_is_checkpointed_as_an_instance_of_its_node_class(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntypedNodeWarning)  # nothing is left untyped
        trail = await fail_then_retry(
            tmp_path, base_nodes(), "Second", inputs=3, provider=provider, exporter=exporter
        )
    assert trail.retry == ["Second"]  # resumed right before it, from its checkpoint
    assert trail.seen == [Second(4)]  # an instance of its class, not a dict
    assert trail.result.output == 8
    assert skip_reasons(trail.spans) == set()


async def test_input_types_can_name_a_base_nodes_class(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path,
        base_nodes(),
        "Second",
        inputs=3,
        provider=provider,
        exporter=exporter,
        input_types={"First": First, "Second": Second},
    )
    assert trail.retry == ["Second"]
    assert trail.seen == [Second(4)]


# -- state and graph inputs ------------------------------------------------------------------


@dataclass
class Loose:
    steps: list[str] = field(default_factory=list)
    anything: Any = None


def with_loose_state() -> Graph:
    g = GraphBuilder(name="g", state_type=Loose, deps_type=Calls, input_type=Any, output_type=int)

    @g.step
    async def one(ctx: StepContext[Loose, Calls, Any]) -> int:
        calls: Calls = ctx.deps
        calls.enter("one")
        return 1

    @g.step
    async def two(ctx: StepContext[Loose, Calls, int]) -> int:
        calls: Calls = ctx.deps
        calls.enter("two")
        return ctx.inputs + 1

    g.add(g.edge_from(g.start_node).to(one), g.edge_from(one).to(two), g.edge_from(two).to(g.end_node))
    return g.build()


async def test_a_state_field_typed_any_holding_a_model_is_not_saved(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path,
        with_loose_state(),
        "two",
        inputs=0,
        provider=provider,
        exporter=exporter,
        state=lambda: Loose(anything=Item(n=1)),
    )
    assert trail.retry == ["one", "two"]
    assert trail.result.state.anything == Item(n=1)
    assert skip_reasons(trail.spans) == {("two", "reads_back_different"), ("__end__", "reads_back_different")}


async def test_graph_inputs_that_do_not_read_back_leave_no_checkpoint(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    trail = await fail_then_retry(
        tmp_path,
        with_loose_state(),
        "two",
        inputs=Item(n=1),
        provider=provider,
        exporter=exporter,
        state=Loose,
    )
    assert trail.retry == ["one", "two"]
    assert ("two", "reads_back_different") in skip_reasons(trail.spans)


# -- the one-shot check, decided once per class ----------------------------------------------


def holds_one_shot_by_isinstance(value: Any) -> bool:
    """What holds_one_shot answers, asked of every value anew (the check before it was decided per
    class): the oracle its per-class decisions must agree with."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Iterator | AsyncIterator):
            return True
        if isinstance(item, str | bytes | bytearray | int | float | bool | None) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, BaseModel):
            stack.extend(getattr(item, name) for name in type(item).model_fields)
        elif dataclasses.is_dataclass(item):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
    return False


class Label(str):
    pass


class Table(dict[Any, Any]):
    pass


class Row(tuple[Any, ...]):
    pass


class Chars(str):
    """A str that is also an iterator: an iterator first."""

    def __next__(self) -> str:
        raise StopIteration


@dataclass
class Box:
    held: Any = None


class Holder(BaseModel):
    held: Any = None


class Opaque:
    """An object of no known shape: its attributes are not looked into."""

    def __init__(self, held: Any) -> None:
        self.held = held


_LEAVES = st.one_of(
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=3),
    st.builds(Label, st.text(max_size=3)),
    st.builds(Chars, st.text(max_size=3)),
    st.builds(lambda n: iter(range(n)), st.integers(0, 3)),
    st.builds(lambda n: (i for i in range(n)), st.integers(0, 3)),
)
_NESTED = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.lists(inner, max_size=3).map(Row),
        st.frozensets(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
        st.dictionaries(st.text(max_size=2), inner, max_size=3).map(Table),
        st.builds(Box, inner),
        st.builds(lambda held: Holder.model_construct(held=held), inner),
        st.builds(Opaque, inner),
    ),
    max_leaves=8,
)


@settings(max_examples=500, deadline=None)
@given(value=_NESTED)
def test_the_one_shot_check_decided_per_class_answers_as_asking_every_value(value: Any) -> None:
    assert holds_one_shot(value) == holds_one_shot_by_isinstance(value)
