"""Run and Resume for business hosts: a graph run in checkpoint mode on the ledger, by run id.

``await ledger.run(graph, inputs, run_id="order-42")`` records the run (its
graph, version, topology fingerprint and the inputs, encoded) and executes
the graph with complete-node checkpoints under scope ``run_id``. If the
process dies, ``await ledger.resume("order-42", graph)`` checks that the
graph is the one the run started with, rebuilds the inputs from the record,
restores every confirmed node without running it and runs the rest from
their function's entry. A run whose final failure was confirmed stays
failed: resuming it raises :class:`~streams.ConfirmedFailureError` before
anything starts, and a new run of the same work needs a new run id. A
finished run resumed returns its result and runs nothing.

A run's identity includes what decides its retry budgets. A persistent
:class:`~streams.Retry` keys its budget by its position in the node's chain,
and the execution's own aspects (``aspects=``) come first in every chain, so
the record keeps the chain the run started with, one
:func:`~streams.describe_aspect` line per aspect, and a resume given
another chain is :class:`RunAspectsMismatchError` before anything is
written or run: with one more aspect every Retry would sit one place
further and find a fresh budget. A record that holds no chain
(``aspects`` is ``None``) is accepted with whatever chain the
resume is given, and that chain is recorded by the first resume that runs
something; from then on it is checked. The aspects a graph's nodes and
mounts declare are part of the graph, not of this record: change the
graph's ``version`` when they change (:class:`~streams.Topology`).

Within a process a run id is run by one execution at a time
(:class:`RunActiveError`). Where the run records live is a :class:`RunBook`:
the LMDB ledger's ``nodes`` database, or a PostgreSQL table.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, Protocol

import msgspec

from streams import (
    Aspect,
    ConfirmedFailureError,
    ExecCheckpoint,
    Execution,
    ExecutionEvent,
    ExecutionResult,
    Graph,
    Key,
    NoValue,
    Topology,
    describe_aspect,
)
from streams.store import CheckpointOutput, codec_for, parse_attempt_scope

from ._errors import (
    InvalidRunIdError,
    RunActiveError,
    RunAspectsMismatchError,
    RunCancelledError,
    RunExistsError,
    RunFinishedError,
    RunInputsMismatchError,
    RunMismatchError,
    RunNotEndedError,
    UnknownRunError,
)
from ._format import run_id_bytes
from ._identity import input_differences, listed, topology_differences
from ._run_tracing import traced_run

__all__ = [
    "RunBook",
    "RunCancel",
    "RunDeleted",
    "RunRecord",
    "RunResult",
    "RunRetry",
    "Runs",
]

FORMAT_VERSION: Final = 1


class RunCancel(msgspec.Struct, frozen=True):
    """Who cancelled a run, why, and when (Unix seconds)."""

    by: str
    reason: str
    at: float


class RunRetry(msgspec.Struct, frozen=True):
    """A retry of a run that had ended without completing: who asked, why, when, and how it had ended."""

    by: str
    reason: str
    at: float
    ended: Literal["failed", "cancelled"]  # the status of the root attempt it replaced
    error: str | None = None  # that attempt's confirmed final failure (its type), if it failed


#: A retried run's root scope: ``{run_id}/retry.{n}``; a new run id of that form is refused.
_RETRY_SCOPE: Final = re.compile(r"/retry\.[0-9]+\Z")


def root_scope(run_id: str, attempt: int) -> str:
    """The checkpoint scope of root attempt ``attempt`` of run ``run_id``: the run id for the first.

    A retry runs the graph again under a new root attempt, whose scope is
    apart from the earlier ones (no record of theirs is borrowed, no budget
    of theirs is spent) and whose streams are new.
    """
    return run_id if attempt == 0 else f"{run_id}/retry.{attempt}"


def in_root_scope(scope: str, root: str) -> bool:
    """Whether the records of ``scope`` belong to the run attempt of root scope ``root``.

    ``scope`` is ``root`` itself, or a scope the engine opens under it: an
    attempt scope ``root/node@p.l.i...``. A scope of a retry
    (``root/retry.n``) or of another run whose id starts with ``root/`` does
    not belong.
    """
    if scope == root:
        return True
    if not scope.startswith(root + "/"):
        return False
    first = scope[len(root) + 1 :].split("/", 1)[0]
    return parse_attempt_scope(f"{root}/{first}") is not None


class RunRecord(msgspec.Struct, frozen=True):
    """What the ledger keeps of a graph run besides its node records."""

    format_version: int
    run_id: str
    graph: str
    version: str
    fingerprint: str
    inputs: tuple[CheckpointOutput, ...]
    status: Literal["running", "completed", "failed", "cancelled"] = "running"
    starts: int = 1  # executions started: the first run and each resume that ran something (0: submitted)
    error: str | None = None  # the type of a confirmed final failure, never its text
    #: The execution's aspect chain, outermost first, as :func:`~streams.describe_aspect` gives it;
    #: ``None`` in a record that holds none (filled in by the next resume that runs).
    aspects: tuple[str, ...] | None = None
    #: The graph's topology shape (:attr:`streams.Topology.shape`), to say what differs when another
    #: graph is given; ``None`` in a record that holds none.
    shape: dict[str, Any] | None = None
    #: When the run was recorded, and when its record last changed (a start, a resume, its end):
    #: Unix seconds, ``None`` in a record that holds none.
    created_at: float | None = None
    updated_at: float | None = None
    #: The cancel that ended it (status ``cancelled``): its attempts stay as the cancellation left them.
    cancelled: RunCancel | None = None
    #: The root attempt running now: 0 for the first, one more for each retry (:attr:`retries`).
    attempt: int = 0
    retries: tuple[RunRetry, ...] = ()

    @property
    def scope(self) -> str:
        """The checkpoint scope of the run's current root attempt (:func:`root_scope`)."""
        return root_scope(self.run_id, self.attempt)

    @property
    def scopes(self) -> tuple[str, ...]:
        """The root scopes of every attempt of the run, the first first."""
        return tuple(root_scope(self.run_id, n) for n in range(self.attempt + 1))


