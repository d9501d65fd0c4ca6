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

Within a process a run id is run by one execution at a time
(:class:`RunActiveError`). Where the run records live is a :class:`RunBook`:
the LMDB ledger's ``nodes`` database, or a PostgreSQL table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import msgspec

from streams import (
    Aspect,
    CheckpointOutput,
    ConfirmedFailureError,
    ExecCheckpoint,
    Execution,
    ExecutionEvent,
    ExecutionResult,
    Graph,
    Key,
    NoValue,
)
from streams.store import codec_for

from ._env import LedgerEnv
from ._errors import LedgerError
from ._layout import NODE_RUN_PREFIX, node_run_key
from ._nodes import scan
from ._seal import decode_record, seal

if TYPE_CHECKING:
    from ._ledger import Ledger

__all__ = [
    "LmdbRunBook",
    "RunActiveError",
    "RunBook",
    "RunExistsError",
    "RunMismatchError",
    "RunRecord",
    "RunResult",
    "Runs",
    "UnknownRunError",
]

FORMAT_VERSION: Final = 1
DB: Final = "nodes"


class RunRecord(msgspec.Struct, frozen=True):
    """What the ledger keeps of a graph run besides its node records."""

    format_version: int
    run_id: str
    graph: str
    version: str
    fingerprint: str
    inputs: tuple[CheckpointOutput, ...]
    status: Literal["running", "completed", "failed"] = "running"
    starts: int = 1  # executions started: the first run and each resume that ran something (0: submitted)
    error: str | None = None  # the type of a confirmed final failure, never its text


class RunResult(msgspec.Struct, frozen=True):
    """A run's outcome: the root graph's keys and node statuses, and how this call got there."""

    run_id: str
    result: ExecutionResult
    resumed: bool = False
    already_finished: bool = False


class RunExistsError(LedgerError, ValueError):
    """``run`` with a run id the ledger knows: resume it, or use a new id."""


class UnknownRunError(LedgerError, LookupError):
    """``resume`` with a run id the ledger does not know."""


class RunMismatchError(LedgerError, ValueError):
    """The graph given to ``resume`` is not the one the run started with (name, version or topology)."""


class RunActiveError(LedgerError):
    """The run id is being run by another execution of this process."""


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(RunRecord)


def encode_inputs(graph: Graph, inputs: Mapping[Key[Any], Any]) -> tuple[CheckpointOutput, ...]:
    encoded = []
    for key in graph.inputs:
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


def list_runs(env: LedgerEnv) -> Iterator[RunRecord]:
    """Every business run of the ledger, by run id, from one snapshot."""
    return scan(env, NODE_RUN_PREFIX, _decoder)


def run_exists(run_id: str) -> RunExistsError:
    return RunExistsError(f"run {run_id!r} exists already: resume it, or use a new run id")


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

    async def write(self, record: RunRecord, *, new: bool) -> None:
        """Keep ``record``; with ``new``, refuse a run id the ledger knows (:class:`RunExistsError`)."""
        ...

    def records(self) -> list[RunRecord]: ...


