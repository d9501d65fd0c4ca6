"""A hypothesis state machine over random small graphs in checkpoint mode, crashed, cancelled and faulted.

``build`` draws a graph: nodes in a line, fanned out from the input, or
joining earlier nodes, some flaky (failing their first runs) under a Retry,
some inside a Sub mount; and maybe a stream stage: node ``w`` writes a few
messages (continuing from its position after a crash), maybe under a Retry
and failing once after sending some of them without a flush, read by
handler nodes at the root and inside a Sub alias ``s``, each summing them
in explicit state, one of them flaky on its first message; a reader reads
to the end, or concludes early (``limit=``, ``tx.stop()``, or
``limit=0``: an early return), and ``w`` then waits for the early ones to
conclude before it sends the rest, so a reader is confirmed while its
writer is active. Every node's code says what it does when a cancellation
reaches it at its await point: let it through, or swallow it and raise,
return (a wrong value, if it sets one) or skip. The execution's own aspect
chain is drawn too (none, a Retry, a function aspect, or both).

``run`` starts or resumes the run (on the LMDB ledger through
``Runs.run``/``Runs.resume``, as a business host does; on the MemoryStore,
which has no runs, with an ``Execution`` restored from its records) with
one :class:`Trouble` at most:

* a crash at the k-th hook call (node hooks and stream hooks alike),
  before or after that call took effect: a ``BaseException`` that no
  handler of the engine catches, and every later call of that process
  fails too, as a dead process makes none;
* a host cancellation (its cancel scope, or ``Execution.cancel()``) at the
  k-th hook call, or while a chosen node's code waits at its await point;
* a fault of the k-th call of one hook, any of the ten (``open_message``
  included): refused, confirmed with its answer lost, or raising a
  cancellation exception while nothing cancelled the run
  (``streams.testing.stray_cancellation``).

``resume_with_another_chain`` (LMDB, through ``Runs``) resumes the run with
another execution aspect chain: refused with ``RunAspectsMismatchError``
before anything is called or run. ``restart`` closes the store and opens it
again (for the LMDB ledger, from its files).

The invariants, checked during and after every run:

* a node whose record is confirmed never runs its body again;
* a node runs only on inputs whose producers' records are confirmed, and
  with the values a run without troubles would give it;
* every confirmed record holds exactly those values;
* a boundary's confirmed failures never go down (no budget refilled), and
  a run whose final failure is confirmed never starts again;
* a run that finishes has every value the model says, and its stream holds
  each message once (a retried writer continues from what its stream
  kept);
* node code that swallowed a cancellation is never confirmed, never runs
  again in that run, and its node ends ``cancelled``;
* no budget is spent by a cancellation or a fault: the confirmed failures
  a node's boundaries gain in a run are explained by its code's business
  failures in that run;
* no run is confirmed failed by a cancellation or a fault: no
  ``fail_attempt`` or ``fail_message`` is started once one struck, a
  faulted run ends with a ``CheckpointError`` (never finished), and a
  cancelled one ends cancelled.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import anyio.lowlevel
import msgspec
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ledger import Ledger, LmdbBackend, RunAspectsMismatchError, RunDeleted, RunRecord, Runs, open_ledger
from streams import (
    Aspect,
    CheckpointError,
    ConfirmedFailureError,
    ExecCheckpoint,
    Execution,
    ExecutionCancelledError,
    ExecutionEvent,
    Finished,
    Graph,
    Key,
    MemoryStore,
    MessageTx,
    NodeContext,
    NoValue,
    Proceed,
    Retry,
    Stream,
    StreamFailedError,
)
from streams._store._node_records import COMPLETE_CHAIN
from streams._store._nodes import attempt_scope
from streams.store import (
    AttemptFailure,
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    NodeCheckpoint,
)
from streams.testing import InjectedFault, stray_cancellation

SCOPE = "run"
N = Key("n", int)
MESSAGES = Key("messages", Stream[int])
WRONG = 1000  # what node code that returns after a cancellation adds to its value: no run gives it

NODE_HOOKS = ("open_attempt", "fail_attempt", "open_child", "commit_nodes")
STREAM_HOOKS = ("open", "append", "open_message", "fail_message", "commit", "finish", "describe")
FAILURE_HOOKS = frozenset({"fail_attempt", "fail_message"})  # the calls that spend a budget


class Crash(BaseException):
    """The process died here."""


class Flaky(Exception):
    pass


class CleanupBroke(Exception):
    """Node code that caught a cancellation raised this instead of letting it through."""


async def passthrough(ctx: NodeContext, proceed: Proceed) -> None:
    """A function aspect of the execution's chain (it moves every Retry one place along)."""
    await proceed()


#: The execution's aspect chains a run may start with; each describes differently.
CHAINS: tuple[tuple[Aspect, ...], ...] = ((), (Retry(2),), (passthrough,), (passthrough, Retry(2)))