def stamped(record: RunRecord, *, new: bool = False) -> RunRecord:
    """``record`` as written now: its ``updated_at`` (and, for a new run, ``created_at``) set to now."""
    now = time.time()
    return msgspec.structs.replace(record, updated_at=now, created_at=now if new else record.created_at)


class RunDeleted(msgspec.Struct, frozen=True):
    """What deleting a run removed: its record, and the records and streams of every attempt of it."""

    run_id: str
    streams: int  # the streams its nodes and its host wrote
    messages: int  # the messages those streams held
    records: int  # its node records: retry boundaries, scopes and confirmed nodes


class RunResult(msgspec.Struct, frozen=True):
    """A run's outcome: the root graph's keys and node statuses, and how this call got there."""

    run_id: str
    result: ExecutionResult
    resumed: bool = False
    already_finished: bool = False


def encode_inputs(graph: Graph, inputs: Mapping[Key[Any], Any]) -> tuple[CheckpointOutput, ...]:
    encoded = []
    for key in graph.inputs:
        if key.is_stream:  # written by the host while the run runs, never a value of the record
            continue
        value = inputs.get(key, NoValue)
        if value is NoValue:
            encoded.append(CheckpointOutput(key.name, "skipped"))
        else:
            _, payload = codec_for(key.type).prepare(value, what=f"input {key!r}")
            encoded.append(CheckpointOutput(key.name, "ready", payload))
    return tuple(encoded)


def decode_inputs(graph: Graph, record: RunRecord) -> dict[Key[Any], Any]:
    keys = {key.name: key for key in graph.inputs}
    inputs: dict[Key[Any], Any] = {}
    for output in record.inputs:
        key = keys[output.key]
        inputs[key] = (
            NoValue
            if output.value is None
            else codec_for(key.type).decode(output.value, what=f"input {key!r} of run {record.run_id!r}")
        )
    return inputs


def check_graph(record: RunRecord, graph: Graph) -> None:
    """Refuse ``graph`` for run ``record`` unless it is the one the run started with, naming what differs.

    A record may hold the fingerprint with types named with their modules
    (:attr:`~streams.Topology.legacy_fingerprint`): the same graph, given by
    the code that started the run. A record keeps the fingerprint it was
    written with, so the process that wrote it resumes it too.
    """
    topology = graph.topology()
    same_topology = record.fingerprint in (topology.fingerprint, topology.legacy_fingerprint)
    if (record.graph, record.version) == (graph.name, graph.version) and same_topology:
        return
    problem = (
        f"run {record.run_id!r} started with graph {record.graph!r} version {record.version!r}; the graph "
        f"given is {graph.name!r} version {graph.version!r}"
    )
    if not same_topology:
        found = _differences(record.shape, topology) if record.shape is not None else []
        problem += f" with another topology ({listed(found)})" if found else " with another topology"
    raise RunMismatchError(problem + ": resume it with the graph it started with, or start a new run")


