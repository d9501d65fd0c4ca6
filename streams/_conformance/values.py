"""Values are checked by reading back what is written, and handlers get what a restart would see."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from .. import (
    Key,
    MessageTx,
    PayloadTypeError,
    RecordDecodeError,
    SourceNotResumableError,
    Stream,
    handle_messages,
    open_scope,
)
from ._support import World, cases, check, raises


class Order(msgspec.Struct):
    amount: int


ORDERS = Key("orders", Stream[Order])
INTS = Key("ints", Stream[int])

V = TypeVar("V")


class Box(msgspec.Struct, Generic[V], frozen=True):
    x: V


BOXES = Key("boxes", Stream[Box[int]])
BOXED = Key("boxed", Box[int])
ANYTHING = Key("anything", Stream[Any])


@cases((Order(amount="not an int"),), (True,), ids=["struct-field", "bool-for-int"])  # type: ignore[arg-type]
async def test_a_value_that_does_not_read_back_as_its_type_is_refused(world: World, bad: object) -> None:
    key: Key[Stream[Any]] = ORDERS if isinstance(bad, Order) else INTS
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(key, node="src", groups=("g",), resumable=True)
        with raises(PayloadTypeError, match="does not read back"):
            await stream.writer().send(bad)
        await stream.writer().flush()
        assert stream.snapshot().appended == 0
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(key, node="src", groups=("g",), resumable=True)
        assert stream.snapshot().appended == 0


@check
async def test_a_state_that_does_not_read_back_is_refused_without_spending_the_budget(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(INTS, node="src", groups=("g",))
        await stream.writer().send(1)
        await stream.writer().finish()

        async def bad_state(tx: MessageTx[Order], value: int) -> None:
            tx.set_state(Order(amount="x"))  # type: ignore[arg-type]

        with raises(PayloadTypeError):
            await handle_messages(stream.reader("g"), bad_state, initial_state=Order(0))
        assert stream.snapshot().groups[0].exhausted == 0


@check
async def test_the_default_any_state_and_any_payloads_work(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(ANYTHING, node="src", groups=("g",))
        await stream.writer().send({"n": 1})
        await stream.writer().send([2])
        await stream.writer().finish()

        async def keep(tx: MessageTx[Any], value: Any) -> None:
            tx.set_state({"last": value})

        result = await handle_messages(stream.reader("g"), keep)
        assert result.state == {"last": [2]}


@check
async def test_handlers_see_values_as_a_restarted_run_would(world: World) -> None:
    seen: list[Any] = []
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(ANYTHING, node="src", groups=("g",))
        await stream.writer().send((1, 2))  # a tuple reads back as a list
        await stream.writer().finish()

        async def record(tx: MessageTx[Any], value: Any) -> None:
            tx.set_state({"seen": {1, 2}})  # a set reads back as a list
            seen.append((value, tx.state))

        await handle_messages(stream.reader("g"), record)
    assert seen == [([1, 2], {"seen": [1, 2]})]


@check
async def test_a_stored_value_of_a_changed_type_stops_recovery_with_a_typed_error(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(INTS, node="src", groups=("g",))
        await stream.writer().send(1)
        await stream.writer().finish()

        async def keep(tx: MessageTx[Any], value: int) -> None:
            tx.set_state("text")

        await handle_messages(stream.reader("g"), keep, limit=1, initial_state="", state_type=str)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        stream = await scope.open_stream(INTS, node="src", groups=("g",))

        async def count(tx: MessageTx[int], value: int) -> None:
            tx.set_state(tx.state + 1)

        with raises(RecordDecodeError, match="state of group 'g'"):
            await handle_messages(stream.reader("g"), count, initial_state=0)
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        with raises(SourceNotResumableError, match="holds int messages"):
            await scope.open_stream(Key("ints", Stream[str]), node="src", groups=("g",))


@check
async def test_a_parameterized_generic_struct_is_a_message_a_state_and_a_result(world: World) -> None:
    async with world.session() as hooks, open_scope(hooks, scope="s") as scope:
        boxes = await scope.open_stream(BOXES, node="src", groups=("g",))
        for i in range(3):
            await boxes.writer().send(Box(i))
        await boxes.writer().finish()

        async def add(tx: MessageTx[Box[int]], box: Box[int]) -> None:
            tx.set_state(Box(tx.state.x + box.x))
            tx.set(BOXED, box)

        result = await handle_messages(boxes.reader("g"), add, initial_state=Box(0), state_type=Box[int])
        assert (result.state, result.result(BOXED)) == (Box(3), Box(2))
