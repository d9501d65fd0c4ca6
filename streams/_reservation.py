"""Output reservation: the messages a handler stages for other streams, from claim to publication.

A message's outputs are confirmed with its ack, so their sequence numbers
are taken when the message is staged, not when the commit lands: the run
claims each stream it writes (one writer per stream), waits until every
stream the message writes has room for all of its outputs, reserves their
sequence numbers in one step, and keeps their values until the commit that
confirms them lands; then they are published, in order, and readers woken.
"""

from __future__ import annotations

from typing import Any, Final

from ._errors import OutputLimitError, StreamStateError
from ._staging import CommitStager, RunOutput
from ._store._records import OutputBatch, StreamRef
from ._stream import StreamCore

__all__ = [
    "REFUSED_OUTPUTS",
    "OutputReservation",
    "Staged",
    "StagedOutputs",
    "by_stream",
    "notify",
    "publish",
]

#: Outputs as a handler staged them: the stream, the value as it reads back, its payload.
Staged = tuple[StreamCore[Any], Any, bytes]
#: Why a message's staged outputs cannot be published: too many for a stream, or a stream refusing.
REFUSED_OUTPUTS: Final = (OutputLimitError, StreamStateError)


class StagedOutputs:
    """The values reserved in one output stream since the last batch was cut, from ``first`` on."""

    __slots__ = ("first", "stream", "values")

    def __init__(self, stream: StreamCore[Any], first: int) -> None:
        self.stream = stream
        self.first = first
        self.values: list[Any] = []


class OutputReservation:
    """The output streams one handler run writes, and the values reserved in them but not published."""

    __slots__ = ("_owner", "_source", "_staged", "writes")

    def __init__(self, owner: object, source: StreamRef) -> None:
        self._owner = owner  # the claim on every stream written: one writer per stream
        self._source = source
        self._staged: dict[int, StagedOutputs] = {}
        self.writes: set[StreamCore[Any]] = set()

    def room_for(self, seq: int, outputs: list[Staged]) -> bool:
        """Whether every stream that message ``seq`` writes has room for its outputs.

        Raises first if a batch can never fit its stream or the stream may not
        be written by this run: such errors must not wait for room elsewhere.
        """
        if len(outputs) == 1:
            out = outputs[0][0]
            if out not in self.writes:
                self._claim(out, seq, 1)
            return out.next_seq - out.floor() <= out.capacity
        grouped = by_stream(outputs)
        for out, values, _ in grouped:
            if len(values) > out.capacity or out not in self.writes:
                self._claim(out, seq, len(values))
        return all(out.next_seq - 1 - out.floor() + len(v) <= out.capacity for out, v, _ in grouped)

    def fits(self, seq: int, outputs: list[Staged]) -> bool:
        """Whether message ``seq``'s outputs fit at once; a refusal (:data:`REFUSED_OUTPUTS`) says
        no, so that the caller's wait for room (:meth:`room_for` again) raises it after a drain."""
        if len(outputs) == 1:  # room_for inline: once per message that sends one
            out = outputs[0][0]
            if out in self.writes:
                return out.next_seq - out.floor() <= out.capacity
        try:
            return self.room_for(seq, outputs)
        except REFUSED_OUTPUTS:
            return False

    async def wait_for_room(self, outputs: list[Staged]) -> None:
        """Wait until every stream of ``outputs`` has room for them.

        Only this run reserves sequence numbers in these streams, so room
        found for one stream is still there after waiting for the next.
        """
        for out, values, _ in by_stream(outputs):
            await out.wait_capacity(len(values))

    def reserve(self, outputs: list[Staged], run: CommitStager | None) -> tuple[OutputBatch, ...]:
        """Reserve sequence numbers for outputs that have room; keep their values to publish.

        The payloads go to ``run`` (the stager's open run of first attempts),
        or into the returned batches, one per stream, for a commit of their own.
        """
        if len(outputs) == 1:  # a message's one output: reserve and _publish_later inline
            out, value, payload = outputs[0]
            first = out.next_seq
            out.next_seq = first + 1
            pending = self._staged.get(id(out))
            if pending is None:
                pending = self._staged[id(out)] = StagedOutputs(out, first)
            pending.values.append(value)
            if run is not None:
                run.run_output_one(out, first, payload)
                return ()
            return (OutputBatch(out.ref, out.generation, first, (payload,)),)
        batches: list[OutputBatch] = []
        for out, values, payloads in by_stream(outputs):
            first = out.reserve(len(values))
            self._publish_later(out, first).extend(values)
            if run is not None:
                run.run_output(out, first, payloads)
            else:
                batches.append(OutputBatch(out.ref, out.generation, first, payloads))
        return tuple(batches)

    def reserve_one(self, output: Staged, run: CommitStager) -> None:
        """:meth:`reserve` of a message's one output, which has room, for ``run``'s open run."""
        out, value, payload = output
        first = out.next_seq
        out.next_seq = first + 1
        pending = self._staged.get(id(out))
        if pending is None:
            pending = self._staged[id(out)] = StagedOutputs(out, first)
        pending.values.append(value)
        staged = run.outputs.get(id(out))  # run.run_output_one inline
        if staged is None:
            staged = run.outputs[id(out)] = RunOutput(out.ref, out.generation, first)
        staged.payloads.append(payload)

    def cut(self) -> list[StagedOutputs]:
        """The values reserved since the last cut: those of the batch being cut with them."""
        if not self._staged:
            return []
        staged, self._staged = self._staged, {}
        return list(staged.values())

    def release(self) -> None:
        """The run ended: its claims on the streams it wrote are let go."""
        for out in self.writes:
            out.release_handler(self._owner)

    def _publish_later(self, out: StreamCore[Any], first: int) -> list[Any]:
        pending = self._staged.get(id(out))
        if pending is None:
            pending = self._staged[id(out)] = StagedOutputs(out, first)
        return pending.values

    def _claim(self, out: StreamCore[Any], seq: int, n: int) -> None:
        """Check that ``n`` outputs fit ``out`` at all, and make this run its writer."""
        if n > out.capacity:
            raise OutputLimitError(
                f"message {seq} of {self._source} staged {n} messages for "
                f"{out.ref}, more than its capacity of {out.capacity}"
            )
        if out not in self.writes:
            out.claim_for_handler(self._owner)
            self.writes.add(out)


def publish(cut: list[StagedOutputs]) -> None:
    """Publish the values of a confirmed batch (readers are woken by :func:`notify`)."""
    for staged in cut:
        staged.stream.publish(staged.first, staged.values, notify=False)


def notify(cut: list[StagedOutputs]) -> None:
    """Wake the readers of every stream a landed batch published to."""
    for staged in cut:
        staged.stream.notify()


def by_stream(outputs: list[Staged]) -> list[tuple[StreamCore[Any], list[Any], tuple[bytes, ...]]]:
    """Staged outputs grouped by stream, in order of first appearance: values and payloads."""
    first = outputs[0][0]
    if len(outputs) == 1:
        return [(first, [outputs[0][1]], (outputs[0][2],))]
    grouped: dict[int, tuple[StreamCore[Any], list[Any], list[bytes]]] = {}
    for out, value, payload in outputs:
        entry = grouped.setdefault(id(out), (out, [], []))
        entry[1].append(value)
        entry[2].append(payload)
    return [(out, values, tuple(payloads)) for out, values, payloads in grouped.values()]