def _differences(recorded: Mapping[str, Any], topology: Topology) -> list[str]:
    """What differs between the recorded shape and ``topology``, with types named as the record names them.

    A recorded shape may name types with their modules. Compared with the shape that names them the other way,
    every port of a class would differ, and the ports that truly differ
    differ either way: so the comparison with fewer differences is the one
    in the record's naming.
    """
    return min(
        topology_differences(recorded, topology.shape),
        topology_differences(recorded, topology.legacy_shape),
        key=len,
    )


def check_inputs(record: RunRecord, given: tuple[CheckpointOutput, ...]) -> None:
    """Refuse inputs for run ``record`` unless they are the ones it started with, naming which differ."""
    found = input_differences(record.inputs, given)
    if found:
        raise RunInputsMismatchError(
            f"run {record.run_id!r} started with other inputs ({listed(found)}): continue it with the "
            "inputs it started with (resume needs none), or start a new run"
        )


def describe_chain(aspects: Iterable[Aspect]) -> tuple[str, ...]:
    """An execution's aspect chain as a run records it, outermost first."""
    return tuple(describe_aspect(aspect) for aspect in aspects)


def _listed(chain: tuple[str, ...]) -> str:
    return "[" + ", ".join(chain) + "]"


def new_run_id(run_id: str) -> None:
    """Refuse a run id a new run cannot have: not a ledger key, or the form of a retry's root scope."""
    run_id_bytes(run_id)
    if _RETRY_SCOPE.search(run_id):
        raise InvalidRunIdError(
            f"run id {run_id!r} ends as a retried run's scope does (/retry.N): choose another run id"
        )


def not_ended(run_id: str) -> RunNotEndedError:
    return RunNotEndedError(f"run {run_id!r} is running: a running run is not deleted; cancel it first")


def refusal(act: str, run_id: str, status: str) -> RunFinishedError | RunNotEndedError | None:
    """What ``act`` (``cancel``, ``retry``, ``delete``) refuses a run of ``status`` with; None where it
    applies: the one rule of the acts, and of what their dry runs (``runs ... --dry-run``) say."""
    if act == "cancel":
        return (
            None
            if status == "running"
            else RunFinishedError(f"run {run_id!r} is {status}: there is nothing to cancel")
        )
    if act == "delete":
        return not_ended(run_id) if status == "running" else None
    if status == "completed":
        return RunFinishedError(f"run {run_id!r} completed: there is nothing to retry")
    if status == "running":
        return RunNotEndedError(
            f"run {run_id!r} is running: only a run that failed for good or was cancelled is "
            "retried; cancel it first to run it again from its start"
        )
    return None


def run_exists(run_id: str) -> RunExistsError:
    return RunExistsError(f"run {run_id!r} exists already: resume it, or use a new run id")


def cancelled_meanwhile(run_id: str) -> RunCancelledError:
    """The error of a run's record refused because the run was cancelled since the record was read."""
    return RunCancelledError(
        f"run {run_id!r} was cancelled while it was being resumed; a cancelled run is not resumed: "
        "start a new run, or retry it"
    )


class RunBook(Protocol):
    """Where a ledger keeps its runs' records, beside the node store the runs checkpoint in."""

    @property
    def where(self) -> str:
        """The ledger, as error messages name it."""
        ...

    @property
    def nodes(self) -> Any:
        """The ledger's node hooks (with ``node_records`` and ``scope_failed``)."""
        ...

    async def read(self, run_id: str) -> RunRecord | None: ...

    async def write(self, record: RunRecord, *, new: bool, unless_cancelled: bool = False) -> None:
        """Keep ``record``; with ``new``, refuse a run id the ledger knows (:class:`RunExistsError`);
        with ``unless_cancelled``, one the ledger holds cancelled (:func:`cancelled_meanwhile`, nothing
        written): a cancellation made since the record was read is never written over."""
        ...

    async def records(self) -> list[RunRecord]: ...

    async def delete(self, record: RunRecord) -> RunDeleted:
        """Remove run ``record`` in one transaction: its record, the node records of every scope of its
        attempts (:func:`in_root_scope` of each of :attr:`RunRecord.scopes`), and the streams of those
        scopes with their messages, groups, budgets and keyed state; a stream's id is never reused.
        Refuse (:func:`not_ended`) if the record read in that transaction is running while
        ``record`` is not: a worker claimed it in between."""
        ...


