"""handle_messages: the per-message transaction, pipelined.

For each message of a consumer group the handler reads the group's explicit
state, may set a replacement, stage output messages to other streams and
ordinary results, or stop. One store commit confirms the message's ack with
all of it (consecutive first attempts share one commit record, see
:mod:`streams._staging`); only then are the outputs published locally and
the message acked locally. The handler goes on to message k+1 from k's
staged state while k's commit is in flight; commits land strictly in order,
a window bounds the messages in flight, and the committer wakes readers once
per committed batch.
A failed commit fails everything staged after it: the call raises, and
recovery starts from the last committed state, exactly as if every message
had been handled one by one.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, overload

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec
from opentelemetry.trace import SpanKind, get_current_span

from ._backoff import Backoff
from ._codec import PREPARE_ERRORS, Codec, codec_for, encode_value
from ._dead_letter import DeadLetter, check_dead_letter_writer
from ._errors import (
    CheckpointError,
    GroupBusyError,
    HandlerContractError,
    MessageExhaustedError,
    OutputLimitError,
    PayloadTypeError,
    StreamFailedError,
    StreamStateError,
)
from ._keyed import KeyedCache, KeyedState, KeyedTx
from ._keys import Key, NoValue, NoValueType, check_name
from ._metrics import INSTRUMENTS, group_attributes
from ._outcome import accept, is_fault
from ._partitions import PartitionedReader
from ._pipeline import ConfirmPipeline
from ._reservation import REFUSED_OUTPUTS, OutputReservation, StagedOutputs, notify, publish
from ._staging import CommitStager, writes_of
from ._store._records import MessageAttempt, MessageCommit, MessageFail, MessageOpen, MessageRef
from ._stream import StreamCore, StreamReader, StreamWriter, _Group, core_of, frontier_of
from ._tracing import ATTR, EVENT, SPAN, span
from ._unwrap import single_error

__all__ = ["REFUSED_OUTPUTS", "HandleResult", "MessageTx", "PartitionedResult", "handle_messages"]

S = TypeVar("S")
T = TypeVar("T")
U = TypeVar("U")

#: Messages taken from the tail at a time before the handler yields to other tasks.
_CHUNK = 64

#: What a handler may raise that is not its own failure: the engine refused a value, an output or
#: a confirmation. These end the run (after what was staged before commits); they never spend an
#: attempt of the message's budget.
NOT_A_HANDLER_FAILURE: Final = (
    PayloadTypeError,
    OutputLimitError,
    StreamStateError,
    CheckpointError,
    HandlerContractError,
)
#: A batch as the committer cuts it: the commits, the values of their outputs to publish, and the
#: context variables its ``commit`` runs in (the caller's, as it staged the batch's first message).
_Cut = tuple[list[MessageCommit], list[StagedOutputs], contextvars.Context | None]


def _held_by_one_local() -> int:
    """``sys.getrefcount`` of an object only one local variable holds, as this interpreter counts it.

    CPython 3.11 to 3.13 count the variable and the call's argument (2); an interpreter that borrows
    the argument's reference counts 1. Measured, not assumed, so that a transaction a handler kept
    (one reference more) is never taken for one only the loop holds.
    """
    probe = object()
    return sys.getrefcount(probe)


#: ``sys.getrefcount`` of a transaction only the handler's loop holds: its one local variable.
_UNSHARED: Final = _held_by_one_local()
#: The results of a message that set none (never mutated).
_NO_RESULTS: dict[str, bytes] = {}


class MessageTx(Generic[S]):
    """What a handler may do with one message; all of it is confirmed by one commit.

    The engine makes one per attempt, or resets the one of the message
    before when nothing kept it; handlers only use its methods and ``seq``,
    ``attempt`` and ``state``.
    """

    # A class of slots, not a Struct: the engine writes these for every message, and a slot's
    # write is the interpreter's fast path where a Struct's goes through its own setattr.
    __slots__ = (
        "_closed",
        "_outputs",
        "_results",
        "_run",
        "_state",
        "_state_payload",
        "_stopped",
        "_store",
        "attempt",
        "seq",
    )

    def __init__(self, run: _Run[Any, S], seq: int, attempt: int, state: S) -> None:
        self._run = run
        self.seq = seq
        self.attempt = attempt
        self._state = state
        self._state_payload: bytes | None = None
        # created on first use: most messages stage no results and few outputs
        self._outputs: list[tuple[StreamCore[Any], Any, bytes]] | None = None
        self._results: dict[str, bytes] | None = None
        self._stopped = False
        self._closed = False  # its handler call returned: the tx takes nothing more
        self._store: KeyedTx[Any, Any] | None = None  # tx.store, made on first use; it holds the keyed writes

    @property
    def store(self) -> KeyedTx[Any, Any]:
        """The group's keyed state (``handle_messages(..., keyed=KeyedState(K, V))``): ``await
        tx.store.get(k)``, ``tx.store.put(k, v)``, ``tx.store.delete(k)``, confirmed with this
        message's ack. ``KeyedState.of(tx)`` is the same, typed."""
        store = self._store
        if store is None:
            run = self._run
            if run.keyed is None:
                raise HandlerContractError(
                    f"message {self.seq}: the handler uses tx.store, but handle_messages was given no "
                    "keyed state; pass keyed=KeyedState(key_type, value_type) (nothing was confirmed, "
                    "no attempt was spent)"
                )
            store = self._store = KeyedTx(self.seq, run.keyed.spec, run.keyed, self._check_open)
        return store

    def __repr__(self) -> str:
        return f"MessageTx(seq={self.seq}, attempt={self.attempt})"

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StreamStateError(
                f"message {self.seq}: {what} after its handler call returned; a MessageTx is used only "
                "inside the call it was given to (what it stages afterwards would never be confirmed)"
            )

    if TYPE_CHECKING:

        @property
        def state(self) -> S:
            """The group's explicit state: the last committed (or staged) one, or the initial state."""
            ...

    else:
        # read for nearly every message: a getter in C, no Python frame (_NoStateTx checks it);
        # a partial, which takes the annotations that say what it returns
        _state_getter = functools.partial(attrgetter("_state"))
        _state_getter.__annotations__ = {"return": S}
        state = property(
            _state_getter,
            doc="The group's explicit state: the last committed (or staged) one, or the initial state.",
        )
        del _state_getter

    def set_state(self, state: S) -> None:
        """Replace the state; it is confirmed with this message's ack.

        :attr:`state` then returns the value as it reads back from the ledger
        (a copy), exactly what a restarted run would get.
        """
        if self._closed:
            self._check_open("set_state")
        codec = self._run.state_codec
        try:  # codec.prepare inline: once for nearly every message
            payload = encode_value(state)
            self._state = codec.read_back(payload)
        except PREPARE_ERRORS as exc:
            raise codec.refusal(state, exc, "the handler state") from None
        self._state_payload = payload

    def send(self, writer: StreamWriter[U], value: U) -> None:
        """Stage ``value`` for ``writer``'s stream, published only after this message commits."""
        if self._closed:
            self._check_open("send")
        run = self._run
        if writer is run.last_writer:  # a handler sends to the same writer, message after message
            stream = run.last_core
        else:
            stream = run.last_core = core_of(writer.stream)
            run.last_writer = writer
        outputs = self._outputs
        if outputs is None:
            outputs = self._outputs = []
        if len(outputs) >= run.max_outputs:
            raise OutputLimitError(
                f"message {self.seq} of {run.stream.ref} staged more than "
                f"{run.max_outputs} outputs; raise max_outputs or split the work"
            )
        codec = stream.codec
        try:  # codec.prepare inline
            payload = encode_value(value)
            read_back = codec.read_back(payload)
        except PREPARE_ERRORS as exc:
            raise codec.refusal(value, exc, stream.what) from None
        outputs.append((stream, read_back, payload))

    def set(self, key: Key[U], value: U) -> None:
        """Set an ordinary result; the last value set for a key wins."""
        if self._closed:
            self._check_open("set")
        if key.is_stream:
            raise TypeError(f"{key!r} is a stream key; send messages with tx.send(writer, value)")
        payload = codec_for(key.type).prepare(value, what=f"result {key.name!r}")[1]
        if self._results is None:
            self._results = {}
        self._results[key.name] = payload

    def stop(self) -> None:
        """Stop handling after this message; the stop is confirmed with its ack."""
        if self._closed:
            self._check_open("stop")
        self._stopped = True

    @property
    def message_id(self) -> str:
        """A stable identity of this message for this group: an idempotency key for effects."""
        run = self._run
        return f"{run.stream.ref}/{run.group.name}/{self.seq}"