OnCancel = Literal["through", "raises", "returns", "skips"]
Ending = Literal["all", "limit", "stop"]
ON_CANCEL: tuple[OnCancel, ...] = ("through", "through", "raises", "returns", "skips")
on_cancels = st.sampled_from(ON_CANCEL)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    requires: tuple[int, ...]  # earlier nodes; () reads the input
    failures: int  # the first runs of the body that fail (across crashes)
    retry: int  # 0: no Retry; else its attempts
    in_sub: bool  # inside the Sub mount "m" (which holds only such nodes, in a line from its inlet)
    on_cancel: OnCancel = "through"  # what its code does when a cancellation reaches its await point


@dataclass(frozen=True)
class ReaderSpec:
    inside: bool  # inside the Sub alias "s"
    ending: Ending  # to the end; or only messages 1..count: limit=count, or tx.stop()
    count: int
    on_cancel: OnCancel

    def takes(self, messages: int) -> int:
        """How many messages this reader sums."""
        return messages if self.ending == "all" else min(self.count, messages)

    def early(self, messages: int) -> bool:
        """Whether ``w`` waits for this reader to conclude before it sends the rest of its messages.

        A ``stop`` reader needs only its first messages, which ``w`` sent; so
        does ``limit=0``. A ``limit`` reader resumed after a crash handles up
        to ``count`` more (and ignores those): ``w`` never waits for it.
        """
        if self.ending == "stop":
            return self.count < messages
        return self.ending == "limit" and self.count == 0 and messages > 0


@st.composite
def reader_specs(draw: st.DrawFn) -> ReaderSpec:
    endings: tuple[Ending, ...] = ("all", "limit", "stop", "stop")
    ending = draw(st.sampled_from(endings))
    return ReaderSpec(
        draw(st.booleans()),
        ending,
        draw(st.integers(1 if ending == "stop" else 0, 3)),
        draw(on_cancels),
    )


@dataclass(frozen=True)
class StreamSpec:
    messages: int  # node w sends n + 1 .. n + messages
    readers: tuple[ReaderSpec, ...]  # reader r<i> for each entry
    flaky_reader: bool  # reader r0's handler fails its first attempt at the first message
    retry: int = 0  # w's Retry (0: none)
    fails_after: int | None = None  # w raises once right after sending this message, never flushed
    on_cancel: OnCancel = "through"

    def hold(self) -> int | None:
        """After which message ``w`` flushes and waits for the early readers to conclude (None: never)."""
        early = [r.takes(self.messages) for r in self.readers if r.early(self.messages)]
        return max(early) if early else None


@st.composite
def stream_specs(draw: st.DrawFn) -> StreamSpec | None:
    if draw(st.integers(0, 2)) == 0:
        return None
    messages = draw(st.integers(0, 8))
    return StreamSpec(
        messages,
        tuple(draw(st.lists(reader_specs(), min_size=1, max_size=3))),
        draw(st.booleans()),
        draw(st.sampled_from([0, 0, 2, 3])),
        draw(st.none() | st.integers(1, messages)) if messages else None,
        draw(on_cancels),
    )


@st.composite
def graph_specs(draw: st.DrawFn) -> list[NodeSpec]:
    count = draw(st.integers(1, 5))
    specs: list[NodeSpec] = []
    for i in range(count):
        earlier = [j for j in range(i) if not specs[j].in_sub]
        requires = tuple(sorted(draw(st.sets(st.sampled_from(earlier), max_size=2)))) if earlier else ()
        specs.append(
            NodeSpec(
                f"n{i}",
                requires,
                draw(st.sampled_from([0, 0, 1, 2])),
                draw(st.sampled_from([0, 0, 1, 2, 3])),
                in_sub=draw(st.booleans()) and i > 0 and not requires,
                on_cancel=draw(on_cancels),
            )
        )
    return specs


def expected_values(specs: list[NodeSpec], n: int) -> dict[str, int]:
    """What each node sets in a run without failures: its index plus the sum of its inputs."""
    values: dict[str, int] = {}
    for spec in specs:
        values[spec.name] = (n if not spec.requires else sum(values[f"n{j}"] for j in spec.requires)) + int(
            spec.name[1:]
        )
    return values


@dataclass(frozen=True)
class Trouble:
    """What goes wrong in one run (one thing at most).

    ``crash``: the process dies at the ``at``-th hook call (of all hooks),
    before or ``after`` its effect, and makes no call after. ``cancel``: the
    host cancels the run (its cancel scope, or ``Execution.cancel()`` with
    ``by_execution``) at the ``at``-th hook call, or, with ``node``, when the
    code of that node (an index into the graph's bodies, wrapping) reaches
    its await point. ``fault``: the ``at``-th call of ``hook`` fails, before
    its effect (refused) or ``after`` it (the answer lost), with
    :class:`InjectedFault` or with a cancellation exception nothing asked
    for (``stray``).
    """

    kind: Literal["crash", "cancel", "fault"]
    at: int = 0
    after: bool = False
    hook: str = ""
    stray: bool = False
    node: int | None = None
    by_execution: bool = False


