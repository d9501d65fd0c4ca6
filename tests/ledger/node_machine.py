"""A hypothesis state machine over random small graphs in checkpoint mode, crashed at any hook call.

``build`` draws a graph: nodes in a line, fanned out from the input, or
joining earlier nodes, some flaky (failing their first runs) under a Retry,
some inside a Sub mount; and maybe a stream stage: node ``w`` writes a few
messages (continuing from its position after a crash), read by handler
nodes at the root and inside a Sub alias ``s``, each summing them in
explicit state, one of them flaky on its first message. ``run`` starts or
resumes the run, and may crash it at the k-th hook call (node hooks and
stream hooks alike), before or after that call took effect: the crash is a
``BaseException`` that no handler of the engine catches, and every later
call of that process fails too, as a dead process makes none.
``restart`` closes the store and opens it again (for the LMDB ledger, from
its files).

The invariants, checked during and after every run:

* a node whose record is confirmed never runs its body again;
* a node runs only on inputs whose producers' records are confirmed, and
  with the values a run without crashes would give it;
* every confirmed record holds exactly those values;
* a boundary's confirmed failures never go down (no budget refilled), and
  a run whose final failure is confirmed never starts again;
* a run that finishes has every value the model says, and its stream holds
  each message once.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ledger import open_ledger
from streams import (
    CheckpointAttempt,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    CheckpointError,
    ConfirmedFailureError,
    ExecCheckpoint,
    Execution,
    Graph,
    Key,
    MemoryStore,
    MessageTx,
    NodeCheckpoint,
    NodeContext,
    NoValue,
    Retry,
    Stream,
)

SCOPE = "run"
N = Key("n", int)
MESSAGES = Key("messages", Stream[int])


class Crash(BaseException):
    """The process died here."""


class Flaky(Exception):
    pass


@dataclass(frozen=True)
class NodeSpec:
    name: str
    requires: tuple[int, ...]  # earlier nodes; () reads the input
    failures: int  # the first runs of the body that fail (across crashes)
    retry: int  # 0: no Retry; else its attempts
    in_sub: bool  # inside the Sub mount "m" (which holds only such nodes, in a line from its inlet)


@dataclass(frozen=True)
class StreamSpec:
    messages: int  # node w sends n + 1 .. n + messages
    readers: tuple[bool, ...]  # one reader node per entry: inside the Sub alias "s" if True
    flaky_reader: bool  # reader r0's handler fails its first attempt at the first message


stream_specs = st.one_of(
    st.none(),
    st.builds(
        StreamSpec,
        st.integers(0, 6),
        st.lists(st.booleans(), min_size=1, max_size=3).map(tuple),
        st.booleans(),
    ),
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
                draw(st.integers(0, 2)),
                draw(st.sampled_from([0, 0, 1, 2, 3])),
                in_sub=draw(st.booleans()) and i > 0 and not requires,
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


@dataclass
class World:
    """What happens outside the store: how often each body ran, and what the test saw."""

    runs: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    flaked: bool = False  # r0's handler failed once already


class CrashingHooks:
    """The store's node hooks, dying at call ``crash_at`` (before or after its effect) and after it."""

    def __init__(self, inner: Any, crash_at: int | None, after: bool) -> None:
        self.inner = inner
        self.crash_at = crash_at
        self.after = after
        self.calls = 0
        self.dead = False

    @property
    def streams(self) -> Any:
        return _CrashingStreams(self)

    async def _call(self, call: Callable[[], Awaitable[Any]]) -> Any:
        if self.dead:
            raise Crash
        self.calls += 1
        if self.calls == self.crash_at and not self.after:
            self.dead = True
            raise Crash
        result = await call()
        if self.calls == self.crash_at:
            self.dead = True
            raise Crash
        return result

    async def open_attempt(self, request: CheckpointAttemptRequest) -> CheckpointAttempt:
        result: CheckpointAttempt = await self._call(lambda: self.inner.open_attempt(request))
        return result

    async def fail_attempt(self, scope: str) -> CheckpointAttempt:
        result: CheckpointAttempt = await self._call(lambda: self.inner.fail_attempt(scope))
        return result

    async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
        result: CheckpointChildOpened = await self._call(lambda: self.inner.open_child(child))
        return result

    async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
        await self._call(lambda: self.inner.commit_nodes(commits))


