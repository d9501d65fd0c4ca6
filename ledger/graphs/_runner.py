"""DurableGraph: run a pydantic-graph graph so a crash or a retry resumes where the ledger says."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from types import FrameType
from typing import Any, Generic, Literal, TypeVar, cast
from weakref import WeakKeyDictionary

import anyio
import msgspec
from opentelemetry.trace import Span, TracerProvider
from pydantic_graph import EndMarker, Graph, GraphRun, GraphTask, GraphTaskRequest
from pydantic_graph.id_types import TaskID

from streams.store import ATTR, EVENT, SPAN, failed, tracer

from .._errors import LedgerError
from .._format import run_id_bytes
from .._graph_runs import (
    FORMAT_VERSION,
    GraphCheckpoint,
    GraphRunBook,
    GraphRunRecord,
    HoldsGraphRuns,
    SavedTask,
)
from ._annotations import GraphNamespace, caller_frame
from ._checkpoint import saved_task, task_request
from ._errors import GraphInputTypeError, GraphRunActiveError, UntypedNodeWarning
from ._fingerprint import graph_fingerprint
from ._quiescence import (
    Boundary,
    ForkRegions,
    check_pydantic_graph_version,
    installed_pydantic_graph_version,
    quiescent_boundary,
)
from ._resume import Discard, Restore, restore_plan
from ._tracing import traced_graph
from ._types import graph_types
from ._values import NotWritable, SkipReason, holds_one_shot, write_down

__all__ = ["DurableGraph", "DurableGraphRun", "GraphRunResult", "GraphRunStatus"]

StateT = TypeVar("StateT")
DepsT = TypeVar("DepsT")
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


class GraphRunResult(msgspec.Struct, Generic[StateT, OutputT], frozen=True):
    """What a durable run ended with.

    ``resumed_from`` is the sequence number of the checkpoint the last attempt
    resumed from (None when it started from the beginning), and
    ``already_finished`` says the graph had finished in an earlier attempt, so
    its output and state were read from the ledger and no step ran.
    """

    run_id: str
    output: OutputT
    state: StateT
    attempt: int
    resumed_from: int | None
    already_finished: bool


class GraphRunStatus(msgspec.Struct, frozen=True):
    """A run as the ledger holds it: attempts, saved checkpoints, and what comes next.

    ``discarded`` is why the run's latest discarded checkpoint was not
    resumed, and ``error`` the exception type its last attempt failed with
    (None while an attempt runs, and once one finished).
    """

    run_id: str
    attempt: int
    checkpoints: int
    last_step: str | None
    next_node: str | None
    finished: bool
    discarded: str | None = None
    error: str | None = None


_running: WeakKeyDictionary[object, set[str]] = WeakKeyDictionary()


class DurableGraph(Generic[StateT, DepsT, InputT, OutputT]):
    """A pydantic-graph ``Graph`` whose runs survive crashes and retries.

    ``DurableGraph(graph, ledger)`` registers the graph: it works out the type
    of every value a checkpoint would hold and refuses a state type pydantic
    cannot write down (:class:`GraphStateTypeError`). ``input_types`` names
    input types of nodes whose type is not annotated or cannot be inferred
    (decisions and forks after transforms, joins or ``BaseNode`` steps, stream
    steps); explicit types win over annotations and inference.

    :meth:`run` runs the graph under a run id. After every step that ends at
    a quiescent boundary (nothing else in flight, one task next, outside any
    fork) it saves a checkpoint and the run's progress in the ledger, durably,
    before the next step starts. Running the same run id again, after an
    exception or in another process after a crash, resumes from the latest
    checkpoint: completed steps do not run again. The step in flight when the
    run stopped runs again, so steps must tolerate that;
    :func:`current_step` gives them an idempotency key for it.
    """

    def __init__(
        self,
        # mypy cannot read pydantic-graph's infer_variance type variables, so to mypy Graph takes
        # no type arguments; with mypy, write DurableGraph[State, Deps, Input, Output](graph, ledger).
        graph: Graph[StateT, DepsT, InputT, OutputT],  # type: ignore[type-arg]
        ledger: HoldsGraphRuns,
        *,
        input_types: Mapping[str, Any] | None = None,
        on_untyped: Literal["warn", "raise", "ignore"] = "warn",
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        check_pydantic_graph_version(installed_pydantic_graph_version())
        if on_untyped not in ("warn", "raise", "ignore"):
            raise ValueError(f"on_untyped must be 'warn', 'raise' or 'ignore', not {on_untyped!r}")
        self.graph = graph
        self.ledger = ledger
        caller = caller_frame(1)
        self._types = graph_types(graph, dict(input_types or {}), GraphNamespace(graph, caller))
        if self._types.untyped and on_untyped != "ignore":
            _report_untyped(
                graph.name or "graph", self._types.untyped, raise_=on_untyped == "raise", at=caller
            )
        self._fingerprint = graph_fingerprint(graph)
        self._regions = ForkRegions.of(graph)
        self._tracer_provider = tracer_provider
        self._name = graph.name or "graph"

    @property
    def untyped(self) -> Mapping[str, str]:
        """Nodes that can follow a step but have no known input type, each with why.

        No checkpoint is saved before them: a run that stops in one resumes
        from the checkpoint before the step that led to it.
        """
        return self._types.untyped

    # -- running -------------------------------------------------------------------------

    async def run(
        self,
        run_id: str,
        *,
        state: StateT | None = None,
        inputs: InputT | None = None,
        deps: DepsT | None = None,
    ) -> GraphRunResult[StateT, OutputT]:
        """Run the graph as ``run_id``, resuming from its latest checkpoint if it has one.

        ``state`` and ``inputs`` start a new run; a resumed run uses the state
        and inputs of its checkpoint instead, so read the final state from the
        result. ``deps`` are the caller's, passed to every attempt and never
        saved. An exception from a step propagates; the checkpoints saved
        before it stay, and the next :meth:`run` of the same run id resumes
        from them. A run that already finished returns its saved result and
        state without running a step or counting an attempt.
        """
        async with self.iter(run_id, state=state, inputs=inputs, deps=deps) as run:
            async for _ in run:
                pass
        result = run.result
        assert result is not None  # the iteration ended at the graph's end
        return result

    @asynccontextmanager
    async def iter(
        self,
        run_id: str,
        *,
        state: StateT | None = None,
        inputs: InputT | None = None,
        deps: DepsT | None = None,
    ) -> AsyncIterator[DurableGraphRun[StateT, OutputT]]:
        """Drive ``run_id`` step by step, as ``graph.iter`` does, with the checkpoints of :meth:`run`.

        Iterate the :class:`DurableGraphRun` it yields (or call its ``next``)
        to run one task at a time. Before the run continues past a quiescent
        step boundary, and when the block is left at one, that boundary is
        saved; the end is saved when it is reached. A resumed run first yields
        the task its checkpoint saved, before running it, so a driver that
        stopped before a task (to wait for an approval, say) sees it again.
        """
        with _claim(self.ledger.graph_runs, run_id):
            run_tracer = tracer(self._tracer_provider)
            with run_tracer.start_as_current_span(
                SPAN.INVOKE_GRAPH.format(graph=self._name),
                attributes={ATTR.RUN_ID: run_id, ATTR.GRAPH: self._name},
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                progress: _Progress | None = None
                try:
                    progress, restore = await self._open(span, run_id)
                    if restore is not None and restore.checkpoint.finished:
                        yield DurableGraphRun(self, span, progress, restore, None)
                        return
                    start_state = restore.state if restore is not None else state
                    start_inputs = restore.inputs if restore is not None else inputs
                    graph = traced_graph(
                        self.graph,
                        tracer=run_tracer if span.is_recording() else None,
                        run_id=run_id,
                        attempt=progress.attempt,
                    )
                    async with graph.iter(
                        state=start_state, deps=deps, inputs=start_inputs, infer_name=False
                    ) as graph_run:
                        run: DurableGraphRun[StateT, OutputT] = DurableGraphRun(
                            self, span, progress, restore, graph_run
                        )
                        if restore is None:
                            run.write_inputs(inputs)
                        try:
                            yield run
                        except Exception:
                            await run.stop()
                            raise
                        await run.stop()
                except BaseException as exc:
                    failed(span, exc)
                    if isinstance(exc, Exception) and progress is not None:
                        await self._record_failure(progress, exc)
                    raise

    async def _open(self, span: Span, run_id: str) -> tuple[_Progress, Restore | None]:
        """Read the run's record and checkpoint, decide whether to resume, and open an attempt.

        A finished run opens no attempt: its record stays as it is.
        """
        book = self.ledger.graph_runs
        record, saved = await book.read(run_id)  # one snapshot: another worker may write between two
        restore: Restore | None = None
        discarded = record.discarded if record is not None else None
        if saved is not None:
            outcome = restore_plan(saved, fingerprint=self._fingerprint, types=self._types)
            if isinstance(outcome, Discard):
                attributes: dict[str, str] = {ATTR.REASON: outcome.reason}
                if outcome.error is not None:
                    attributes[ATTR.ERROR] = outcome.error
                span.add_event(EVENT.CHECKPOINT_DISCARDED, attributes)
                discarded = outcome.reason
            else:
                restore = outcome
        if restore is not None:
            span.add_event(
                EVENT.CHECKPOINT_RESTORED,
                {
                    ATTR.SEQUENCE: restore.checkpoint.sequence,
                    ATTR.NEXT_NODE: restore.checkpoint.tasks[0].node_id if restore.checkpoint.tasks else "",
                },
            )
            if restore.checkpoint.finished and record is not None:
                span.set_attribute(ATTR.ATTEMPT, record.attempt)
                return _Progress.of(record), restore

        attempt = (record.attempt if record is not None else 0) + 1
        span.set_attribute(ATTR.ATTEMPT, attempt)
        progress = _Progress(
            run_id,
            self._name,
            attempt,
            restore.checkpoint.sequence if restore is not None else 0,
            restore.checkpoint.last_step if restore is not None else None,
            discarded,
        )
        if restore is not None:
            progress.inputs = restore.checkpoint.inputs
        await book.write_run(progress.record(), delete_checkpoint=saved is not None and restore is None)
        return progress, restore

    async def _record_failure(self, progress: _Progress, exc: Exception) -> None:
        """Note the exception type the attempt failed with; never hides ``exc``."""
        with anyio.CancelScope(shield=True):
            try:
                await self.ledger.graph_runs.write_run(progress.record(error=type(exc).__qualname__))
            except LedgerError as failed:
                where = self.ledger.graph_runs.where
                exc.add_note(f"the failure could not be recorded in {where}: {failed}")

    # -- checkpoints ---------------------------------------------------------------------

    async def _save(self, span: Span, progress: _Progress, run: GraphRun, boundary: Boundary) -> None:
        task = boundary.task
        adapter = self._types.nodes.get(task.node_id)
        try:
            if holds_one_shot(task.inputs):
                raise NotWritable("one_shot")  # whatever its type: writing it would use it up
            if adapter is None:
                raise NotWritable("untyped")
            if progress.inputs is None:
                raise NotWritable(progress.inputs_problem or "not_serializable")
            state = write_down(self._types.state, run.state)
            task_inputs = write_down(
                adapter, task.inputs, same_class=task.node_id in self._types.decisions, one_shot_checked=True
            )
        except NotWritable as exc:
            attributes = {ATTR.REASON: exc.reason, ATTR.NODE: boundary.step_id, ATTR.NEXT_NODE: task.node_id}
            span.add_event(EVENT.CHECKPOINT_SKIPPED, attributes)
            return
        await self._checkpoint(span, progress, boundary.step_id, state, (saved_task(task, task_inputs),))

    async def _save_end(self, span: Span, progress: _Progress, run: GraphRun, end: EndMarker) -> None:
        try:
            state = write_down(self._types.state, run.state)
            output = write_down(self._types.output, end.value)
        except NotWritable as exc:
            span.add_event(EVENT.CHECKPOINT_SKIPPED, {ATTR.REASON: exc.reason, ATTR.NEXT_NODE: "__end__"})
            return
        await self._checkpoint(span, progress, "__end__", state, (), output=output)

    async def _checkpoint(
        self,
        span: Span,
        progress: _Progress,
        step_id: str,
        state: bytes,
        tasks: tuple[SavedTask, ...],
        *,
        output: bytes | None = None,
    ) -> None:
        progress.sequence += 1
        progress.last_step = step_id
        progress.finished = output is not None
        checkpoint = GraphCheckpoint(
            FORMAT_VERSION,
            self._fingerprint,
            progress.sequence,
            progress.attempt,
            step_id,
            state,
            progress.inputs or b"null",
            tasks,
            progress.finished,
            output if output is not None else b"null",
        )
        await self.ledger.graph_runs.write_run(progress.record(), checkpoint=checkpoint)
        span.add_event(
            EVENT.CHECKPOINT_SAVED,
            {
                ATTR.SEQUENCE: progress.sequence,
                ATTR.NODE: step_id,
                ATTR.NEXT_NODE: tasks[0].node_id if tasks else "",
            },
        )

    # -- reading -------------------------------------------------------------------------

    async def status(self, run_id: str) -> GraphRunStatus | None:
        """The run as the ledger holds it, or None if the ledger has never seen it."""
        book = self.ledger.graph_runs
        record, saved = await book.read(run_id)
        if record is None:
            return None
        next_node = None
        if isinstance(saved, GraphCheckpoint) and saved.tasks:
            next_node = saved.tasks[0].node_id
        return GraphRunStatus(
            run_id,
            record.attempt,
            record.checkpoints,
            record.last_step,
            next_node,
            record.finished,
            record.discarded,
            record.error,
        )

    async def forget(self, run_id: str) -> None:
        """Delete a run's record and checkpoint, e.g. once its result is recorded elsewhere."""
        with _claim(self.ledger.graph_runs, run_id):
            await self.ledger.graph_runs.delete_run(run_id)