troubles = st.one_of(
    st.none(),
    st.builds(Trouble, st.just("crash"), at=st.integers(1, 25), after=st.booleans()),
    st.builds(
        Trouble, st.just("cancel"), at=st.integers(1, 25), after=st.booleans(), by_execution=st.booleans()
    ),
    st.builds(Trouble, st.just("cancel"), node=st.integers(0, 8), by_execution=st.booleans()),
    st.builds(
        Trouble,
        st.just("fault"),
        at=st.integers(1, 2),
        after=st.booleans(),
        hook=st.sampled_from(NODE_HOOKS + STREAM_HOOKS),
        stray=st.booleans(),
    ),
)


@dataclass
class World:
    """What happens outside the store: how often each body ran, and what the test saw."""

    runs: Counter[str] = field(default_factory=Counter)  # bodies started, across runs
    tries: Counter[str] = field(default_factory=Counter)  # bodies past their await point, across runs
    violations: list[str] = field(default_factory=list)
    flaked: bool = False  # r0's handler failed once already
    writer_failed: bool = False  # w raised its one failure already
    # -- this run
    business: Counter[str] = field(default_factory=Counter)  # the node's code failed, for its own reasons
    #: node code that kept a cancellation: where it is, and the scope of its level then (a Sub's child
    #: runs again, legitimately, under the next attempt of its mount)
    swallowed: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)  # Finished events seen
    early_done: anyio.Event | None = None  # every early reader concluded (w waits for it)

    def new_run(self) -> None:
        self.business.clear()
        self.swallowed.clear()
        self.finished.clear()
        self.early_done = None


@dataclass
class RunReport:
    """What the last run did to the budgets and to the run's fate, for the invariants."""

    trouble: Trouble | None = None
    struck: bool = False
    spent: dict[str, int] = field(default_factory=dict)  # confirmed failures each node's boundaries gained
    business: Counter[str] = field(default_factory=Counter)
    carried: set[str] = field(default_factory=set)  # nodes with a boundary exhausted before the run
    newly_failed: bool = False  # the run's final failure was confirmed in this run
    failures_before: int = 0  # fail_attempt calls started before the trouble struck
    late_failures: list[str] = field(default_factory=list)  # fail_* calls started after it struck


class TroubledHooks:
    """The store's node and stream hooks as one run sees them: ``trouble`` strikes once; calls are watched."""

    def __init__(self, inner: Any, trouble: Trouble | None, *, target: str | None = None) -> None:
        self.inner = inner
        self.trouble = trouble
        self.target = target  # the node whose code the host cancels in (a ``cancel`` with ``node``)
        self.calls = 0
        self.per_hook: Counter[str] = Counter()
        self.dead = False
        self.struck = False
        self.failures_before = 0
        self.late_failures: list[str] = []
        self.host: anyio.CancelScope | None = None
        self.execution: Execution | None = None
        self.streams = TroubledStreams(self)

    def struck_by(self, kind: str) -> bool:
        return self.struck and self.trouble is not None and self.trouble.kind == kind

    async def call(self, name: str, call: Callable[[], Awaitable[Any]]) -> Any:
        if self.dead:
            raise Crash
        self.calls += 1
        self.per_hook[name] += 1
        if name in FAILURE_HOOKS:
            if self.struck:
                self.late_failures.append(f"{name} call {self.per_hook[name]}")
            elif name == "fail_attempt":
                self.failures_before += 1
        due = self._due(name)
        if due and not self._after():
            self._strike(name)
        result = await call()
        if due and self._after():
            self._strike(name)
        return result

    def _after(self) -> bool:
        return self.trouble is not None and self.trouble.after

    def _due(self, name: str) -> bool:
        trouble = self.trouble
        if trouble is None or self.struck:
            return False
        if trouble.kind == "fault":
            return name == trouble.hook and self.per_hook[name] == trouble.at
        return trouble.node is None and self.calls == trouble.at

    def _strike(self, name: str) -> None:
        assert self.trouble is not None
        self.struck = True
        if self.trouble.kind == "crash":
            self.dead = True
            raise Crash
        if self.trouble.kind == "cancel":
            self._cancel()
            return
        what = f"injected failure of {name} call {self.per_hook[name]}"
        raise stray_cancellation(what) if self.trouble.stray else InjectedFault(what)

    def _cancel(self) -> None:
        assert self.trouble is not None
        if self.trouble.by_execution:
            assert self.execution is not None
            self.execution.cancel()
        else:
            assert self.host is not None
            self.host.cancel()

    def cancel_in(self, node: str) -> bool:
        """Node code at its await point: whether the host cancels the run right here."""
        if self.struck or self.trouble is None or self.trouble.kind != "cancel" or node != self.target:
            return False
        self.struck = True
        self._cancel()
        return True

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        result: CheckpointAttempt = await self.call("open_attempt", lambda: self.inner.open_attempt(request))
        return result

    async def fail_attempt(self, scope: str, failure: AttemptFailure | None = None) -> CheckpointAttempt:
        result: CheckpointAttempt = await self.call(
            "fail_attempt", lambda: self.inner.fail_attempt(scope, failure)
        )
        return result

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        result: CheckpointChildOpened = await self.call("open_child", lambda: self.inner.open_child(child))
        return result

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        await self.call("commit_nodes", lambda: self.inner.commit_nodes(commits))

    async def node_records(self, scope: str) -> tuple[NodeCheckpoint, ...]:
        records: tuple[NodeCheckpoint, ...] = await self.inner.node_records(scope)
        return records

    async def scope_failed(self, scope: str) -> bool:
        return bool(await self.inner.scope_failed(scope))