class LmdbRunBook:
    """The runs of an LMDB ledger: records in its ``nodes`` database, keyed by run id."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    @property
    def where(self) -> str:
        return f"ledger {self._ledger.path}"

    @property
    def nodes(self) -> Any:
        return self._ledger.nodes

    async def read(self, run_id: str) -> RunRecord | None:
        env = self._ledger.env
        key = node_run_key(run_id)
        with env.read() as txn:
            raw = txn.get(key, db=env.db(DB))
        return None if raw is None else decode_record(bytes(raw), _decoder, db=DB, key=key)

    async def write(self, record: RunRecord, *, new: bool) -> None:
        env = self._ledger.env
        db = env.db(DB)
        key = node_run_key(record.run_id)
        value = seal(DB, key, _encoder.encode(record))

        def write(txn: Any) -> None:
            if new and txn.get(key, db=db) is not None:
                raise run_exists(record.run_id)
            txn.put(key, value, db=db)

        await env.write(write)

    def records(self) -> list[RunRecord]:
        return list(list_runs(self._ledger.env))


class Runs:
    """The runs of one open ledger (``ledger.run``, ``ledger.resume``, ``ledger.runs``)."""

    def __init__(self, book: RunBook) -> None:
        self._book = book
        self._active: set[str] = set()

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
    ) -> RunResult:
        """Start run ``run_id`` of ``graph`` and run it to its end; a known id is :class:`RunExistsError`.

        ``on_start`` is called with the :class:`~streams.Execution` once it
        has started (to watch its streams or snapshots, or to cancel it);
        ``stream_capacity`` bounds each stream's unacknowledged messages.
        """
        graph.validate(checkpoint=True)  # what checkpoint mode cannot run, before any record
        topology = graph.topology()
        node_run_key(run_id)  # a run id the ledger can key, or InvalidRunIdError before anything
        execution = Execution(
            graph,
            inputs,
            aspects=aspects,
            on_event=on_event,
            checkpoint=ExecCheckpoint(run_id, self._book.nodes),
            stream_capacity=stream_capacity,
        )
        record = RunRecord(
            FORMAT_VERSION,
            run_id,
            graph.name,
            graph.version,
            topology.fingerprint,
            encode_inputs(graph, execution.checkpoint_inputs()),
        )
        with self._owning(run_id):
            await self._book.write(record, new=True)
            return await self._execute(execution, record, resumed=False, on_start=on_start)

    async def submit(self, graph: Graph, inputs: Mapping[Key[Any], Any], *, run_id: str) -> RunRecord:
        """Record run ``run_id`` of ``graph`` without running it: a worker that claims it resumes it.

        A known run id is :class:`RunExistsError`; the inputs are checked and
        encoded as :meth:`run` does.
        """
        graph.validate(checkpoint=True)  # what checkpoint mode cannot run, before any record
        node_run_key(run_id)
        execution = Execution(graph, inputs, checkpoint=ExecCheckpoint(run_id, self._book.nodes))
        record = RunRecord(
            FORMAT_VERSION,
            run_id,
            graph.name,
            graph.version,
            graph.topology().fingerprint,
            encode_inputs(graph, execution.checkpoint_inputs()),
            starts=0,
        )
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
    ) -> RunResult:
        """Continue run ``run_id`` from what the ledger confirmed; a finished run returns its result.

        ``on_start`` and ``stream_capacity`` are :meth:`run`'s.
        """
        record = await self._book.read(run_id)
        if record is None:
            raise UnknownRunError(f"{self._book.where} has no run {run_id!r}")
        fingerprint = graph.topology().fingerprint
        if (record.graph, record.version, record.fingerprint) != (graph.name, graph.version, fingerprint):
            raise RunMismatchError(
                f"run {run_id!r} started with graph {record.graph!r} version {record.version!r}; the graph "
                f"given is {graph.name!r} version {graph.version!r}"
                + ("" if record.fingerprint == fingerprint else " with another topology")
                + ": resume it with the graph it started with, or start a new run"
            )
        if record.status == "failed" or self._book.nodes.scope_failed(run_id):
            raise ConfirmedFailureError(
                f"run {run_id!r} failed for good ({record.error or 'a confirmed failure'}); "
                "a new run of this work needs a new run id"
            )
        with self._owning(run_id):
            execution = Execution(
                graph,
                decode_inputs(graph, record),
                aspects=aspects,
                on_event=on_event,
                checkpoint=ExecCheckpoint(run_id, self._book.nodes),
                stream_capacity=stream_capacity,
            )
            execution.restore_nodes(self._book.nodes.node_records(run_id))
            if record.status == "completed":
                async with execution:
                    if on_start is not None:
                        on_start(execution)
                    result = await execution.wait()
                return RunResult(run_id, result, resumed=True, already_finished=True)
            record = msgspec.structs.replace(record, starts=record.starts + 1)
            await self._book.write(record, new=False)
            return await self._execute(execution, record, resumed=True, on_start=on_start)

    def runs(self) -> list[RunRecord]:
        """Every run of the ledger, by run id."""
        return self._book.records()

    async def _execute(
        self,
        execution: Execution,
        record: RunRecord,
        *,
        resumed: bool,
        on_start: Callable[[Execution], None] | None,
    ) -> RunResult:
        try:
            async with execution:
                if on_start is not None:
                    on_start(execution)
                result = await execution.wait()
        except Exception as exc:
            if self._book.nodes.scope_failed(record.run_id):  # confirmed: the run failed for good
                failed = msgspec.structs.replace(record, status="failed", error=type(exc).__qualname__)
                await self._book.write(failed, new=False)
            raise  # anything else leaves the run running, for resume to continue
        await self._book.write(msgspec.structs.replace(record, status="completed"), new=False)
        return RunResult(record.run_id, result, resumed=resumed)

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