class _Progress:
    """What the run's record says as one attempt goes on, and its graph inputs as written down."""

    __slots__ = (
        "attempt",
        "discarded",
        "finished",
        "graph",
        "inputs",
        "inputs_problem",
        "last_step",
        "run_id",
        "sequence",
    )

    def __init__(
        self,
        run_id: str,
        graph: str,
        attempt: int,
        sequence: int,
        last_step: str | None,
        discarded: str | None,
        *,
        finished: bool = False,
    ) -> None:
        self.run_id = run_id
        self.graph = graph
        self.attempt = attempt
        self.sequence = sequence
        self.last_step = last_step
        self.discarded = discarded
        self.finished = finished
        self.inputs: bytes | None = None
        self.inputs_problem: SkipReason | None = None

    @classmethod
    def of(cls, record: GraphRunRecord) -> _Progress:
        return cls(
            record.run_id,
            record.graph,
            record.attempt,
            record.checkpoints,
            record.last_step,
            record.discarded,
            finished=record.finished,
        )

    def record(self, *, error: str | None = None) -> GraphRunRecord:
        return GraphRunRecord(
            FORMAT_VERSION,
            self.run_id,
            self.attempt,
            self.sequence,
            self.last_step,
            self.finished,
            self.graph,
            self.discarded,
            error,
        )