class _NoStateTx(MessageTx[S]):
    """A :class:`MessageTx` of a run given no initial state, for a group with none committed."""

    __slots__ = ()

    if not TYPE_CHECKING:

        @property
        def state(self) -> S:
            """The group's explicit state: the last one staged, by this message or one before it; none
            was given or committed."""
            if self._state_payload is None and self._run.state_payload is self._run.initial_payload:
                raise HandlerContractError(
                    f"message {self.seq}: the handler reads tx.state, but handle_messages was given no "
                    f"initial_state and group {self._run.group_name!r} has no committed state; pass "
                    "initial_state=... (nothing was confirmed, no attempt was spent)"
                )
            return self._state


class HandleResult(msgspec.Struct, Generic[S], frozen=True, repr_omit_defaults=True):
    """What :func:`handle_messages` confirmed: messages handled, whether it stopped, the state.

    Read the committed ordinary results with :meth:`result`.
    """

    handled: int
    stopped: bool
    state: S
    _results: dict[str, bytes] = {}

    def result(self, key: Key[U]) -> U | NoValueType:
        """The committed value of an ordinary result, or ``NoValue`` if none was set."""
        raw = self._results.get(key.name)
        if raw is None:
            return NoValue
        value: U = codec_for(key.type).decode(raw, what=f"result {key.name!r}")
        return value

    def result_names(self) -> tuple[str, ...]:
        """The names of the keys a committed message set a result for."""
        return tuple(self._results)

    def __repr__(self) -> str:
        return f"HandleResult(handled={self.handled}, stopped={self.stopped})"


class PartitionedResult(msgspec.Struct, Generic[S], frozen=True):
    """What :func:`handle_messages` confirmed on a partitioned stream: each partition's result, in order."""

    partitions: tuple[HandleResult[S], ...]

    @property
    def handled(self) -> int:
        """The messages handled, over every partition."""
        return sum(p.handled for p in self.partitions)

    @property
    def stopped(self) -> bool:
        """Whether the handler stopped in every partition."""
        return all(p.stopped for p in self.partitions)


