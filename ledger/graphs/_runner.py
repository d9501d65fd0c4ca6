"""DurableGraph: run a pydantic-graph graph so a crash or a retry resumes where the ledger says."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Generic, Literal, TypeVar, cast
from weakref import WeakKeyDictionary

from opentelemetry.trace import Span, Status, StatusCode, TracerProvider
from pydantic_graph import EndMarker, Graph, GraphRun

from .._env import LedgerEnv
from .._ledger import Ledger
from ._annotations import GraphNamespace, caller_frame
from ._checkpoint import (
    FORMAT_VERSION,
    GraphCheckpoint,
    GraphRunRecord,
    SavedTask,
    delete_run,
    read_checkpoint,
    read_run,
    run_key,
    write_run,
)
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
from ._tracing import ATTR, EVENT, get_tracer, traced_graph
from ._types import graph_types
from ._values import NotWritable, SkipReason, holds_one_shot, write_down

__all__ = ["DurableGraph", "GraphRunResult", "GraphRunStatus"]

StateT = TypeVar("StateT")
DepsT = TypeVar("DepsT")
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


@dataclass(frozen=True)
class GraphRunResult(Generic[StateT, OutputT]):
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


@dataclass(frozen=True)
class GraphRunStatus:
    """A run as the ledger holds it: attempts, saved checkpoints, and what comes next."""

    run_id: str
    attempt: int
    checkpoints: int
    last_step: str | None
    next_node: str | None
    finished: bool


_running: WeakKeyDictionary[LedgerEnv, set[str]] = WeakKeyDictionary()


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
        ledger: Ledger,
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
        result. ``deps`` are passed to every attempt. An exception from a step
        propagates; the checkpoints saved before it stay, and the next
        :meth:`run` of the same run id resumes from them.
        """
        with _claim(self.ledger.env, run_id):
            tracer = get_tracer(self._tracer_provider)
            with tracer.start_as_current_span(
                f"invoke_graph {self._name}",
                attributes={ATTR.RUN_ID: run_id, ATTR.GRAPH: self._name},
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    return await self._run(span, run_id, state, inputs, deps)
                except BaseException as exc:
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                    raise

    async def _run(
        self, span: Span, run_id: str, state: StateT | None, inputs: InputT | None, deps: DepsT | None
    ) -> GraphRunResult[StateT, OutputT]:
        env = self.ledger.env
        record = read_run(env, run_id)
        saved = read_checkpoint(env, run_id)
        restore: Restore | None = None
        discard = False
        if saved is not None:
            outcome = restore_plan(saved, fingerprint=self._fingerprint, types=self._types)
            if isinstance(outcome, Discard):
                attributes: dict[str, str] = {ATTR.REASON: outcome.reason}
                if outcome.error is not None:
                    attributes[ATTR.ERROR] = outcome.error
                span.add_event(EVENT.DISCARDED, attributes)
                discard = True
            else:
                restore = outcome

        attempt = (record.attempt if record is not None else 0) + 1
        span.set_attribute(ATTR.ATTEMPT, attempt)
        opened = GraphRunRecord(
            FORMAT_VERSION,
            run_id,
            attempt,
            checkpoints=restore.checkpoint.sequence if restore is not None else 0,
            last_step=restore.checkpoint.last_step if restore is not None else None,
            finished=restore is not None and restore.checkpoint.finished,
        )
        await write_run(self.ledger.env, opened, delete_checkpoint=discard)

        if restore is None:
            return await self._drive(span, run_id, attempt, state, inputs, deps, None)
        span.add_event(
            EVENT.RESTORED,
            {
                ATTR.SEQUENCE: restore.checkpoint.sequence,
                ATTR.NEXT_NODE: restore.checkpoint.tasks[0].node_id if restore.checkpoint.tasks else "",
            },
        )
        if restore.checkpoint.finished:
            return GraphRunResult(
                run_id, restore.output, restore.state, attempt, restore.checkpoint.sequence, True
            )
        return await self._drive(span, run_id, attempt, restore.state, restore.inputs, deps, restore)

    async def _drive(
        self,
        span: Span,
        run_id: str,
        attempt: int,
        state: Any,
        inputs: Any,
        deps: Any,
        restore: Restore | None,
    ) -> GraphRunResult[StateT, OutputT]:
        tracer = get_tracer(self._tracer_provider)
        graph = traced_graph(self.graph, tracer=tracer, run_id=run_id, attempt=attempt)
        progress = _Progress(run_id, attempt, restore.checkpoint.sequence if restore else 0)
        if restore is not None:
            progress.inputs = restore.checkpoint.inputs
        else:
            try:
                progress.inputs = write_down(self._types.inputs, inputs)
            except NotWritable as exc:
                progress.inputs_problem = exc.reason
        async with graph.iter(state=state, deps=deps, inputs=inputs, infer_name=False) as run:
            if restore is not None:
                task = restore.checkpoint.tasks[0]
                requests = [task.request(restore.task_inputs, attempt=attempt)]
                event = await run.next(requests)
            else:
                event = await anext(run)
            while True:
                if isinstance(event, EndMarker):
                    await self._save_end(span, progress, run, event)
                else:
                    boundary = quiescent_boundary(run, event, self._regions)
                    if boundary is not None:
                        await self._save(span, progress, run, boundary)
                try:
                    event = await anext(run)
                except StopAsyncIteration:
                    break
        return GraphRunResult(
            run_id,
            cast(OutputT, run.output),
            cast(StateT, run.state),
            attempt,
            restore.checkpoint.sequence if restore is not None else None,
            False,
        )

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
            task_inputs = write_down(adapter, task.inputs, same_class=task.node_id in self._types.decisions)
        except NotWritable as exc:
            attributes = {ATTR.REASON: exc.reason, ATTR.NODE: boundary.step_id, ATTR.NEXT_NODE: task.node_id}
            span.add_event(EVENT.SKIPPED, attributes)
            return
        await self._checkpoint(span, progress, boundary.step_id, state, (SavedTask.of(task, task_inputs),))

    async def _save_end(self, span: Span, progress: _Progress, run: GraphRun, end: EndMarker) -> None:
        try:
            state = write_down(self._types.state, run.state)
            output = write_down(self._types.output, end.value)
        except NotWritable as exc:
            span.add_event(EVENT.SKIPPED, {ATTR.REASON: exc.reason, ATTR.NEXT_NODE: "__end__"})
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
        finished = output is not None
        checkpoint = GraphCheckpoint(
            FORMAT_VERSION,
            self._fingerprint,
            progress.sequence,
            progress.attempt,
            step_id,
            state,
            progress.inputs or b"null",
            tasks,
            finished,
            output if output is not None else b"null",
        )
        record = GraphRunRecord(
            FORMAT_VERSION, progress.run_id, progress.attempt, progress.sequence, step_id, finished
        )
        await write_run(self.ledger.env, record, checkpoint=checkpoint)
        span.add_event(
            EVENT.SAVED,
            {
                ATTR.SEQUENCE: progress.sequence,
                ATTR.NODE: step_id,
                ATTR.NEXT_NODE: tasks[0].node_id if tasks else "",
            },
        )

    # -- reading -------------------------------------------------------------------------

    def status(self, run_id: str) -> GraphRunStatus | None:
        """The run as the ledger holds it, or None if the ledger has never seen it."""
        env = self.ledger.env
        record = read_run(env, run_id)
        if record is None:
            return None
        saved = read_checkpoint(env, run_id)
        next_node = None
        if isinstance(saved, GraphCheckpoint) and saved.tasks:
            next_node = saved.tasks[0].node_id
        return GraphRunStatus(
            run_id, record.attempt, record.checkpoints, record.last_step, next_node, record.finished
        )

    async def forget(self, run_id: str) -> None:
        """Delete a run's record and checkpoint, e.g. once its result is recorded elsewhere."""
        with _claim(self.ledger.env, run_id):
            await delete_run(self.ledger.env, run_id)


class _Progress:
    """The checkpoint sequence of one attempt, and its graph inputs as written down."""

    def __init__(self, run_id: str, attempt: int, sequence: int) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.sequence = sequence
        self.inputs: bytes | None = None
        self.inputs_problem: SkipReason | None = None


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
def _claim(env: LedgerEnv, run_id: str) -> Iterator[None]:
    """Hold ``run_id`` for this call: a run id runs once at a time in the process that owns the ledger."""
    run_key(run_id)  # validates the id
    running = _running.setdefault(env, set())
    if run_id in running:
        raise GraphRunActiveError(
            f"run {run_id!r} is already running in this process on ledger {env.path}; "
            "wait for it to finish before running it again"
        )
    running.add(run_id)
    try:
        yield
    finally:
        running.discard(run_id)