class DurableGraphRun(Generic[StateT, OutputT]):
    """One attempt of a durable run, driven a task at a time (from :meth:`DurableGraph.iter`).

    Iterate it, or ``await run.next()``, as pydantic-graph's ``GraphRun``:
    each step yields the tasks that come next, and the end an ``EndMarker``.
    ``await run.next(tasks)`` continues with other tasks instead, as
    ``GraphRun.next`` does; the boundary is saved with them when they are one
    task outside a fork. :attr:`result` is set once the end is reached.
    """

    def __init__(
        self,
        durable: DurableGraph[StateT, Any, Any, OutputT],
        span: Span,
        progress: _Progress,
        restore: Restore | None,
        graph_run: GraphRun | None,
    ) -> None:
        self._durable = durable
        self._span = span
        self._progress = progress
        self._graph_run = graph_run
        self.run_id = progress.run_id
        self.attempt = progress.attempt
        #: The sequence number of the checkpoint this attempt resumed from, or None.
        self.resumed_from = restore.checkpoint.sequence if restore is not None else None
        self._result: GraphRunResult[StateT, OutputT] | None = None
        self._pending: Boundary | None = None  # a boundary reached, not yet saved
        self._restored: list[GraphTask] | None = None  # the saved task, until the run continues with it
        self._started = False
        self._ended = False
        if restore is not None and restore.checkpoint.finished:
            self._result = GraphRunResult(
                self.run_id, restore.output, restore.state, self.attempt, restore.checkpoint.sequence, True
            )
        elif restore is not None:
            saved = restore.checkpoint.tasks[0]
            request = task_request(saved, restore.task_inputs, attempt=self.attempt)
            task = GraphTask(
                request.node_id, request.inputs, request.fork_stack, TaskID(f"a{self.attempt}.restored")
            )
            self._restored = [task]

    @property
    def result(self) -> GraphRunResult[StateT, OutputT] | None:
        """How the run ended, once its end was reached (at once for a run that had finished)."""
        return self._result

    @property
    def state(self) -> StateT:
        """The graph state as the run has it now."""
        if self._graph_run is None:
            assert self._result is not None
            return self._result.state
        return cast(StateT, self._graph_run.state)

    def __aiter__(self) -> DurableGraphRun[StateT, OutputT]:
        return self

    async def __anext__(self) -> EndMarker | Sequence[GraphTask]:
        return await self._advance(None)

    async def next(self, tasks: Sequence[GraphTaskRequest] | None = None) -> EndMarker | Sequence[GraphTask]:
        """Run the next tasks (or ``tasks`` instead) and return what comes after them."""
        return await self._advance(tasks)

    async def _advance(self, tasks: Sequence[GraphTaskRequest] | None) -> EndMarker | Sequence[GraphTask]:
        graph_run = self._graph_run
        if graph_run is None:  # finished in an earlier attempt: its end, once
            if self._ended:
                raise StopAsyncIteration
            self._ended = True
            assert self._result is not None
            return EndMarker(self._result.output)
        if self._ended:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            if self._restored is not None and tasks is None:
                return self._restored  # the saved task: it runs when the run continues
        await self._save_pending(tasks)
        if tasks is None and self._restored is not None:
            tasks = self._restored
        self._restored = None
        event = await (graph_run.next(tasks) if tasks is not None else anext(graph_run))
        if isinstance(event, EndMarker):
            self._ended = True
            await self._durable._save_end(self._span, self._progress, graph_run, event)
            self._result = GraphRunResult(
                self.run_id,
                event.value,
                cast(StateT, graph_run.state),
                self.attempt,
                self.resumed_from,
                False,
            )
        else:
            self._pending = quiescent_boundary(graph_run, event, self._durable._regions)
        return event

    async def _save_pending(self, tasks: Sequence[GraphTaskRequest] | None) -> None:
        boundary, self._pending = self._pending, None
        if self._restored is not None and tasks is not None and self._progress.last_step is not None:
            boundary = Boundary(self._progress.last_step, self._restored[0])  # continued otherwise
        if boundary is None or self._graph_run is None:
            return
        if tasks is not None:
            if len(tasks) != 1 or self._durable._regions.inside_fork(tasks[0]):
                return  # not a quiescent boundary any more: the checkpoint before stands
            boundary = Boundary(boundary.step_id, tasks[0])
        await self._durable._save(self._span, self._progress, self._graph_run, boundary)

    def write_inputs(self, inputs: Any) -> None:
        """Write the graph's inputs down once, for every checkpoint of a run started afresh."""
        try:
            self._progress.inputs = write_down(self._durable._types.inputs, inputs)
        except NotWritable as exc:
            self._progress.inputs_problem = exc.reason

    async def stop(self) -> None:
        """Save the boundary the driver left the run at, if it has not been saved."""
        with anyio.CancelScope(shield=True):
            await self._save_pending(None)