class _Run(Generic[T, S]):
    """One call of handle_messages."""

    #: Slots, not an instance dict: every message reads a dozen of these, and CPython 3.11 keeps an
    #: instance's attributes on its fast path only while its class's instances share at most 30 keys.
    __slots__ = (
        "attempts",
        "backoff",
        "batch_context",
        "commit_attributes",
        "dead_letter",
        "generation",
        "group",
        "group_attributes",
        "group_name",
        "handler",
        "initial_payload",
        "keyed",
        "last_core",
        "last_writer",
        "max_outputs",
        "node",
        "outputs",
        "parent_attempt",
        "pipeline",
        "process_attributes",
        "ref",
        "remaining",
        "share_state",
        "stager",
        "state",
        "state_codec",
        "state_payload",
        "state_what",
        "stopped",
        "stream",
        "task_group",
        "tx_type",
        "window",
    )

    def __init__(
        self,
        reader: StreamReader[T],
        handler: Callable[[MessageTx[S], T], Awaitable[None]],
        *,
        initial_state: S,
        state_codec: Codec[S],
        node: str,
        attempts: int,
        max_outputs: int,
        window: int,
        parent_attempt: str,
        limit: int | None,
        dead_letter: StreamWriter[Any] | None = None,
        backoff: Backoff | None = None,
        keyed: KeyedState[Any, Any] | None = None,
    ) -> None:
        self.stream: StreamCore[T] = core_of(reader.stream)
        self.dead_letter = dead_letter
        self.backoff = backoff
        self.remaining = limit
        self.group: _Group = frontier_of(reader)
        self.handler = handler
        self.state_codec = state_codec
        self.node = node
        self.attempts = attempts
        self.max_outputs = max_outputs
        self.window = window
        self.parent_attempt = parent_attempt
        self.state_what = f"the state of group {self.group.name!r}"
        # The state is kept as the bytes last staged or committed: every attempt gets its
        # own decoded copy, so an attempt that mutates it and fails leaves nothing behind.
        self.state_payload: bytes = (
            state_codec.prepare(initial_state, what="the initial state")[1]
            if self.group.state is None
            else self.group.state
        )
        #: Whether every attempt may see the same state object: only if it can never change.
        self.share_state = state_codec.immutable
        self.state: S = self._decode_state()
        #: The payload the run started from: while ``state_payload`` is this very object, no message
        #: staged a state of its own (what a run given no initial state tells by, at no cost a message).
        self.initial_payload = self.state_payload
        # What is staged but not yet handed to the store: the commits, and the values of
        # their outputs to publish. The committer cuts both at once, with no await in
        # between, so a batch publishes exactly the outputs of its commits.
        self.ref = self.stream.ref
        self.group_name = self.group.name
        self.generation = self.stream.generation
        self.stager = CommitStager(self.ref, self.group_name, self.generation, node, parent_attempt)
        self.outputs = OutputReservation(self, self.ref)
        # the attributes of its metrics, made once
        self.group_attributes = group_attributes(self.stream.destination, self.group_name)
        #: a commit settles the messages it confirms (OpenTelemetry's operation type)
        self.commit_attributes = {
            **self.group_attributes,
            ATTR.OPERATION: "commit",
            ATTR.OPERATION_TYPE: "settle",
        }
        #: OpenTelemetry's consumed-messages metric names its operation: a handler processes
        self.process_attributes = {
            **self.group_attributes,
            ATTR.OPERATION: "process",
            ATTR.OPERATION_TYPE: "process",
        }
        self.pipeline: ConfirmPipeline[_Cut] = ConfirmPipeline(
            cut=self._cut,
            confirm=self._confirm,
            land=self._land,
            fail=self._failed,
            context=_context_of,
            spawn=self._spawn,
            surface=True,
        )
        self.task_group: anyio.abc.TaskGroup | None = None  # where the committer runs
        self.batch_context: contextvars.Context | None = None  # as the next batch's first message staged
        self.stopped = False
        #: The transaction of each attempt: :class:`_NoStateTx` if no initial state was given and
        #: none was committed, which makes reading tx.state a contract error.
        self.tx_type: type[MessageTx[S]] = MessageTx
        #: The writer a handler sent to last, and its stream's core (``tx.send`` looks it up once).
        self.last_writer: StreamWriter[Any] | None = None
        self.last_core: StreamCore[Any] = self.stream
        self.keyed: KeyedCache | None = None
        if keyed is not None:
            self.keyed = KeyedCache(self.stream.hooks, keyed, self.ref, self.group_name, parent_attempt)
            if keyed.prefetch is not None:
                key_of, encode = keyed.prefetch, keyed.key_codec.encode
                self.keyed.key_of = lambda value: encode(key_of(value))

    def _decode_state(self) -> S:
        return self.state_codec.decode(self.state_payload, what=self.state_what)

    def _ref(self, seq: int) -> MessageRef:
        return MessageRef(self.ref, self.group_name, self.generation, seq)

    # -- the committer: its pipeline's steps ---------------------------------------------

    def _spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert self.task_group is not None
        self.task_group.start_soon(fn)

    def _cut(self) -> _Cut:
        # the commits and the values of their outputs at once: a batch publishes exactly its own
        context, self.batch_context = self.batch_context, None
        return self.stager.cut(), self.outputs.cut(), context

    async def _confirm(self, cut: _Cut) -> None:
        started = time.perf_counter()
        await self.stream.hooks.commit(cut[0])
        INSTRUMENTS.operation_duration.record(time.perf_counter() - started, self.commit_attributes)

    def _failed(self, cut: _Cut, exc: Exception) -> CheckpointError:
        """The outcome is unknown: latch the failure on every stream the batch touched."""
        batch = cut[0]
        if isinstance(exc, CheckpointError):
            error = exc
        else:
            start = f" from sequence {batch[0].message.seq}" if batch else ""
            error = CheckpointError(
                f"commit of {_count(batch)} messages of {self.stream.ref} "
                f"(group {self.group.name!r}){start} failed; recover from the ledger"
            )
            error.__cause__ = exc
        for touched_stream in (self.stream, *self.outputs.writes):
            touched_stream.latch(error)
        return error

    def _land(self, cut: _Cut) -> None:
        """Apply a confirmed batch locally, in order as the store applied it; publish; wake."""
        batch, outputs, _ = cut
        stream, group = self.stream, self.group
        publish(outputs)
        keyed = self.keyed
        for c in batch:
            if c.state is not None:
                group.state = c.state
            if c.results:
                group.results.update(c.results)
            if c.keyed and keyed is not None:
                keyed.landed(c.keyed, c.last_seq)
        if batch[-1].stop:  # a stop ends the handler's staging: it is always last
            group.stopped = True
        # ascending, as the handler took them: a range unless some were acked out of order
        count = _count(batch)
        first, last = batch[0].message.seq, batch[-1].last_seq
        seqs: Sequence[int] = (
            range(first, last + 1)
            if last - first == count - 1
            else [s for c in batch for s in range(c.message.seq, c.last_seq + 1)]
        )
        stream.local_ack_many(group, seqs)
        INSTRUMENTS.consumed.add(count, self.process_attributes)
        INSTRUMENTS.commit_batch_size.record(count, self.group_attributes)
        for staged in outputs:
            INSTRUMENTS.sent.add(len(staged.values), staged.stream.append_attributes)
        if group.failing:
            group.failing.difference_update(seqs)
        if group.exhausted:
            group.exhausted.difference_update(seqs)
        stream.notify()
        notify(outputs)

    async def drain(self) -> None:
        """Wait until every staged message is committed."""
        await self.pipeline.drain()

    # -- the handler side ---------------------------------------------------------------

    async def consume(self) -> None:
        stream, group = self.stream, self.group
        if group.stopped:
            self.stopped = True
            return
        first = True
        #: The transaction of the last first attempt, if nothing kept it when its handler returned:
        #: the next first attempt's, reset, not a new one each message.
        spare: MessageTx[S] | None = None
        while not self.stopped:
            stream.check_healthy()
            if self.remaining is not None and self.remaining <= 0:
                return
            room = min(self.window - self.pipeline.in_flight, _CHUNK)
            if self.remaining is not None:
                room = min(room, self.remaining)
            seqs, values = stream.take_ready(group, room) if room > 0 else ((), [])
            if not seqs:
                if room <= 0:
                    await self.pipeline.wait_progress()
                elif stream.at_end(group):
                    await self.drain()
                    if stream.failed:
                        raise StreamFailedError(
                            f"the writer of stream {stream.ref} failed; group {group.name!r} "
                            f"handled everything it confirmed"
                        )
                    return
                else:
                    await stream.wait_change()
                continue
            if self.keyed is not None:
                self.keyed.upcoming = values  # read along with the first key the cache misses
                if self.keyed.sweeps:  # a page of its keys every so many messages: the gone go
                    await self.keyed.sweep(len(values))
            failing, exhausted, handler = group.failing, group.exhausted, self.handler
            stager, pipeline, reservation, tx_type = self.stager, self.pipeline, self.outputs, self.tx_type
            for seq, value in zip(seqs, values, strict=True):
                if first or (failing and seq in failing) or (exhausted and seq in exhausted):
                    # its confirmed budget first: the run's first message, a retry, a dead letter
                    await self._handle_opened(seq, value, first)
                    first = False
                    if self.stopped:
                        break
                    continue
                # A first attempt, the handler called inline. What follows until the count is
                # _stage's work for a first attempt, inline: the message joins the open run.
                if spare is None:
                    tx = tx_type(self, seq, 0, self.state if self.share_state else self._decode_state())
                else:
                    tx, spare = spare, None
                    tx.seq = seq
                    tx._state = self.state if self.share_state else self._decode_state()
                    tx._closed = False
                failure: Exception | None = None
                try:
                    await handler(tx, value)
                except NOT_A_HANDLER_FAILURE:
                    await self.drain()  # what was staged before this message still commits
                    raise
                except Exception as exc:
                    failure = exc
                finally:
                    tx._closed = True
                if failure is not None:
                    # outside the except block: retries do not run inside this failure
                    await self._retried(seq, value, 0, failure)
                    failure = None
                    if self.stopped:
                        break
                    continue
                outputs = tx._outputs
                if outputs and not reservation.fits(seq, outputs):
                    await self._wait_for_room(seq, outputs)
                # from here to the count no await: the committer cuts the message whole or not at all
                state = tx._state_payload
                if state is not None:
                    self.state = tx._state
                    self.state_payload = state
                if (
                    seq == stager.last + 1
                    and stager.first
                    and tx._results is None
                    and tx._store is None
                    and not tx._stopped
                ):
                    stager.last = seq  # stager.run_message inline: the ack and the state join the run
                    if state is not None:
                        stager.state = state
                else:
                    self._join_run(tx)
                if outputs:
                    if len(outputs) == 1:
                        reservation.reserve_one(outputs[0], stager)
                    else:
                        reservation.reserve(outputs, stager)
                if self.batch_context is None:  # _count_staged inline, with pipeline.stage
                    self.batch_context = contextvars.copy_context()
                if pipeline.failure is not None:
                    raise pipeline.failure
                pipeline.staged += 1
                if not pipeline.running:
                    pipeline.start()
                if self.remaining is not None:
                    self.remaining -= 1
                if tx._stopped:
                    self.stopped = True
                    break
                if tx._results is None and tx._store is None and sys.getrefcount(tx) == _UNSHARED:
                    # only this frame holds it (the handler kept no reference, so none can use it
                    # again): reset, it is the next first attempt's
                    tx._state_payload = None
                    tx._outputs = None
                    spare = tx
            if not self.pipeline.confirming:
                await anyio.lowlevel.checkpoint()

    async def _handle_opened(self, seq: int, value: T, first: bool) -> None:
        """Handle message ``seq`` after reading its confirmed budget: route it to the dead letters
        if it is exhausted, else wait out its backoff, call the handler, and stage it."""
        attempt = await self._open(seq, first)
        if attempt.exhausted:  # with a dead-letter stream: route it there, handle nothing
            await self._dead_letter(seq, value, attempt)
            return
        index = attempt.index
        await self._wait_backoff(attempt)
        tx = self.tx_type(self, seq, index, self.state if self.share_state else self._decode_state())
        failure: Exception | None = None
        try:
            await self.handler(tx, value)
        except NOT_A_HANDLER_FAILURE:
            await self.drain()  # what was staged before this message still commits
            raise
        except Exception as exc:
            failure = exc
        finally:
            tx._closed = True
        if failure is not None:
            # outside the except block: retries do not run inside this failure
            await self._retried(seq, value, index, failure)
            return
        if tx._outputs and not self.outputs.fits(seq, tx._outputs):
            await self._wait_for_room(seq, tx._outputs)
        self._stage(tx)

    async def _retried(self, seq: int, value: T, index: int, failure: Exception) -> None:
        """Confirm the failure of attempt ``index`` and retry until one succeeds; stage it, or its
        dead letter once it is exhausted (with a dead-letter stream)."""
        retried = await self._retry(seq, value, index, failure)
        if isinstance(retried, MessageAttempt):  # exhausted, with a dead-letter stream
            await self._dead_letter(seq, value, retried)
            return
        if retried._outputs and not self.outputs.fits(seq, retried._outputs):
            await self._wait_for_room(seq, retried._outputs)
        self._stage(retried)

    def _count_staged(self) -> None:
        """Count a message just staged; the first of a batch copies the caller's context variables."""
        if self.batch_context is None:  # one copy a batch, not a message
            self.batch_context = contextvars.copy_context()
        self.pipeline.stage()

    async def _reliable(self, call: Callable[[], Awaitable[MessageAttempt]], what: str) -> MessageAttempt:
        """One budget call: none from a cancelled caller; once made, shielded to its answer; any failure
        of it (a cancellation the store raised included) latched on the stream (:mod:`streams._outcome`)."""
        await accept()
        try:
            with anyio.CancelScope(shield=True):
                attempt = await call()
        except BaseException as exc:
            if not is_fault(exc, shielded=True):
                raise
            raise self.stream.latch(exc, what)  # noqa: B904 - the latched error keeps its cause
        return attempt

    async def _open(self, seq: int, first: bool) -> MessageAttempt:
        """The message's confirmed budget; an exhausted one raises unless it goes to the dead letters."""
        if self.pipeline.in_flight:
            await self.drain()
        request = MessageOpen(
            message=self._ref(seq), node=self.node, limit=self.attempts, parent_attempt=self.parent_attempt
        )
        attempt = await self._reliable(
            lambda: self.stream.hooks.open_message(request), f"opening message {seq}"
        )
        if first and attempt.state is not None:
            self.state_payload = attempt.state
            self.state = self._decode_state()
        if attempt.exhausted:
            if self.dead_letter is not None:
                self.group.exhausted.add(seq)
                return attempt
            self._exhausted(seq, attempt.index, None)
        return attempt

    async def _wait_for_room(self, seq: int, outputs: list[tuple[StreamCore[Any], Any, bytes]]) -> None:
        """Wait until message ``seq``'s outputs fit their streams; a refusal ends the run after a drain."""
        try:
            while not self.outputs.room_for(seq, outputs):
                await self.outputs.wait_for_room(outputs)
        except REFUSED_OUTPUTS:
            await self.drain()  # what was staged before this message still commits
            raise

    async def _wait_backoff(self, attempt: MessageAttempt) -> None:
        """Wait out the delay the backoff sets after the message's last confirmed failure."""
        if self.backoff is None or attempt.index < 1:
            return
        due = attempt.failed_at + self.backoff.delay(attempt.index)
        wait = due - time.time()
        if wait > 0:
            await anyio.sleep(wait)

    async def _dead_letter(self, seq: int, value: T, attempt: MessageAttempt) -> None:
        """Stage the exhausted message's ack with its dead letter, one commit of its own."""
        writer = self.dead_letter
        assert writer is not None
        letter = DeadLetter(
            source=str(self.ref),
            seq=seq,
            group=self.group_name,
            node=self.node,
            attempts=attempt.index,
            error_type=attempt.error_type,
            message=value,
        )
        target = core_of(writer.stream)
        read_back, payload = target.codec.prepare(letter, what=target.what)
        outputs: list[tuple[StreamCore[Any], Any, bytes]] = [(target, read_back, payload)]
        if not self.outputs.fits(seq, outputs):
            await self._wait_for_room(seq, outputs)
        self.stager.single(
            MessageCommit(
                self._ref(seq),
                self.node,
                attempt.index,
                None,
                _NO_RESULTS,
                self.outputs.reserve(outputs, None),
                False,
                self.parent_attempt,
                dead_letter=True,
                limit=self.attempts,
            )
        )
        self._count_staged()
        if self.remaining is not None:
            self.remaining -= 1
        INSTRUMENTS.dead_lettered.add(1, self.group_attributes)
        current = get_current_span()
        if current.is_recording():
            current.add_event(
                EVENT.DEAD_LETTERED,
                {
                    ATTR.SEQ: seq,
                    ATTR.ATTEMPTS: attempt.index,
                    ATTR.ERROR_TYPE: attempt.error_type,
                    ATTR.DEAD_LETTER: str(target.ref),
                },
            )

    def _exhausted(self, seq: int, index: int, cause: BaseException | None) -> None:
        message = self._ref(seq)
        self.group.exhausted.add(seq)
        error = MessageExhaustedError(
            f"{message} used its whole budget of {self.attempts} attempt(s) in node {self.node!r} "
            f"({index} confirmed failures); it is not skipped: fix the cause, then handle it under "
            "a new parent_attempt, which has a budget of its own"
        )
        if cause is not None:
            raise error from cause
        raise error

    async def _retry(self, seq: int, value: T, index: int, exc: Exception) -> MessageTx[S] | MessageAttempt:
        """Confirm the failure ``exc`` of attempt ``index``, then retry until one succeeds.

        An exhausted message raises :class:`MessageExhaustedError`, or with a
        dead-letter stream returns its exhausted budget for routing.
        """
        while True:
            attempt = await self._fail(seq, index, exc)
            if attempt.exhausted:
                return attempt
            await self._wait_backoff(attempt)
            index = attempt.index
            tx: MessageTx[S] = self.tx_type(
                # its own copy of the state, unless the state can never change
                self,
                seq,
                index,
                self.state if self.share_state else self._decode_state(),
            )
            try:
                await self.handler(tx, value)
            except NOT_A_HANDLER_FAILURE:
                await self.drain()  # what was staged before this message still commits
                raise
            except Exception as error:
                exc = error
                continue
            finally:
                tx._closed = True
            return tx

    async def _fail(self, seq: int, index: int, exc: Exception) -> MessageAttempt:
        await self.drain()
        request = MessageFail(
            message=self._ref(seq),
            node=self.node,
            limit=self.attempts,
            index=index,
            parent_attempt=self.parent_attempt,
            error_type=type(exc).__qualname__,
            at=time.time(),
        )
        # refused if the handler failed after a cancellation reached it: that spends no budget
        attempt = await self._reliable(
            lambda: self.stream.hooks.fail_message(request), "confirming a failed attempt"
        )
        failure_attributes = {**self.group_attributes, ATTR.ERROR_KIND: type(exc).__qualname__}
        INSTRUMENTS.failed_attempts.add(1, failure_attributes)
        # on the run's span: a retry is visible even when it then succeeds, and so is exhaustion
        current = get_current_span()
        recording = current.is_recording()
        if recording:
            current.add_event(
                EVENT.ATTEMPT_FAILED,
                {ATTR.SEQ: seq, ATTR.ATTEMPTS: index + 1, ATTR.ERROR_TYPE: type(exc).__qualname__},
            )
        if attempt.exhausted:
            INSTRUMENTS.exhausted.add(1, failure_attributes)
            if recording:
                current.add_event(
                    EVENT.BUDGET_EXHAUSTED,
                    {ATTR.SEQ: seq, ATTR.ATTEMPTS: attempt.index, ATTR.ERROR_TYPE: type(exc).__qualname__},
                )
            if self.dead_letter is not None:
                self.group.failing.discard(seq)
                self.group.exhausted.add(seq)
                return attempt
            self._exhausted(seq, attempt.index, exc)
        self.group.failing.add(seq)
        return attempt

    def _stage(self, tx: MessageTx[S]) -> None:
        """Stage ``tx`` for the next commit batch; from here on it is the committer's.

        Synchronous: its outputs are reserved and join the staged set in the
        same step, so the committer publishes them with their own batch. (The
        handler's loop does the same inline for a first attempt.)
        """
        seq = tx.seq
        state = tx._state_payload
        if state is not None:
            self.state = tx._state
            self.state_payload = state
        outputs = tx._outputs
        exhausted = self.group.exhausted
        if tx.attempt == 0 and not (exhausted and seq in exhausted):
            # a first attempt: it joins the run of first attempts that one commit confirms
            self._join_run(tx)
            if outputs:
                self.outputs.reserve(outputs, self.stager)
        else:
            # a retry, or a message exhausted under another parent attempt: a commit of its
            # own, so the store forgets its budget record with it
            writes = self._keyed_writes(tx)
            self.stager.single(
                MessageCommit(
                    self._ref(seq),
                    self.node,
                    tx.attempt,
                    state,
                    tx._results or _NO_RESULTS,
                    self.outputs.reserve(outputs, None) if outputs else (),
                    tx._stopped,
                    self.parent_attempt,
                    keyed=writes_of(writes) if writes else (),
                )
            )
        self._count_staged()
        if self.remaining is not None:
            self.remaining -= 1
        if tx._stopped:
            self.stopped = True

    def _join_run(self, tx: MessageTx[S]) -> None:
        """First attempt ``tx`` joins the stager's open run (its outputs are reserved after it)."""
        self.stager.run_message(tx.seq, tx._state_payload, tx._results, tx._stopped, self._keyed_writes(tx))

    def _keyed_writes(self, tx: MessageTx[S]) -> dict[bytes, bytes | None] | None:
        """The keyed writes ``tx`` staged, now staged in the cache too: later reads see them."""
        store = tx._store
        keyed = self.keyed
        writes = None if store is None else store.writes
        if keyed is not None and keyed.gone:  # the keys a sweep found gone go with this message
            writes = keyed.take_gone(writes)
        if writes and keyed is not None:
            keyed.stage(writes, tx.seq)
        return writes