class _CrashingStreams:
    """The store's stream hooks, counting their calls with the node hooks' toward the same crash."""

    def __init__(self, hooks: CrashingHooks) -> None:
        self._hooks = hooks
        self._inner = hooks.inner.streams

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._inner, name)

        async def crashing(*args: Any) -> Any:
            return await self._hooks._call(lambda: call(*args))

        return crashing


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
            ledger = session.enter_context(
                self.portal.wrap_async_context_manager(open_ledger(self.dir / "l"))
            )
            self.store: Any = ledger.nodes
        else:
            self.store = self.memory
        self.session = session

    # -- the graph ---------------------------------------------------------------------------

    @initialize(specs=graph_specs(), stream=stream_specs, n=st.integers(0, 100))
    def build(self, specs: list[NodeSpec], stream: StreamSpec | None, n: int) -> None:
        self.specs, self.stream, self.n = specs, stream, n
        self.expected = expected_values(specs, n)
        if stream is not None:
            total = sum(range(n + 1, n + stream.messages + 1))
            self.expected.update({f"r{i}": total for i in range(len(stream.readers))})
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
        n = self.n

        async def write(ctx: NodeContext) -> None:
            writer = ctx.writer(MESSAGES)
            for i in range((writer.position or 0) + 1, spec.messages + 1):
                await writer.send(n + i, send_at=i)

        graph.add_node("w", write, requires=[N], provides=[MESSAGES], resumable=True)
        child = Graph("aliased", version="1", inputs=[MESSAGES])
        for i, inside in enumerate(spec.readers):
            total = Key(f"r{i}", int)
            (child if inside else graph).add_node(
                f"r{i}",
                self._reader(total, flaky=spec.flaky_reader and i == 0),
                requires=[MESSAGES],
                provides=[total],
            )
        outlets = {Key(f"r{i}", int): Key(f"r{i}", int) for i, inside in enumerate(spec.readers) if inside}
        if outlets:
            graph.sub("s", child, inlets={MESSAGES: MESSAGES}, outlets=outlets)

    def _reader(self, total: Key[int], *, flaky: bool) -> Any:
        world, machine = self.world, self

        async def read(ctx: NodeContext) -> None:
            if ctx.node in machine.confirmed():
                world.violations.append(f"{ctx.node} ran after its record was confirmed")

            async def add(tx: MessageTx[int], value: int) -> None:
                if flaky and not world.flaked:
                    world.flaked = True
                    raise Flaky(ctx.node)
                tx.set_state(tx.state + value)
                tx.set(total, tx.state)

            result = await ctx.handle_messages(MESSAGES, add, initial_state=0, attempts=2)
            if result.result(total) is NoValue:
                ctx.set(total, 0)  # no message: nothing was set

        return read

    def _ports(self, spec: NodeSpec, needs: list[Key[int]], keys: dict[str, Key[int]]) -> dict[str, Any]:
        return {
            "requires": needs,
            "provides": [keys[spec.name]],
            "aspects": [Retry(spec.retry)] if spec.retry else [],
        }

    def _body(self, spec: NodeSpec, needs: list[Key[int]], keys: dict[str, Key[int]]) -> Any:
        world, machine = self.world, self

        async def body(ctx: NodeContext) -> None:
            confirmed = machine.confirmed()
            if spec.name in confirmed:
                world.violations.append(f"{spec.name} ran after its record was confirmed")
            for key in needs:
                if key.name in machine.expected and key.name not in confirmed:
                    world.violations.append(f"{spec.name} read {key.name} before its record was confirmed")
            got = sum(ctx[key] for key in needs)
            want = machine.n if not spec.requires else sum(machine.expected[f"n{j}"] for j in spec.requires)
            if got != want:
                world.violations.append(f"{spec.name} got inputs summing to {got}, not {want}")
            world.runs[spec.name] = world.runs.get(spec.name, 0) + 1
            if world.runs[spec.name] <= spec.failures:
                raise Flaky(spec.name)
            ctx.set(keys[spec.name], got + int(spec.name[1:]))

        return body

    # -- reading the store ------------------------------------------------------------------

    def records(self) -> dict[str, NodeCheckpoint]:
        """Confirmed records of the run's nodes and of the Sub's children (under the mount's one attempt)."""
        found = {r.node: r for r in self.store.node_records(SCOPE)}
        for mount in ("m", "s"):
            for record in self.store.node_records(f"{SCOPE}/{mount}@0.1.0/{mount}"):
                found[record.node] = record
        return found

    def confirmed(self) -> set[str]:
        return set(self.records())

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: hasattr(self, "graph"))
    @rule(crash_at=st.one_of(st.none(), st.integers(1, 25)), after=st.booleans())
    def run(self, crash_at: int | None, after: bool) -> None:
        hooks = CrashingHooks(self.store, crash_at, after)
        runs_before = dict(self.world.runs)
        confirmed_before = self.confirmed()

        async def go() -> str:
            execution = Execution(self.graph, {N: self.n}, checkpoint=ExecCheckpoint(SCOPE, hooks))
            execution.restore_nodes(self.store.node_records(SCOPE))
            try:
                async with execution:
                    await execution.wait()
            except (Flaky, ConfirmedFailureError):
                return "crashed" if hooks.dead else "failed"
            except BaseException as exc:
                if hooks.dead and _holds(exc, (Crash, CheckpointError)):
                    return "crashed"  # the process died; whatever else unwound with it
                raise
            self.appended = [stream.snapshot().appended for stream in execution.streams().values()]
            return "crashed" if hooks.dead else "finished"

        if self.store_failed():  # the host's rule (ledger.resume): a run failed for good never starts
            self.failed_for_good = True
            return
        outcome = self.portal.call(go)
        for name in confirmed_before:
            assert self.world.runs.get(name, 0) == runs_before.get(name, 0), f"{name} ran again"
        if outcome == "finished":
            self.finished = True
            assert self.confirmed() >= set(self.expected)
            if self.stream is not None:  # each message stored once, whatever crashed in between
                assert self.appended == [self.stream.messages], self.appended
        if outcome == "failed":
            assert self.store_failed(), "a run failed without its final failure confirmed"
            self.failed_for_good = True

    def store_failed(self) -> bool:
        return bool(self.store.scope_failed(SCOPE))

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
            assert record.reason == "completed" and output.value is not None
            assert msgspec.msgpack.decode(output.value) == self.expected[name], name

    @invariant()
    def budgets_never_refill(self) -> None:
        for parent, node, position, index in self._boundaries():
            key = (parent, node, position)
            assert index >= self.failures_seen.get(key, 0), (
                f"{key}: failures went from {self.failures_seen[key]} to {index}"
            )
            self.failures_seen[key] = index

    def _boundaries(self) -> list[tuple[str, str, int, int]]:
        if isinstance(self.store, MemoryStore):
            records = list(self.store._node_attempts.values())
        else:
            from ledger._nodes import node_attempts

            records = list(node_attempts(self.store.env))
        return [(r.parent, r.node, r.position, r.index) for r in records]


def _holds(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` is, causes, or (in a group) contains one of ``kinds``."""
    if isinstance(exc, kinds) or (exc.__cause__ is not None and _holds(exc.__cause__, kinds)):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_holds(inner, kinds) for inner in exc.exceptions)
    return False