class TroubledStreams:
    """The store's stream hooks, counting their calls with the node hooks' toward the same trouble."""

    def __init__(self, hooks: TroubledHooks) -> None:
        self._hooks = hooks
        self._inner = hooks.inner.streams

    async def open(self, request: Any) -> Any:
        return await self._hooks.call("open", lambda: self._inner.open(request))

    async def append(self, batch: Any) -> None:
        await self._hooks.call("append", lambda: self._inner.append(batch))

    async def open_message(self, request: Any) -> Any:
        return await self._hooks.call("open_message", lambda: self._inner.open_message(request))

    async def fail_message(self, request: Any) -> Any:
        return await self._hooks.call("fail_message", lambda: self._inner.fail_message(request))

    async def commit(self, commits: Any) -> None:
        await self._hooks.call("commit", lambda: self._inner.commit(commits))

    async def finish(self, request: Any) -> None:
        await self._hooks.call("finish", lambda: self._inner.finish(request))

    async def describe(self, ref: Any) -> Any:
        return await self._hooks.call("describe", lambda: self._inner.describe(ref))


class TroubledBook:
    """The LMDB ledger's run records, with one run's troubled hooks as the node store its runs use."""

    def __init__(self, ledger: Ledger[LmdbBackend], hooks: TroubledHooks) -> None:
        self._book = ledger.backend.run_book
        self._hooks = hooks

    @property
    def where(self) -> str:
        return self._book.where

    @property
    def nodes(self) -> Any:
        return self._hooks

    async def read(self, run_id: str) -> RunRecord | None:
        return await self._book.read(run_id)

    async def write(self, record: RunRecord, *, new: bool, unless_cancelled: bool = False) -> None:
        await self._book.write(record, new=new, unless_cancelled=unless_cancelled)

    async def records(self) -> list[RunRecord]:
        return await self._book.records()

    async def delete(self, record: RunRecord) -> RunDeleted:
        return await self._book.delete(record)


T = TypeVar("T")


def settled(read: Coroutine[Any, Any, T]) -> T:
    """The answer of a store read that never suspends (the memory and LMDB stores read inline)."""
    try:
        read.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    read.close()
    raise AssertionError("the store's read suspended: read it from the event loop")