#: handle_messages was given no initial_state (None is a state one may give).
_NO_STATE: Final[Any] = object()


def _is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` surely gives a coroutine: an async function, or an object with one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)


def _awaitable_checked(handler: Callable[..., Any]) -> Handler[Any, Any]:
    """``handler`` (not known to be async) checked to return an awaitable, a contract error if not."""

    async def checked(tx: MessageTx[Any], value: Any) -> None:
        result = handler(tx, value)
        if not inspect.isawaitable(result):
            raise HandlerContractError(
                f"the handler {getattr(handler, '__qualname__', handler)!r} returned "
                f"{type(result).__qualname__}, not an awaitable: declare it `async def` (message "
                f"{tx.seq} ran once and stays unconfirmed; no attempt was spent)"
            )
        await result

    return checked


def _context_of(cut: _Cut) -> contextvars.Context:
    """Where a batch's ``commit`` runs: the caller's context variables as it staged the first message."""
    context = cut[2]
    assert context is not None, "a batch confirmed holds a staged message"
    return context


def _count(batch: list[MessageCommit]) -> int:
    """How many messages a batch of commits confirms."""
    return batch[0].count if len(batch) == 1 else sum(c.count for c in batch)


Handler = Callable[[MessageTx[S], T], Awaitable[None]]


@overload
async def handle_messages(
    reader: StreamReader[T],
    handler: Handler[None, T],
    *,
    node: str | None = None,
    attempts: int = 1,
    max_outputs: int = 64,
    window: int = 1024,
    parent_attempt: str = "",
    limit: int | None = None,
    dead_letter: StreamWriter[DeadLetter[T]] | None = None,
    backoff: Backoff | None = None,
    keyed: KeyedState[Any, Any] | None = None,
    concurrency: int | None = None,
) -> HandleResult[None]: ...


@overload
async def handle_messages(
    reader: StreamReader[T],
    handler: Handler[S, T],
    *,
    initial_state: S,
    state_type: Any = None,
    node: str | None = None,
    attempts: int = 1,
    max_outputs: int = 64,
    window: int = 1024,
    parent_attempt: str = "",
    limit: int | None = None,
    dead_letter: StreamWriter[DeadLetter[T]] | None = None,
    backoff: Backoff | None = None,
    keyed: KeyedState[Any, Any] | None = None,
    concurrency: int | None = None,
) -> HandleResult[S]: ...


@overload
async def handle_messages(
    reader: PartitionedReader[T],
    handler: Handler[None, T],
    *,
    node: str | None = None,
    attempts: int = 1,
    max_outputs: int = 64,
    window: int = 1024,
    parent_attempt: str = "",
    limit: int | None = None,
    dead_letter: StreamWriter[DeadLetter[T]] | None = None,
    backoff: Backoff | None = None,
    keyed: KeyedState[Any, Any] | None = None,
    concurrency: int | None = None,
) -> PartitionedResult[None]: ...


@overload
async def handle_messages(
    reader: PartitionedReader[T],
    handler: Handler[S, T],
    *,
    initial_state: S,
    state_type: Any = None,
    node: str | None = None,
    attempts: int = 1,
    max_outputs: int = 64,
    window: int = 1024,
    parent_attempt: str = "",
    limit: int | None = None,
    dead_letter: StreamWriter[DeadLetter[T]] | None = None,
    backoff: Backoff | None = None,
    keyed: KeyedState[Any, Any] | None = None,
    concurrency: int | None = None,
) -> PartitionedResult[S]: ...


async def handle_messages(
    reader: StreamReader[Any] | PartitionedReader[Any],
    handler: Handler[Any, Any],
    *,
    initial_state: Any = _NO_STATE,
    state_type: Any = None,
    node: str | None = None,
    attempts: int = 1,
    max_outputs: int = 64,
    window: int = 1024,
    parent_attempt: str = "",
    limit: int | None = None,
    dead_letter: StreamWriter[Any] | None = None,
    backoff: Backoff | None = None,
    keyed: KeyedState[Any, Any] | None = None,
    concurrency: int | None = None,
) -> HandleResult[Any] | PartitionedResult[Any]:
    """Handle every message of ``reader``'s group, one confirmed transaction each.

    ``handler(tx, value)`` reads ``tx.state``, may ``tx.set_state(...)``,
    ``tx.send(writer, msg)``, ``tx.set(key, value)`` and ``tx.stop()``. If it
    raises, the failure is confirmed before the next attempt; a message that
    fails ``attempts`` times raises :class:`MessageExhaustedError`, here and
    after every restart. Returns when the stream ends or the handler stops;
    raises :class:`StreamFailedError` if the writer failed.

    ``node`` names the processing node in message budgets (default: the
    group). ``max_outputs`` bounds the messages one message may stage;
    ``window`` bounds the messages staged but not yet committed. ``limit``
    returns after that many messages (a pause, not a confirmed stop).

    ``dead_letter`` (the writer of a ``Stream[DeadLetter[T]]``) takes a
    message that exhausted its budget instead of raising: its
    :class:`DeadLetter` (source, sequence, group, node, attempts, the error's
    type, the message) is appended in the same commit as its ack, and the
    group moves on. ``backoff`` (a :class:`Backoff`) delays each retry after a
    confirmed failure, counted from the failure's time in the ledger, so a
    restart does not retry sooner.

    ``keyed`` (a :class:`KeyedState`) gives the group a value per key:
    ``await tx.store.get(k)``, ``tx.store.put(k, v)`` and
    ``tx.store.delete(k)``, confirmed with the message's ack, owned by the
    parent attempt as the explicit state is, and read from the store only
    for a key the handler never saw (the store must be a
    :class:`~streams.store.KeyedHooks`).

    ``reader`` may be a partitioned stream's (:class:`PartitionedReader`):
    every partition is handled at once, each in order and with its own
    state, keyed state and budgets, and the call returns a
    :class:`PartitionedResult` once every partition returned (``limit``
    counts per partition). A failure in one stops them all.
    ``concurrency=K`` makes K group members of this process: member ``m``
    owns the partitions ``p`` with ``p % K == m`` and runs the handler for
    one message at a time across them, so at most K handler calls run at
    once while every partition keeps its own loop, frontier and commits
    (K above the number of partitions N is N members: the others own
    nothing). The default, None, is a member per partition. A plain
    :class:`StreamReader` takes only None or 1, its single handler.

    Programming errors stop the call before they spend any attempt, with
    :class:`HandlerContractError`: a handler that is not async (it returns
    something that cannot be awaited), or one that reads ``tx.state`` when
    no ``initial_state`` was given and the group has none committed.
    """
    if concurrency is not None:
        _check_concurrency(reader, concurrency)
    if isinstance(reader, PartitionedReader):
        if dead_letter is not None:
            raise HandlerContractError(
                f"{reader!r}: a dead-letter stream takes the letters of one partition's handler; handle "
                "each partition (reader.partitions) with a dead-letter stream of its own"
            )
        return await _handle_partitions(
            reader,
            handler,
            concurrency,
            initial_state=initial_state,
            state_type=state_type,
            node=node,
            attempts=attempts,
            max_outputs=max_outputs,
            window=window,
            parent_attempt=parent_attempt,
            limit=limit,
            backoff=backoff,
            keyed=keyed,
        )
    if not callable(handler):
        raise HandlerContractError(f"handle_messages takes an async handler(tx, value), got {handler!r}")
    if not _is_async(handler):
        handler = _awaitable_checked(handler)
    given_state = initial_state is not _NO_STATE
    if not given_state:
        initial_state = None
    if node is not None:
        check_name(node, "a node name")
    try:
        parent_attempt.encode()
    except UnicodeEncodeError:
        raise ValueError(f"parent_attempt must be valid UTF-8 text, got {parent_attempt!r}") from None
    if attempts < 1 or max_outputs < 0 or window < 1 or (limit is not None and limit < 0):
        raise ValueError("attempts and window must be at least 1, max_outputs and limit at least 0")
    group = frontier_of(reader)
    stream = core_of(reader.stream)
    if dead_letter is not None:
        check_dead_letter_writer(dead_letter, stream)
    if backoff is not None and not isinstance(backoff, Backoff):
        raise TypeError(f"backoff takes a Backoff, got {backoff!r}")
    if keyed is not None and not isinstance(keyed, KeyedState):
        raise TypeError(f"keyed takes a KeyedState, got {keyed!r}")
    if group.claimed:
        raise GroupBusyError(f"group {group.name!r} of stream {stream.ref} already has a handler")
    if state_type is None:
        state_type = Any if initial_state is None else type(initial_state)
    state_codec: Codec[Any] = Codec(state_type)
    stream.check_healthy()  # a stream whose confirmation failed is recovered by reopening it
    group.own(parent_attempt)  # another parent attempt's state and results never reach this one
    run: _Run[Any, Any] = _Run(
        reader,
        handler,
        initial_state=initial_state,
        state_codec=state_codec,
        node=node or group.name,
        attempts=attempts,
        max_outputs=max_outputs,
        window=window,
        parent_attempt=parent_attempt,
        limit=limit,
        dead_letter=dead_letter,
        backoff=backoff,
        keyed=keyed,
    )
    if not given_state and group.state is None:
        run.tx_type = _NoStateTx
    group.claimed = True
    group.cursor = group.acked_through  # messages received but not acked are handled too, in order
    try:
        # the span outside single_error: it records the error the caller gets, never a group
        with (
            span(
                SPAN.PROCESS.format(destination=stream.template),
                {
                    **run.process_attributes,
                    ATTR.DESTINATION: str(stream.ref),  # a span may name the run: its full name
                    ATTR.STREAM: str(stream.ref),
                    ATTR.GROUP: group.name,
                },
                kind=SpanKind.CONSUMER,
            ) as current,
            single_error(),
        ):
            async with anyio.create_task_group() as run.task_group:
                await run.consume()
                await run.drain()
            current.set_attribute(ATTR.HANDLED, run.pipeline.landed)
    finally:
        group.claimed = False
        group.cursor = group.acked_through
        run.outputs.release()
    return HandleResult(run.pipeline.landed, run.stopped, run.state, dict(group.results))


def _check_concurrency(reader: StreamReader[Any] | PartitionedReader[Any], concurrency: object) -> None:
    """Refuse a ``concurrency`` that is not a count of members, or more than one member of a plain stream."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ValueError(f"concurrency takes a number of members, at least 1, or None; got {concurrency!r}")
    if concurrency > 1 and not isinstance(reader, PartitionedReader):
        raise ValueError(
            f"concurrency={concurrency} takes a partitioned stream's reader: group {reader.group!r} of "
            f"stream {reader.stream.ref} has one handler"
        )


def _one_at_a_time(handler: Handler[Any, Any]) -> Handler[Any, Any]:
    """``handler`` for one member: one call at a time, whichever of the member's partitions makes it."""
    # fast_acquire: an uncontended call takes no extra checkpoint; each partition's loop yields anyway
    lock = anyio.Lock(fast_acquire=True)

    async def member(tx: MessageTx[Any], value: Any) -> None:
        async with lock:
            await handler(tx, value)

    return member


async def _handle_partitions(
    reader: PartitionedReader[Any], handler: Handler[Any, Any], concurrency: int | None, **options: Any
) -> PartitionedResult[Any]:
    """Every partition of ``reader`` handled at once; their results in order, or the one failure.

    With ``concurrency`` below the number of partitions, partition ``p`` calls
    the handler of member ``p % concurrency``, which makes one call at a time.
    """
    parts = reader.partitions
    handlers: list[Handler[Any, Any]] = [handler] * len(parts)
    if concurrency is not None and concurrency < len(parts):
        # the contract checks first: the wrapper is async whatever it wraps, and would hide a sync handler
        if not callable(handler):
            raise HandlerContractError(f"handle_messages takes an async handler(tx, value), got {handler!r}")
        checked = handler if _is_async(handler) else _awaitable_checked(handler)
        members = [_one_at_a_time(checked) for _ in range(concurrency)]
        handlers = [members[p % concurrency] for p in range(len(parts))]
    results: list[HandleResult[Any] | None] = [None] * len(parts)
    failures: list[Exception] = []  # the first is raised: partitions failing at once raise one error

    async def partition(index: int, part: StreamReader[Any]) -> None:
        try:
            result = await handle_messages(part, handlers[index], **options)
        except Exception as exc:
            failures.append(exc)
            tg.cancel_scope.cancel()  # the others stop: their confirmed work stays confirmed
            return
        assert isinstance(result, HandleResult)
        results[index] = result

    with single_error():
        async with anyio.create_task_group() as tg:
            for index, part in enumerate(parts):
                tg.start_soon(partition, index, part)
    if failures:
        raise failures[0]
    return PartitionedResult(tuple(r for r in results if r is not None))