def _report_untyped(name: str, untyped: Mapping[str, str], *, raise_: bool, at: FrameType | None) -> None:
    listed = "; ".join(f"{node_id!r} ({why})" for node_id, why in untyped.items())
    example = next(iter(untyped))
    text = (
        f"{name}: no checkpoint can be saved before these nodes, since their input types are not "
        f"known: {listed}. A run stopping in one of them resumes from the checkpoint before the "
        f"step that led there, which runs again. Name their types with DurableGraph(..., "
        f"input_types={{{example!r}: ...}})"
    )
    if raise_:
        raise GraphInputTypeError(text)
    message = UntypedNodeWarning(f"{text}, or pass on_untyped='ignore' to accept this")
    if at is None:
        warnings.warn(message, stacklevel=3)
    else:  # point at the line that registered the graph, past typing's frame for DurableGraph[...]
        warnings.warn_explicit(
            message,
            UntypedNodeWarning,
            at.f_code.co_filename,
            at.f_lineno,
            module=at.f_globals.get("__name__"),
            module_globals=at.f_globals,
        )


@contextmanager
def _claim(book: GraphRunBook, run_id: str) -> Iterator[None]:
    """Hold ``run_id`` for this call: a run id runs once at a time per ledger in this process."""
    run_id_bytes(run_id)  # validates the id
    running = _running.setdefault(book.owner, set())
    if run_id in running:
        raise GraphRunActiveError(
            f"run {run_id!r} is already running in this process on {book.where}; "
            "wait for it to finish before running it again"
        )
    running.add(run_id)
    try:
        yield
    finally:
        running.discard(run_id)
