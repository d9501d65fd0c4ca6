"""The commits of a handler's next batch: runs of first attempts become one commit each.

A handler stages its messages in order. Consecutive messages handled at
their first attempt are confirmed by one :class:`MessageCommit` whose
``through`` names the last of them: the acks of the whole run, the last
state set, the results merged in order, the outputs in order (one batch
per output stream) and a stop after the last. Any other message (a retry,
or a message handled again under a new parent attempt) gets a commit of its
own, so its budget record is forgotten with it. The store confirms a batch
of commits in one transaction, so a run is all or nothing like a single
message, and the ledger ends up holding exactly the records it would hold
had every message been committed alone; per message the engine builds no
record at all, and the store's writer touches no per-message objects but
the payloads.
"""

from __future__ import annotations

from typing import Any

from ._store._records import KeyedWrite, MessageCommit, MessageRef, OutputBatch, StreamRef

__all__ = ["CommitStager", "RunOutput", "writes_of"]

#: The results of a commit that set none (never mutated).
_NO_RESULTS: dict[str, bytes] = {}


def writes_of(keyed: dict[bytes, bytes | None]) -> tuple[KeyedWrite, ...]:
    """Keyed writes as a commit carries them: one per key, its last value (None deletes)."""
    return tuple(KeyedWrite(key, value) for key, value in keyed.items())


class RunOutput:
    """The payloads a run staged for one output stream, from ``first`` on."""

    __slots__ = ("first", "generation", "payloads", "ref")

    def __init__(self, ref: StreamRef, generation: int, first: int) -> None:
        self.ref = ref
        self.generation = generation
        self.first = first
        self.payloads: list[bytes] = []


class CommitStager:
    """Collects staged messages of one group and cuts them into a batch of commits.

    The open run is public for the handler's loop, which joins a first
    attempt to it inline when nothing but its ack, its state and its outputs
    changes (no results, no stop, no keyed writes): ``first`` and ``last``
    (0 while no run is open), ``state`` (the last set), and ``outputs``, a
    :class:`RunOutput` per stream written (by ``id``). Anything else goes
    through :meth:`run_message`.
    """

    __slots__ = (
        "_generation",
        "_group",
        "_keyed",
        "_node",
        "_parent_attempt",
        "_queue",
        "_ref",
        "_results",
        "_stop",
        "first",
        "last",
        "outputs",
        "state",
    )

    def __init__(self, ref: StreamRef, group: str, generation: int, node: str, parent_attempt: str) -> None:
        self._ref = ref
        self._group = group
        self._generation = generation
        self._node = node
        self._parent_attempt = parent_attempt
        self._queue: list[MessageCommit] = []
        # the open run: messages first..last (none while first is 0)
        self.first = 0
        self.last = 0
        self.state: bytes | None = None
        self._results: dict[str, bytes] | None = None
        self._stop = False
        self.outputs: dict[int, RunOutput] = {}
        self._keyed: dict[bytes, bytes | None] | None = None

    def __bool__(self) -> bool:
        return bool(self._queue) or self.first != 0

    def run_message(
        self,
        seq: int,
        state: bytes | None,
        results: dict[str, bytes] | None,
        stop: bool,
        keyed: dict[bytes, bytes | None] | None = None,
    ) -> None:
        """Stage a message handled at its first attempt: it joins the open run if it follows it.

        Its outputs follow with :meth:`run_output`.
        """
        if seq != self.last + 1 or not self.first:
            self._close_run()
            self.first = seq
        self.last = seq
        if state is not None:
            self.state = state
        if results:
            if self._results is None:
                self._results = {}
            self._results.update(results)
        if stop:
            self._stop = True
        if keyed:
            # the run is confirmed all or nothing: only the last write of each key is kept
            if self._keyed is None:
                self._keyed = dict(keyed)
            else:
                self._keyed.update(keyed)

    def run_output(self, stream: Any, first: int, payloads: list[bytes] | tuple[bytes, ...]) -> None:
        """Outputs of the message last staged by :meth:`run_message`, for ``stream`` from ``first``."""
        self._run_output(stream, first).payloads.extend(payloads)

    def run_output_one(self, stream: Any, first: int, payload: bytes) -> None:
        """The one output of the message last staged by :meth:`run_message`."""
        staged = self.outputs.get(id(stream))  # _run_output inline: once per message
        if staged is None:
            staged = self.outputs[id(stream)] = RunOutput(stream.ref, stream.generation, first)
        staged.payloads.append(payload)

    def _run_output(self, stream: Any, first: int) -> RunOutput:
        staged = self.outputs.get(id(stream))
        if staged is None:
            staged = self.outputs[id(stream)] = RunOutput(stream.ref, stream.generation, first)
        return staged

    def single(self, commit: MessageCommit) -> None:
        """Stage a message that needs a commit of its own."""
        self._close_run()
        self._queue.append(commit)

    def cut(self) -> list[MessageCommit]:
        """Every staged commit, in order; the stager starts empty again."""
        self._close_run()
        batch, self._queue = self._queue, []
        return batch

    def _close_run(self) -> None:
        if not self.first:
            return
        first, last = self.first, self.last
        outputs = self.outputs.values()
        self._queue.append(
            MessageCommit(
                MessageRef(self._ref, self._group, self._generation, first),
                self._node,
                0,
                self.state,
                self._results or _NO_RESULTS,
                tuple(OutputBatch(o.ref, o.generation, o.first, tuple(o.payloads)) for o in outputs),
                self._stop,
                self._parent_attempt,
                last if last != first else 0,
                keyed=() if self._keyed is None else writes_of(self._keyed),
            )
        )
        self.first = self.last = 0
        self.state = None
        self._results = None
        self._stop = False
        self.outputs = {}
        self._keyed = None