class NodeMachine(RuleBasedStateMachine):
    kind = "memory"
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="streamledger-nodes-"))
        self.exit_stack = contextlib.ExitStack()
        self.portal: BlockingPortal = self.exit_stack.enter_context(start_blocking_portal(self.backend))
        self.memory = MemoryStore()
        self.session: contextlib.ExitStack | None = None
        self.world = World()
        self.hooks = TroubledHooks(self.memory, None)
        self.report = RunReport()
        self.failed_for_good = False
        self.finished = False
        self.failures_seen: dict[tuple[str, str, int], int] = {}
        self.open_store()

    def teardown(self) -> None:
        try:
            if self.session is not None:
                self.session.close()
        finally:
            self.exit_stack.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def open_store(self) -> None:
        session = contextlib.ExitStack()
        if self.kind == "lmdb":
            self.ledger = session.enter_context(
                self.portal.wrap_async_context_manager(open_ledger(self.dir / "l"))
            )
            self.store: Any = self.ledger.nodes
        else:
            self.store = self.memory
        self.session = session

    # -- the graph ---------------------------------------------------------------------------

    @initialize(
        specs=graph_specs(),
        stream=stream_specs(),
        n=st.integers(0, 100),
        chain=st.sampled_from([0, 0, 1, 2, 3]),
    )
    def build(self, specs: list[NodeSpec], stream: StreamSpec | None, n: int, chain: int) -> None:
        self.specs, self.stream, self.n, self.chain = specs, stream, n, chain
        self.aspects = CHAINS[chain]
        self.expected = expected_values(specs, n)
        self.bodies = [spec.name for spec in specs]
        self.early: list[set[str]] = []  # w waits until each has a Finished event: the reader, or its mount
        if stream is not None:
            self.bodies.append("w")
            for i, reader in enumerate(stream.readers):
                self.expected[f"r{i}"] = sum(range(n + 1, n + reader.takes(stream.messages) + 1))
                self.bodies.append(f"r{i}")
                if reader.early(stream.messages):
                    self.early.append({f"r{i}", "s"} if reader.inside else {f"r{i}"})
        self.graph = self._graph()

    def _graph(self) -> Graph:
        keys = {spec.name: Key(spec.name, int) for spec in self.specs}
        graph = Graph("machine", version="1", inputs=[N])
        inner = [spec for spec in self.specs if spec.in_sub]
        if inner:
            child_input = Key("m_in", int)
            child = Graph("child", version="1", inputs=[child_input])
            for spec in inner:
                child.add_node(
                    spec.name, self._body(spec, [child_input], keys), **self._ports(spec, [child_input], keys)
                )
            graph.sub(
                "m", child, inlets={child_input: N}, outlets={keys[s.name]: keys[s.name] for s in inner}
            )
        for spec in self.specs:
            if not spec.in_sub:
                needs = [keys[f"n{j}"] for j in spec.requires] or [N]
                graph.add_node(spec.name, self._body(spec, needs, keys), **self._ports(spec, needs, keys))
        if self.stream is not None:
            self._stream_stage(graph, self.stream)
        return graph

    def _stream_stage(self, graph: Graph, spec: StreamSpec) -> None:
        graph.add_node(
            "w",
            self._counted("w", self._writer(spec)),
            requires=[N],
            provides=[MESSAGES],
            resumable=True,
            aspects=[Retry(spec.retry)] if spec.retry else [],
        )
        child = Graph("aliased", version="1", inputs=[MESSAGES])
        for i, reader in enumerate(spec.readers):
            total = Key(f"r{i}", int)
            (child if reader.inside else graph).add_node(
                f"r{i}",
                self._counted(
                    f"r{i}", self._reader(f"r{i}", reader, total, flaky=spec.flaky_reader and i == 0)
                ),
                requires=[MESSAGES],
                provides=[total],
            )
        outlets = {Key(f"r{i}", int): Key(f"r{i}", int) for i, r in enumerate(spec.readers) if r.inside}
        if outlets:
            graph.sub("s", child, inlets={MESSAGES: MESSAGES}, outlets=outlets)

    def _writer(self, spec: StreamSpec) -> Callable[[NodeContext], Awaitable[None]]:
        world, machine, n, hold = self.world, self, self.n, spec.hold()

        async def write(ctx: NodeContext) -> None:
            machine._started("w")
            writer = ctx.writer(MESSAGES)
            start = writer.position or 0
            if hold == 0 == start and await machine._pause(ctx, spec.on_cancel, machine._early_done):
                return
            for i in range(start + 1, spec.messages + 1):
                await writer.send(n + i, send_at=i)
                if i == spec.fails_after and not world.writer_failed:
                    world.writer_failed = True
                    raise Flaky("w")  # sent, never flushed: a retry continues from what the stream kept
                if i == hold:
                    await writer.flush()
                if await machine._pause(ctx, spec.on_cancel, machine._early_done if i == hold else None):
                    return

        return write

    def _reader(
        self, name: str, spec: ReaderSpec, total: Key[int], *, flaky: bool
    ) -> Callable[[NodeContext], Awaitable[None]]:
        world, machine, n = self.world, self, self.n

        async def read(ctx: NodeContext) -> None:
            machine._started(name)

            async def add(tx: MessageTx[int], value: int) -> None:
                if machine.hooks.cancel_in(name):  # the host cancels while a message is being handled
                    await anyio.sleep_forever()
                if flaky and not world.flaked:
                    world.flaked = True
                    raise Flaky(ctx.node)
                if spec.ending != "all" and value - n > spec.count:
                    return  # past what this reader takes (a limit reader resumed): acked, nothing changes
                tx.set_state(tx.state + value)
                tx.set(total, tx.state)
                if spec.ending == "stop" and value - n == spec.count:
                    tx.stop()

            limit = spec.count if spec.ending == "limit" else None
            try:
                result = await ctx.handle_messages(MESSAGES, add, initial_state=0, attempts=2, limit=limit)
            except anyio.get_cancelled_exc_class():
                if machine._swallows(ctx, spec.on_cancel):
                    return
                raise
            if result.result(total) is NoValue:
                ctx.set(total, 0)  # no message: nothing was set

        return read

    def _ports(self, spec: NodeSpec, needs: list[Key[int]], keys: dict[str, Key[int]]) -> dict[str, Any]:
        return {
            "requires": needs,
            "provides": [keys[spec.name]],
            "aspects": [Retry(spec.retry)] if spec.retry else [],
        }

    def _body(
        self, spec: NodeSpec, needs: list[Key[int]], keys: dict[str, Key[int]]
    ) -> Callable[[NodeContext], Awaitable[None]]:
        world, machine = self.world, self

        async def body(ctx: NodeContext) -> None:
            confirmed = machine._started(spec.name)
            for key in needs:
                if key.name in machine.expected and key.name not in confirmed:
                    world.violations.append(f"{spec.name} read {key.name} before its record was confirmed")
            got = sum(ctx[key] for key in needs)
            want = machine.n if not spec.requires else sum(machine.expected[f"n{j}"] for j in spec.requires)
            if got != want:
                world.violations.append(f"{spec.name} got inputs summing to {got}, not {want}")
            if await machine._pause(ctx, spec.on_cancel):
                ctx.set(keys[spec.name], got + WRONG)
                return
            world.tries[spec.name] += 1
            if world.tries[spec.name] <= spec.failures:
                raise Flaky(spec.name)
            ctx.set(keys[spec.name], got + int(spec.name[1:]))

        return self._counted(spec.name, body)

    # -- what node code does ------------------------------------------------------------------

    def _counted(
        self, name: str, fn: Callable[[NodeContext], Awaitable[None]]
    ) -> Callable[[NodeContext], Awaitable[None]]:
        """``fn``, with its business failures counted: what it raises for its own reasons, not what
        it raises after a cancellation reached it, nor a fault of the store coming through it."""
        world = self.world

        async def counted(ctx: NodeContext) -> None:
            try:
                await fn(ctx)
            except (CleanupBroke, CheckpointError, InjectedFault):
                raise
            except Exception:
                world.business[name] += 1
                raise

        return counted

    def _started(self, name: str) -> set[str]:
        """A body starts: it must not have a confirmed record, nor have kept a cancellation in this run."""
        confirmed = self.confirmed()
        if name in confirmed:
            self.world.violations.append(f"{name} ran after its record was confirmed")
        if name in self.world.swallowed and self.world.swallowed[name][1] == self._level_scope(name):
            self.world.violations.append(f"{name} ran again in the run after its code kept a cancellation")
        self.world.runs[name] += 1
        return confirmed

    async def _pause(
        self, ctx: NodeContext, how: OnCancel, wait: Callable[[], Awaitable[None]] | None = None
    ) -> bool:
        """Node code's await point, where a cancellation may reach it (and where the host cancels, if
        the run's trouble says so). True if the code kept the cancellation and returns now."""
        try:
            if self.hooks.cancel_in(ctx.node):
                await anyio.sleep_forever()
            if wait is not None:
                await wait()
            else:
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            if self._swallows(ctx, how):
                return True
            raise
        return False

    def _swallows(self, ctx: NodeContext, how: OnCancel) -> bool:
        """Node code caught a cancellation: False lets it through; else it raises, skips or returns (True)."""
        if how == "through":
            return False
        self.world.swallowed[ctx.node] = ((*ctx.path, ctx.node), self._level_scope(ctx.node))
        if how == "raises":
            raise CleanupBroke(ctx.node)
        if how == "skips":
            ctx.skip_node()
        return True

    async def _early_done(self) -> None:
        assert self.world.early_done is not None
        await self.world.early_done.wait()

    def _on_event(self, event: ExecutionEvent) -> None:
        if isinstance(event, Finished):
            self.world.finished.add(event.node)
            self._check_early()

    def _check_early(self) -> None:
        assert self.world.early_done is not None
        if all(names & self.world.finished for names in self.early):
            self.world.early_done.set()

    # -- reading the store ------------------------------------------------------------------

    def records(self) -> dict[str, NodeCheckpoint]:
        """Confirmed records of the run's nodes and of the Subs' children (under their mount's attempt)."""
        found = {r.node: r for r in settled(self.store.node_records(SCOPE))}
        for scope in self.child_scopes().values():
            for record in settled(self.store.node_records(scope)):
                found[record.node] = record
        return found

    def child_scopes(self) -> dict[str, str]:
        """The scope of each Sub's child: under the mount's current attempt (an ambient Retry's, if any)."""
        attempts = self._attempts()
        scopes = {}
        for mount in ("m", "s"):
            scope = self._current(attempts, SCOPE, mount, COMPLETE_CHAIN, 1)
            for position, aspect in enumerate(self.aspects, start=1):
                if isinstance(aspect, Retry):
                    scope = self._current(attempts, scope, mount, position, aspect.attempts)
            scopes[mount] = f"{scope}/{mount}"
        return scopes

    @staticmethod
    def _current(
        attempts: dict[tuple[str, str, int], Any], parent: str, node: str, position: int, limit: int
    ) -> str:
        record = attempts.get((parent, node, position))
        return str(record.scope) if record is not None else attempt_scope(parent, node, position, limit, 0)

    def confirmed(self) -> set[str]:
        return set(self.records())

    def _attempts(self) -> dict[tuple[str, str, int], Any]:
        if isinstance(self.store, MemoryStore):
            records = list(self.store._node_attempts.values())
        else:
            from ledger.lmdb._nodes import node_attempts

            records = list(node_attempts(self.store.env))
        return {(r.parent, r.node, r.position): r for r in records}

    def _boundaries(self) -> list[tuple[str, str, int, int]]:
        return [(r.parent, r.node, r.position, r.index) for r in self._attempts().values()]

    def store_failed(self) -> bool:
        return bool(settled(self.store.scope_failed(SCOPE)))

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: hasattr(self, "graph"))
    @rule(trouble=troubles)
    def run(self, trouble: Trouble | None) -> None:
        self.world.new_run()
        target = (
            None if trouble is None or trouble.node is None else self.bodies[trouble.node % len(self.bodies)]
        )
        hooks = self.hooks = TroubledHooks(self.store, trouble, target=target)
        runs_before = Counter(self.world.runs)
        confirmed_before = self.confirmed()
        scopes_before = self.child_scopes()
        failed_before = self.store_failed()
        boundaries_before = self._boundaries()
        self.exhausted_before = [(r.node, bool(r.exhausted)) for r in self._attempts().values()]

        if failed_before:  # a run failed for good never starts again
            self.failed_for_good = True
            if self.kind == "lmdb":  # Runs.resume refuses it before anything
                assert self.portal.call(self._refused, self.aspects) == "failed"
                assert hooks.calls == 0 and self.world.runs == runs_before
            return
        outcome = self.portal.call(self._go, hooks)
        event(f"run {outcome}" + (f" after a {trouble.kind} struck" if trouble and hooks.struck else ""))
        if self.world.swallowed:
            event("node code kept a cancellation")
        if (
            self.stream is not None
            and "w" not in self.confirmed()
            and set(self.bodies[-len(self.stream.readers) :]) & self.confirmed()
        ):
            event("a reader confirmed while its writer is active")
        scopes = self.child_scopes()
        for name in confirmed_before - self._in_retried_mounts(scopes_before, scopes):
            assert self.world.runs[name] == runs_before[name], f"{name} ran again"
        self._note(hooks, trouble, boundaries_before, failed_before)
        confirmed = self.confirmed()
        statuses = hooks.execution.result().statuses if hooks.execution is not None else {}
        for name, (where, scope) in self.world.swallowed.items():
            if scope != self._level_scope(name):
                continue  # its mount failed, and its next attempt ran it again
            assert name not in confirmed, f"{name} was confirmed after its code kept a cancellation"
            if not hooks.dead:
                assert statuses.get(where) == "cancelled", (where, statuses.get(where))
        if outcome == "finished":
            assert not hooks.struck_by("fault"), f"{trouble}: the run finished as if nothing failed"
            self.finished = True
            assert confirmed >= set(self.expected)
            if self.stream is not None:  # each message stored once, whatever crashed in between
                assert self.appended == [self.stream.messages], self.appended
        if outcome == "failed":
            assert self.store_failed(), "a run failed without its final failure confirmed"
            self.failed_for_good = True

    def _note(
        self,
        hooks: TroubledHooks,
        trouble: Trouble | None,
        boundaries_before: list[tuple[str, str, int, int]],
        failed_before: bool,
    ) -> None:
        """What the run did to the budgets and to the run's fate, for the invariants."""
        before = {(parent, node, position): index for parent, node, position, index in boundaries_before}
        carried = {node for node, exhausted in self.exhausted_before if exhausted}
        spent: Counter[str] = Counter()
        for parent, node, position, index in self._boundaries():
            spent[node] += index - before.get((parent, node, position), 0)
        self.report = RunReport(
            trouble,
            hooks.struck,
            dict(spent),
            Counter(self.world.business),
            carried,
            self.store_failed() and not failed_before,
            hooks.failures_before,
            list(hooks.late_failures),
        )

    async def _go(self, hooks: TroubledHooks) -> str:
        self.world.early_done = anyio.Event()
        self._check_early()
        try:
            with anyio.CancelScope() as hooks.host:
                self.appended = await self._execute(hooks)
                return "crashed" if hooks.dead else "finished"
        except (Flaky, ConfirmedFailureError, StreamFailedError):
            return "crashed" if hooks.dead else "failed"
        except BaseException as exc:
            if hooks.dead and _holds(exc, (Crash, CheckpointError)):
                return "crashed"  # the process died; whatever else unwound with it
            if isinstance(exc, CheckpointError) and hooks.struck_by("fault"):
                return "faulted"
            if isinstance(exc, ExecutionCancelledError) and hooks.struck_by("cancel"):
                return "cancelled"
            raise
        assert hooks.struck_by("cancel") or hooks.dead, "the host's scope caught a cancellation it never made"
        return "crashed" if hooks.dead else "cancelled"

    async def _execute(self, hooks: TroubledHooks) -> list[int]:
        """One run to its end: on the LMDB ledger through its runs, as a host does; else an Execution."""

        def started(execution: Execution) -> None:
            hooks.execution = execution

        if self.kind == "lmdb":
            book = TroubledBook(self.ledger, hooks)
            runs = Runs(book)
            options: dict[str, Any] = {
                "aspects": self.aspects,
                "on_event": self._on_event,
                "on_start": started,
            }
            if await book.read(SCOPE) is None:
                await runs.run(self.graph, {N: self.n}, run_id=SCOPE, **options)
            else:
                await runs.resume(SCOPE, self.graph, **options)
        else:
            execution = Execution(
                self.graph,
                {N: self.n},
                aspects=self.aspects,
                on_event=self._on_event,
                checkpoint=ExecCheckpoint(SCOPE, hooks),
            )
            execution.restore_nodes(await self.store.node_records(SCOPE))
            started(execution)
            async with execution:
                await execution.wait()
        assert hooks.execution is not None
        return [stream.snapshot().appended for stream in hooks.execution.streams().values()]

    async def _refused(self, aspects: tuple[Aspect, ...]) -> str:
        """``Runs.resume`` with ``aspects``, which must refuse: why (``aspects``, ``failed``, ``unknown``)."""
        book = TroubledBook(self.ledger, self.hooks)
        before = await book.read(SCOPE)
        try:
            await Runs(book).resume(SCOPE, self.graph, aspects=aspects)
        except RunAspectsMismatchError:
            why = "aspects"
        except ConfirmedFailureError:
            why = "failed"
        except LookupError:  # UnknownRunError
            why = "unknown"
        else:
            raise AssertionError(f"resume with {aspects} was not refused")
        assert await book.read(SCOPE) == before, "a refused resume changed the run's record"
        return why

    @precondition(lambda self: self.kind == "lmdb" and hasattr(self, "graph"))
    @rule(shift=st.integers(1, len(CHAINS) - 1))
    def resume_with_another_chain(self, shift: int) -> None:
        """A resume with another execution aspect chain is refused before anything is called or run."""
        other = CHAINS[(self.chain + shift) % len(CHAINS)]
        self.world.new_run()
        hooks = self.hooks = TroubledHooks(self.store, None)
        runs_before = Counter(self.world.runs)
        boundaries_before = self._boundaries()
        record = self.portal.call(self.ledger.backend.run_book.read, SCOPE)
        why = self.portal.call(self._refused, other)
        if record is None:
            assert why == "unknown"
        elif self.store_failed():
            assert why == "failed"
        else:
            assert why == "aspects", why
        assert hooks.calls == 0, f"a refused resume made {hooks.calls} hook calls"
        assert self.world.runs == runs_before, "a refused resume ran node code"
        assert self._boundaries() == boundaries_before

    @precondition(lambda self: self.kind == "lmdb")
    @rule()
    def restart(self) -> None:
        assert self.session is not None
        self.session.close()
        self.session = None
        self.open_store()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def nothing_wrong_was_seen(self) -> None:
        assert not self.world.violations, self.world.violations

    @invariant()
    def records_hold_the_models_values(self) -> None:
        if not hasattr(self, "expected"):
            return
        for name, record in self.records().items():
            if name in ("m", "s", "w"):  # mounts and the writer hold no value of their own
                continue
            [output] = record.outputs
            assert record.reason == "completed" and output.value is not None, (name, record)
            assert msgspec.msgpack.decode(output.value) == self.expected[name], name

    @invariant()
    def budgets_never_refill(self) -> None:
        for parent, node, position, index in self._boundaries():
            key = (parent, node, position)
            assert index >= self.failures_seen.get(key, 0), (
                f"{key}: failures went from {self.failures_seen[key]} to {index}"
            )
            self.failures_seen[key] = index

    @invariant()
    def cancellations_and_faults_spend_no_budget(self) -> None:
        """A node's boundaries gain at most one confirmed failure per business failure of its code in
        the run (or failure confirmed for good before it) and Retry it leaves, plus its final one (a
        mount's: its children's); so none for a cancellation or a fault."""
        report = self.report
        ambient = sum(isinstance(aspect, Retry) for aspect in self.aspects)
        own = {spec.name: spec.retry for spec in self.specs}
        if self.stream is not None:
            own["w"] = self.stream.retry
        for node, spent in report.spent.items():
            # a failure confirmed for good before the run (a child's, an inner Retry's) is raised again
            if node in ("m", "s"):
                inside = {s.name for s in self.specs if s.in_sub} if node == "m" else self._inside_readers()
                failures = sum(report.business[name] for name in inside) + bool(inside & report.carried)
            else:
                failures = report.business[node] + (node in report.carried)
            # each failure is confirmed once at each Retry it leaves, then the final one at the root
            allowed = failures * (ambient + (own.get(node, 0) > 0)) + (failures > 0)
            assert spent <= allowed, (
                f"{report.trouble}: {node}'s boundaries gained {spent} confirmed failures in the run, "
                f"with {failures} business failures of its code"
            )

    def _level_scope(self, name: str) -> str:
        """The scope of the level node ``name`` runs in now: the run's, or its Sub child's."""
        if any(spec.name == name and spec.in_sub for spec in self.specs):
            return self.child_scopes()["m"]
        return self.child_scopes()["s"] if name in self._inside_readers() else SCOPE

    def _in_retried_mounts(self, before: dict[str, str], after: dict[str, str]) -> set[str]:
        """The children of the mounts an ambient Retry ran again: they run again under the new attempt."""
        retried = {mount for mount, scope in before.items() if after[mount] != scope}
        return ({s.name for s in self.specs if s.in_sub} if "m" in retried else set()) | (
            self._inside_readers() if "s" in retried else set()
        )

    def _inside_readers(self) -> set[str]:
        if self.stream is None:
            return set()
        return {f"r{i}" for i, reader in enumerate(self.stream.readers) if reader.inside}

    @invariant()
    def no_run_is_failed_by_a_cancellation_or_a_fault(self) -> None:
        report = self.report
        if report.trouble is None or report.trouble.kind == "crash" or not report.struck:
            return
        assert not report.late_failures, (
            f"{report.trouble}: failures were confirmed after it struck: {report.late_failures}"
        )
        if report.newly_failed:  # by failures of node code (or confirmed for good earlier) before it struck
            assert report.failures_before and (sum(report.business.values()) or report.carried), (
                f"{report.trouble}: the run failed for good, no business failure confirmed before it struck"
            )


def _holds(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` is, causes, or (in a group) contains one of ``kinds``."""
    if isinstance(exc, kinds) or (exc.__cause__ is not None and _holds(exc.__cause__, kinds)):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_holds(inner, kinds) for inner in exc.exceptions)
    return False