class Runs:
    """The runs of one open ledger (``ledger.run``, ``ledger.resume``, ``ledger.runs``)."""

    def __init__(
        self,
        book: RunBook,
        *,
        active: set[str] | None = None,
        executions: dict[str, Execution] | None = None,
    ) -> None:
        self._book = book
        self._active: set[str] = set() if active is None else active
        #: the executions running here, by run id: a cancel stops its run's
        self._executions: dict[str, Execution] = {} if executions is None else executions

    def on(self, book: RunBook) -> Runs:
        """These runs through ``book`` (a run's book under its lease), sharing which ids run here."""
        if book is self._book:
            return self
        return Runs(book, active=self._active, executions=self._executions)

    async def run(
        self,
        graph: Graph,
        inputs: Mapping[Key[Any], Any],
        *,
        run_id: str,
        aspects: Iterable[Aspect] = (),
        on_event: Callable[[ExecutionEvent], None] | None = None,
        on_start: Callable[[Execution], None] | None = None,
        stream_capacity: int = 1024,
        host_readers: Mapping[Key[Any], Iterable[str]] | None = None,
        resumable_inputs: Iterable[Key[Any]] = (),
    ) -> RunResult:
        """Start run ``run_id`` of ``graph`` and run it to its end; a known id is :class:`RunExistsError`.

        ``on_start`` is called with the :class:`~streams.Execution` once it
        has started (to watch its streams or snapshots, to cancel it, or to
        start the host's tasks that write its stream inputs and read its
        outlets); ``stream_capacity`` bounds each stream's unacknowledged
        messages; ``host_readers`` and ``resumable_inputs`` are the
        execution's (host streams: ``docs/nodes.md``).
        """
        graph.validate(checkpoint=True)  # what checkpoint mode cannot run, before any record
        topology = graph.topology()
        new_run_id(run_id)  # a run id the ledger can key, or InvalidRunIdError before anything
        aspects = tuple(aspects)
        execution = Execution(
            graph,
            inputs,
            aspects=aspects,
            on_event=on_event,
            checkpoint=ExecCheckpoint(run_id, self._book.nodes, new_scope=True),  # its record is new
            stream_capacity=stream_capacity,
            host_readers=host_readers,
            resumable_inputs=resumable_inputs,
        )
        record = RunRecord(
            FORMAT_VERSION,
            run_id,
            graph.name,
            graph.version,
            topology.fingerprint,
            encode_inputs(graph, execution.checkpoint_inputs()),
            aspects=describe_chain(aspects),
            shape=dict(topology.shape),
        )
        with self._owning(run_id):
            record = stamped(record, new=True)
            await self._book.write(record, new=True)
            return await self._execute(execution, record, resumed=False, on_start=on_start)

    async def start(
        self,
        graph: Graph,
        inputs: Mapping[Key[Any], Any],
        *,
        run_id: str,
        aspects: Iterable[Aspect] = (),
        **options: Any,
    ) -> RunResult:
        """Run ``run_id`` to its end: a new run for an id the ledger does not know, else its resume.

        A known run continues only with the graph, inputs and aspects it
        started with: another graph is :class:`RunMismatchError` and other
        inputs :class:`RunInputsMismatchError`, each naming what differs,
        before anything is written or run. A finished run returns its
        result; a run that failed for good is
        :class:`~streams.ConfirmedFailureError`. ``options`` are
        :meth:`run`'s.
        """
        aspects = tuple(aspects)
        record = await self._book.read(run_id)
        if record is None:
            try:
                return await self.run(graph, inputs, run_id=run_id, aspects=aspects, **options)
            except RunExistsError:  # another process recorded it first: it is a known run now
                record = await self._book.read(run_id)
                if record is None:
                    raise
        check_graph(record, graph)
        graph.validate(checkpoint=True)
        execution = Execution(graph, inputs, checkpoint=ExecCheckpoint(record.scope, self._book.nodes))
        check_inputs(record, encode_inputs(graph, execution.checkpoint_inputs()))
        return await self.resume(run_id, graph, aspects=aspects, **options)

    async def submit(
        self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str, aspects: Iterable[Aspect] = ()
    ) -> RunRecord:
        """Record run ``run_id`` of ``graph`` without running it: a worker that claims it resumes it.

        A known run id is :class:`RunExistsError`; the inputs are checked and
        encoded as :meth:`run` does. ``aspects`` is the execution's chain the
        run is recorded with: the workers that run it must be given the same
        (:class:`RunAspectsMismatchError`).
        """
        graph.validate(checkpoint=True)  # what checkpoint mode cannot run, before any record
        new_run_id(run_id)
        aspects = tuple(aspects)
        execution = Execution(
            graph, inputs, aspects=aspects, checkpoint=ExecCheckpoint(run_id, self._book.nodes)
        )
        record = RunRecord(
            FORMAT_VERSION,
            run_id,
            graph.name,
            graph.version,
            graph.topology().fingerprint,
            encode_inputs(graph, execution.checkpoint_inputs()),
            starts=0,
            aspects=describe_chain(aspects),
            shape=dict(graph.topology().shape),
        )
        record = stamped(record, new=True)
        await self._book.write(record, new=True)
        return record

    async def resume(
        self,
        run_id: str,
        graph: Graph,
        *,
        aspects: Iterable[Aspect] = (),
        on_event: Callable[[ExecutionEvent], None] | None = None,
        on_start: Callable[[Execution], None] | None = None,
        stream_capacity: int = 1024,
        host_readers: Mapping[Key[Any], Iterable[str]] | None = None,
        resumable_inputs: Iterable[Key[Any]] = (),
    ) -> RunResult:
        """Continue run ``run_id`` from what the ledger confirmed; a finished run returns its result.

        ``on_start``, ``stream_capacity``, ``host_readers`` and
        ``resumable_inputs`` are :meth:`run`'s. ``aspects``
        must be the chain the run started with, in its order
        (:class:`RunAspectsMismatchError` otherwise, before anything is
        written or run); see the module docstring for a record that holds no chain.
        """
        aspects = tuple(aspects)
        given = describe_chain(aspects)
        record = await self._known(run_id)
        check_graph(record, graph)
        if record.status == "cancelled":
            cancel = record.cancelled
            said = f" by {cancel.by} ({cancel.reason})" if cancel is not None else ""
            raise RunCancelledError(
                f"run {run_id!r} was cancelled{said}; a cancelled run is not resumed: start a new run"
            )
        if record.status == "failed" or await self._book.nodes.scope_failed(record.scope):
            raise ConfirmedFailureError(
                f"run {run_id!r} failed for good ({record.error or 'a confirmed failure'}); "
                "retry it (a new root attempt, with fresh budgets) or start a new run"
            )
        if record.aspects is not None and record.aspects != given:
            raise RunAspectsMismatchError(
                f"run {run_id!r} started with aspects {_listed(record.aspects)}; resume was given "
                f"{_listed(given)}: its Retry budgets are keyed by their places in that chain, so resume "
                "it with the aspects it started with, in their order, or start a new run"
            )
        with self._owning(run_id):
            execution = Execution(
                graph,
                decode_inputs(graph, record),
                aspects=aspects,
                on_event=on_event,
                checkpoint=ExecCheckpoint(record.scope, self._book.nodes),
                stream_capacity=stream_capacity,
                host_readers=host_readers,
                resumable_inputs=resumable_inputs,
            )
            execution.restore_nodes(await self._book.nodes.node_records(record.scope))
            if record.status == "completed":
                async with execution:
                    if on_start is not None:
                        on_start(execution)
                    result = await execution.wait()
                return RunResult(run_id, result, resumed=True, already_finished=True)
            await execution.check_streams()  # a writer that would start again on its stream: before any write
            shape = record.shape if record.shape is not None else dict(graph.topology().shape)
            record = msgspec.structs.replace(record, starts=record.starts + 1, aspects=given, shape=shape)
            record = stamped(record)
            await self._book.write(record, new=False, unless_cancelled=True)  # cancelled since it was read?
            return await self._execute(execution, record, resumed=True, on_start=on_start)

    async def runs(self) -> list[RunRecord]:
        """Every run of the ledger, by run id."""
        return await self._book.records()

    async def cancel(self, run_id: str, *, reason: str, by: str) -> RunRecord:
        """Record that run ``run_id`` is cancelled (``by`` whom, and why), and stop it if it runs here.

        Its execution here, if any, is cancelled as a host cancels one: what
        its nodes confirmed stays, its attempts stay active, nothing more is
        confirmed. A worker running it elsewhere stops at its next lease
        renewal. A cancelled run is not resumed (:class:`RunCancelledError`).
        A finished run is :class:`RunFinishedError`, an unknown id
        :class:`UnknownRunError`; nothing is written then.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("a cancel says why: give reason=")
        record = await self._known(run_id)
        if (refused := refusal("cancel", run_id, record.status)) is not None:
            raise refused
        cancel = RunCancel(by, reason, time.time())
        record = stamped(msgspec.structs.replace(record, status="cancelled", cancelled=cancel))
        await self._book.write(record, new=False)
        execution = self._executions.get(run_id)
        if execution is not None:
            execution.cancel()
        return record

    async def retry(self, run_id: str, *, reason: str, by: str) -> RunRecord:
        """Record a new root attempt of run ``run_id``, which failed for good or was cancelled.

        The next resume (or the worker that claims it) runs the graph again
        from its start under the new attempt's scope (:func:`root_scope`):
        every node runs again with whole Retry budgets, its streams are new,
        and nothing of the earlier attempts is borrowed, as the rules have it
        for a parent attempt after a confirmed failure. Those attempts' records
        and streams stay for inspection until the run is deleted. This is the
        only act that restarts a run's budgets; it is recorded with ``by``,
        ``reason`` and how the replaced attempt ended (:class:`RunRetry`).

        A running run is :class:`RunNotEndedError` (cancel it first), a
        completed one :class:`RunFinishedError`, an unknown id
        :class:`UnknownRunError`; nothing is written then.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("a retry says why: give reason=")
        record = await self._known(run_id)
        ended = record.status
        if ended == "running" and await self._book.nodes.scope_failed(record.scope):
            ended = "failed"  # its final failure was confirmed, and its process ended before its record
        if ended != "completed" and run_id in self._active:
            ended = "running"  # it runs in this process
        if (refused := refusal("retry", run_id, ended)) is not None:
            raise refused
        assert ended in ("failed", "cancelled")
        error = record.error if ended == "failed" else None
        retry = RunRetry(by, reason, time.time(), ended, error)
        record = msgspec.structs.replace(
            record,
            status="running",
            error=None,
            cancelled=None,
            attempt=record.attempt + 1,
            retries=(*record.retries, retry),
        )
        record = stamped(record)
        await self._book.write(record, new=False)
        return record

    async def delete(self, run_id: str) -> RunDeleted:
        """Remove run ``run_id``: its record, every attempt's node records, and the streams they own.

        The streams its nodes and its host wrote go with their messages,
        groups, budgets and keyed state; the run id can then be used again,
        for a new run. A running run is :class:`RunNotEndedError` (cancel it
        first); an unknown id is :class:`UnknownRunError`. On PostgreSQL the
        record is checked again in the deleting transaction, so a run a
        worker claimed in between is refused, not deleted under it.
        """
        record = await self._known(run_id)
        ended = record.status != "running" or await self._book.nodes.scope_failed(record.scope)
        if not ended or run_id in self._active:
            raise not_ended(run_id)
        return await self._book.delete(record)

    async def _execute(
        self,
        execution: Execution,
        record: RunRecord,
        *,
        resumed: bool,
        on_start: Callable[[Execution], None] | None,
    ) -> RunResult:
        self._executions[record.run_id] = execution
        try:
            async with traced_run(record, resumed=resumed), execution:
                if on_start is not None:
                    on_start(execution)
                result = await execution.wait()
        except Exception as exc:
            current = await self._book.read(record.run_id)
            if current is not None and current.status == "cancelled":
                raise  # cancelled while it ran: the record says so already
            if await self._book.nodes.scope_failed(record.scope):  # confirmed: the run failed for good
                failed = msgspec.structs.replace(record, status="failed", error=type(exc).__qualname__)
                await self._book.write(stamped(failed), new=False)
            raise  # anything else leaves the run running, for resume to continue
        finally:
            self._executions.pop(record.run_id, None)
        await self._book.write(stamped(msgspec.structs.replace(record, status="completed")), new=False)
        return RunResult(record.run_id, result, resumed=resumed)

    async def _known(self, run_id: str) -> RunRecord:
        """Run ``run_id``'s record, or :class:`UnknownRunError`."""
        record = await self._book.read(run_id)
        if record is None:
            raise UnknownRunError(f"{self._book.where} has no run {run_id!r}")
        return record

    def _owning(self, run_id: str) -> _Owning:
        return _Owning(self._active, run_id)


class _Owning:
    def __init__(self, active: set[str], run_id: str) -> None:
        self._active, self._run_id = active, run_id

    def __enter__(self) -> None:
        if self._run_id in self._active:
            raise RunActiveError(f"run {self._run_id!r} is being run by another execution of this process")
        self._active.add(self._run_id)

    def __exit__(self, *exc: object) -> None:
        self._active.discard(self._run_id)
