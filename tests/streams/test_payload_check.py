"""How payloads are checked, exactly as docs/reference.md says: a round trip, by shape, not by class."""

from __future__ import annotations

import msgspec
import pytest

from streams import Key, MemoryStore, PayloadTypeError, Stream, open_scope

pytestmark = pytest.mark.anyio


class Order(msgspec.Struct, frozen=True):
    id: int
    amount: int


class LookAlike(msgspec.Struct, frozen=True):
    id: int
    amount: int


class Pair(msgspec.Struct):
    items: tuple[int, int]
    tags: list[str]


ORDERS = Key("orders", Stream[Order])
PAIRS = Key("pairs", Stream[Pair])


async def test_values_of_the_right_shape_are_accepted_and_arrive_as_the_keys_type() -> None:
    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await scope.open_stream(ORDERS, node="n", groups=("g",))
        writer, reader = stream.writer(), stream.reader("g")
        await writer.send({"id": 1, "amount": 5})  # type: ignore[arg-type]  # a dict with its fields
        await writer.send(LookAlike(2, 7))  # type: ignore[arg-type]  # another Struct of the same shape
        await writer.flush()
        received = [(await reader.receive()).value for _ in range(2)]
    assert received == [Order(1, 5), Order(2, 7)]
    assert all(type(value) is Order for value in received)


async def test_what_is_sent_is_a_copy_so_later_mutation_changes_nothing() -> None:
    async with open_scope(MemoryStore(), scope="s") as scope:
        stream = await scope.open_stream(PAIRS, node="n", groups=("g",))
        sent = Pair((1, 2), ["a"])
        await stream.writer().send(Pair([1, 2], ["a"]))  # type: ignore[arg-type]  # a list for the tuple
        await stream.writer().send(sent)
        sent.tags.append("changed after sending")
        await stream.writer().flush()
        reader = stream.reader("g")
        first, second = (await reader.receive()).value, (await reader.receive()).value
    assert first.items == (1, 2) and type(first.items) is tuple
    assert second.tags == ["a"] and second is not sent


@pytest.mark.parametrize(
    "value",
    [{"id": 1}, {"id": "1", "amount": 2}, Order(1, 2**64), object()],
    ids=["missing-field", "str-for-int", "int-too-large", "not-encodable"],
)
async def test_a_value_that_does_not_read_back_as_the_type_is_refused_and_nothing_is_written(
    value: object,
) -> None:
    store = MemoryStore()
    async with open_scope(store, scope="s") as scope:
        stream = await scope.open_stream(ORDERS, node="n", groups=("g",))
        with pytest.raises(PayloadTypeError, match="does not read back as one"):
            await stream.writer().send(value)  # type: ignore[arg-type]
        await stream.writer().flush()
        assert stream.snapshot().appended == 0
