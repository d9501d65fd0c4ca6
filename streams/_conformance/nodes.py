"""Node-hook conformance: what every :class:`~streams.store.CheckpointHooks` store must show, as checks.

Each check gets a :class:`NodeWorld` and runs checkpoint-mode executions on
the node store of one session: confirm before publishing, restore without
running, budgets that stay spent, children under per-attempt scopes, one
failure latch, plans checked whole. A "crash" is a host cancellation: the
execution's objects are dropped and a new execution resumes from what the
store confirmed. Published through :func:`streams.testing.check_node_store`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import anyio
import msgspec

from .._aspects import Proceed, Retry
from .._checkpoint import ExecCheckpoint
from .._context import NodeContext
from .._errors import CheckpointError, CheckpointScopeFailure, ConfirmedFailureError, RestorePlanError
from .._execution import Execution, ExecutionEvent, Finished, Running, Waiting
from .._graph import Graph
from .._keys import Key, NoValue
from .._store._node_records import (
    COMPLETE_CHAIN,
    CheckpointAttemptRequest,
    CheckpointChild,
    CheckpointChildOpened,
    CheckpointCommit,
    CheckpointOutput,
    NodeCheckpoint,
)
from .._testing import FaultyNodeHooks, InjectedFault, PassThroughNodeHooks, stray_cancellation
from ._support import raises

__all__ = ["NODE_CHECKS", "NodeWorld"]

URL = Key("url", str)
PAGE = Key("page", str)
TEXT = Key("text", str)
SUMMARY = Key("summary", str)
FIRST_URL = Key("first_url", str)
FIRST_SUMMARY = Key("first_summary", str)
N = Key("n", int)
TOTAL = Key("total", int)


class NodeWorld(Protocol):
    """One store's storage; a session yields its node hooks (with ``node_records`` and ``scope_failed``)."""

    def session(self) -> AbstractAsyncContextManager[Any]: ...


#: Every node check, in the order defined: (name, check).
NODE_CHECKS: list[tuple[str, Callable[[NodeWorld], Awaitable[None]]]] = []


def node_check(fn: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    """Register ``fn(store)`` as a check run on one session's node store."""

    async def run(world: NodeWorld) -> None:
        async with world.session() as store:
            await fn(store)

    NODE_CHECKS.append((fn.__name__, run))
    return fn


class Flaky(Exception):
    pass


class Doc:
    """download -> extract -> summarize, counting runs; summarize can be held or made to fail."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.summarizing = anyio.Event()
        self.hold_summarize = False
        self.summarize_failures = 0  # how many of the next attempts fail

    def graph(self, *, summarize_attempts: int = 1) -> Graph:
        doc = Graph("doc", version="1", inputs=[URL])

        @doc.node(requires=[URL], provides=[PAGE])
        async def download(ctx: NodeContext) -> None:
            self.runs.append("download")
            ctx.set(PAGE, f"<{ctx[URL]}>")

        @doc.node(requires=[PAGE], provides=[TEXT])
        async def extract(ctx: NodeContext) -> None:
            self.runs.append("extract")
            ctx.set(TEXT, ctx[PAGE].strip("<>"))

        @doc.node(requires=[TEXT], provides=[SUMMARY], aspects=[Retry(summarize_attempts)])
        async def summarize(ctx: NodeContext) -> None:
            self.runs.append("summarize")
            if self.summarize_failures:
                self.summarize_failures -= 1
                raise Flaky("model down")
            if self.hold_summarize:
                self.summarizing.set()
                await anyio.sleep_forever()
            ctx.set(SUMMARY, ctx[TEXT].upper())

        return doc


async def crash_while(execution: Execution, ready: anyio.Event) -> None:
    """Run ``execution`` until ``ready``, then cancel it as a host (or a dying process) would."""
    with anyio.CancelScope() as host:
        async with execution:
            await ready.wait()
            host.cancel()
            await execution.wait()


async def resumed(graph: Graph, store: Any, scope: str, inputs: dict[Key[Any], Any], **kw: Any) -> Execution:
    execution = Execution(graph, inputs, checkpoint=ExecCheckpoint(scope, store), **kw)
    execution.restore_nodes(await store.node_records(scope))
    return execution


@node_check
async def resume_restores_confirmed_nodes_and_restarts_the_rest_from_entry(
    store: Any,
) -> None:
    doc = Doc()
    doc.hold_summarize = True
    first = Execution(doc.graph(), {URL: "x.org"}, checkpoint=ExecCheckpoint("run-1", store))
    await crash_while(first, doc.summarizing)  # download and extract are confirmed, summarize is not
    assert doc.runs == ["download", "extract", "summarize"]
    assert [r.node for r in await store.node_records("run-1")] == ["download", "extract"]

    doc.runs.clear()
    doc.hold_summarize = False
    events: list[ExecutionEvent] = []
    second = await resumed(doc.graph(), store, "run-1", {URL: "x.org"}, on_event=events.append)
    async with second:
        result = await second.wait()
    assert result[SUMMARY] == "X.ORG"
    assert doc.runs == ["summarize"]  # from its function's entry
    for restored in ("download", "extract"):  # Finished once, nothing else invented
        assert [e for e in events if getattr(e, "node", None) == restored] == [
            Finished((), restored, "completed")
        ]
    assert Waiting((), "summarize") in events and Running((), "summarize") in events


@node_check
async def outputs_are_published_only_after_the_node_record_is_confirmed(store: Any) -> None:
    order: list[str] = []

    class Recording(PassThroughNodeHooks):
        async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
            await super().commit_nodes(commits)
            order.extend(f"confirmed {commit.checkpoint.node}" for commit in commits)

    g = Graph("g", inputs=[URL])

    @g.node(requires=[URL], provides=[PAGE, TEXT])
    async def produce(ctx: NodeContext) -> None:
        ctx.set(PAGE, "p")
        await anyio.sleep(0.01)  # a reader of page would run here in ordinary mode
        ctx.set(TEXT, "t")

    @g.node(requires=[PAGE], provides=[SUMMARY])
    async def read(ctx: NodeContext) -> None:
        order.append("read page")
        ctx.set(SUMMARY, ctx[PAGE])

    store = Recording(store)
    async with Execution(g, {URL: "u"}, checkpoint=ExecCheckpoint("r", store)) as execution:
        await execution.wait()
    assert order == ["confirmed produce", "read page", "confirmed read"]


@node_check
async def an_outer_aspect_failing_after_an_inner_retry_publishes_and_commits_nothing(
    store: Any,
) -> None:
    async def refuse(ctx: NodeContext, proceed: Proceed) -> None:
        await proceed()
        raise Flaky("the outer aspect refuses the result")

    g = Graph("g", inputs=[URL])
    attempts = 0

    @g.node(requires=[URL], provides=[PAGE], aspects=[refuse, Retry(3)])
    async def flaky(ctx: NodeContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 2:
            raise Flaky("first attempt")
        ctx.set(PAGE, "page")

    g.add_node("downstream", _fail_if_run, requires=[PAGE], provides=[TEXT])
    execution = Execution(g, {URL: "u"}, checkpoint=ExecCheckpoint("r", store))
    async with execution:
        with raises(Flaky, match="refuses"):
            await execution.wait()
    assert attempts == 2
    assert await store.node_records("r") == ()  # nothing committed as success
    assert PAGE not in execution.result().values  # never published
    assert await store.scope_failed("r")  # the complete chain's failure was confirmed, and is final


async def _fail_if_run(ctx: NodeContext) -> None:
    raise AssertionError("ran downstream of an unconfirmed output")


@node_check
async def budgets_are_never_refilled_across_restarts(store: Any) -> None:
    doc = Doc()
    graph = doc.graph(summarize_attempts=3)
    # two failures confirmed, then a crash inside the third attempt
    doc.summarize_failures = 2
    doc.hold_summarize = True
    await crash_while(Execution(graph, {URL: "x"}, checkpoint=ExecCheckpoint("run", store)), doc.summarizing)
    assert doc.runs.count("summarize") == 3

    # resumed: the crashed third attempt is reclaimed, not a fourth; it fails, and the budget is spent
    doc.runs.clear()
    doc.hold_summarize = False
    doc.summarize_failures = 5
    second = await resumed(graph, store, "run", {URL: "x"})
    async with second:
        with raises(Flaky):
            await second.wait()
    assert doc.runs == ["summarize"]

    # after that final failure, nothing runs again under this run's scope
    doc.runs.clear()
    doc.summarize_failures = 0
    third = await resumed(graph, store, "run", {URL: "x"})
    async with third:
        with raises(ConfirmedFailureError, match="failed for good"):
            await third.wait()
    assert doc.runs == []


@node_check
async def a_host_cancellation_leaves_the_attempt_active_and_consumes_no_budget(store: Any) -> None:
    doc = Doc()
    doc.hold_summarize = True
    graph = doc.graph(summarize_attempts=2)
    await crash_while(Execution(graph, {URL: "x"}, checkpoint=ExecCheckpoint("run", store)), doc.summarizing)
    doc.hold_summarize = False
    doc.summarize_failures = 1  # one failure, then success: both attempts are still there
    doc.runs.clear()
    execution = await resumed(graph, store, "run", {URL: "x"})
    async with execution:
        assert (await execution.wait())[SUMMARY] == "X"
    assert doc.runs == ["summarize", "summarize"]


def pipeline(doc: Doc, *, mount_attempts: int = 1) -> Graph:
    p = Graph("pipeline", version="1", inputs=[FIRST_URL])
    p.sub(
        "first",
        doc.graph(),
        inlets={URL: FIRST_URL},
        outlets={SUMMARY: FIRST_SUMMARY},
        aspects=[Retry(mount_attempts)],
    )
    return p


@node_check
async def a_sub_whose_children_were_all_confirmed_reruns_only_its_wrapping(store: Any) -> None:
    doc = Doc()
    wrapping_runs = 0
    children_done = anyio.Event()

    async def wrap(ctx: NodeContext, proceed: Proceed) -> None:
        nonlocal wrapping_runs
        wrapping_runs += 1
        await proceed()
        if wrapping_runs == 1:  # the children are confirmed; the mount is not
            children_done.set()
            await anyio.sleep_forever()

    graph = Graph("pipeline", version="1", inputs=[FIRST_URL])
    graph.sub("first", doc.graph(), inlets={URL: FIRST_URL}, outlets={SUMMARY: FIRST_SUMMARY}, aspects=[wrap])
    await crash_while(
        Execution(graph, {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("run", store)), children_done
    )
    assert await store.node_records("run") == () and doc.runs == ["download", "extract", "summarize"]
    doc.runs.clear()
    second = await resumed(graph, store, "run", {FIRST_URL: "x"})
    async with second:
        assert (await second.wait())[FIRST_SUMMARY] == "X"
    assert doc.runs == [] and wrapping_runs == 2  # the mount's wrapping ran again, its children did not
    assert [r.node for r in await store.node_records("run")] == ["first"]


@node_check
async def a_failed_parent_attempt_invalidates_its_childrens_results(store: Any) -> None:
    doc = Doc()
    doc.summarize_failures = 1  # the child's summarize fails once: the mount's first attempt fails
    execution = Execution(
        pipeline(doc, mount_attempts=2), {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("run", store)
    )
    async with execution:
        assert (await execution.wait())[FIRST_SUMMARY] == "X"
    # the second attempt of the mount ran download and extract again: it could not borrow them
    assert doc.runs == ["download", "extract", "summarize", "download", "extract", "summarize"]


def record(node: str, *outputs: CheckpointOutput, reason: Any = "completed") -> NodeCheckpoint:
    return NodeCheckpoint(node, reason, outputs)


def ready(key: Key[Any], value: Any) -> CheckpointOutput:
    return CheckpointOutput(key.name, "ready", msgspec.msgpack.encode(value))


@node_check
async def a_plan_is_checked_whole_and_a_bad_one_keeps_the_previous_plan(store: Any) -> None:
    doc = Doc()
    execution = Execution(doc.graph(), {URL: "x"}, checkpoint=ExecCheckpoint("run", store))
    good = [record("download", ready(PAGE, "<x>"))]
    execution.restore_nodes(good)
    bad_plans = {
        "has outputs \\[\\], but provides \\['page'\\]": [record("download")],
        "concluded 'pending'": [record("download", ready(PAGE, "<x>"), reason="pending")],
        "does not read back as str": [record("download", ready(PAGE, 7))],
        "node 'download', which produces its input": [record("extract", ready(TEXT, "x"))],
        "is 'ready'; a confirmed output is ready with a value": [
            record("download", ready(PAGE, "<x>")),
            record("extract", CheckpointOutput("text", "ready")),  # the last record is the bad one
        ],
        "has no node 'nope'": [record("nope")],
    }
    for match, plan in bad_plans.items():
        with raises(RestorePlanError, match=match):
            execution.restore_nodes(plan)
    async with execution:  # the good plan stayed: download is restored, not run
        assert (await execution.wait())[SUMMARY] == "X"
    assert doc.runs == ["extract", "summarize"]


@node_check
async def skipped_and_zero_output_nodes_save_complete_records(store: Any) -> None:
    g = Graph("g", inputs=[URL])
    g.add_node("skips", _return, requires=[URL], provides=[PAGE])
    g.add_node("nothing_out", _return, requires=[URL])
    g.add_node("after_skip", _fail_if_run, requires=[PAGE], provides=[TEXT])
    async with Execution(g, {URL: "u"}, checkpoint=ExecCheckpoint("r", store)) as execution:
        await execution.wait()
    assert sorted(await store.node_records("r"), key=lambda r: r.node) == [
        record("after_skip", CheckpointOutput("text", "skipped"), reason="skipped"),
        record("nothing_out"),
        record("skips", CheckpointOutput("page", "skipped")),
    ]


async def _return(ctx: NodeContext) -> None:
    pass


@node_check
async def a_batch_of_node_commits_is_all_or_nothing(store: Any) -> None:
    a = await store.open_attempt(CheckpointAttemptRequest("run", "a", COMPLETE_CHAIN, 1))
    b = await store.open_attempt(CheckpointAttemptRequest("run", "b", COMPLETE_CHAIN, 1))
    first = CheckpointCommit("run", a.scope, record("a"))
    with raises(CheckpointError, match="is not the complete-chain attempt of node 'c'"):
        wrong = CheckpointCommit("run", b.scope, record("c"))  # b's attempt, c's record
        await store.commit_nodes([first, wrong])
    assert await store.node_records("run") == ()  # the commit of a that fitted was not kept either
    await store.commit_nodes([first, CheckpointCommit("run", b.scope, record("b"))])
    assert sorted(r.node for r in await store.node_records("run")) == ["a", "b"]
    await store.commit_nodes([])  # nothing to confirm: no change
    assert len(await store.node_records("run")) == 2


@node_check
async def nodes_that_conclude_together_share_a_commit(store: Any) -> None:
    batches: list[list[str]] = []

    class Recording(PassThroughNodeHooks):
        async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
            batches.append([commit.checkpoint.node for commit in commits])
            await super().commit_nodes(commits)

    keys = [Key(f"k{i}", int) for i in range(8)]
    g = Graph("g", inputs=[N])
    for i, key in enumerate(keys):
        g.add_node(f"n{i}", _setter(key), requires=[N], provides=[key])
    g.add_node("last", _sum(keys), requires=keys, provides=[TOTAL])
    async with Execution(g, {N: 1}, checkpoint=ExecCheckpoint("r", Recording(store))) as execution:
        assert (await execution.wait())[TOTAL] == 8
    committed = sorted(node for batch in batches for node in batch)
    assert committed == sorted([*(f"n{i}" for i in range(8)), "last"])
    assert len(batches) < 9  # the eight concluded together: fewer calls than nodes
    assert batches[-1] == ["last"]  # it read what the others published, so after their records


def _setter(key: Key[int]) -> Callable[[NodeContext], Awaitable[None]]:
    async def node(ctx: NodeContext) -> None:
        ctx.set(key, ctx[N])

    return node


def _sum(keys: list[Key[int]]) -> Callable[[NodeContext], Awaitable[None]]:
    async def node(ctx: NodeContext) -> None:
        ctx.set(TOTAL, sum(ctx[key] for key in keys))

    return node


@node_check
async def a_refused_commit_latches_a_checkpoint_error_that_no_retry_swallows(store: Any) -> None:
    g = Graph("g", inputs=[URL])
    runs = 0

    async def outer(ctx: NodeContext, proceed: Proceed) -> None:
        nonlocal runs
        runs += 1
        await proceed()

    g.add_node("download", _download, requires=[URL], provides=[PAGE], aspects=[Retry(3), outer])
    g.add_node("extract", _fail_if_run, requires=[PAGE], provides=[TEXT])
    store = FaultyNodeHooks(store, fail={"commit_nodes": 1})
    execution = Execution(g, {URL: "u"}, checkpoint=ExecCheckpoint("r", store))
    async with execution:
        refused = "commit_nodes failed: InjectedFault: .*call 1 \\(not confirmed\\)"
        with raises(CheckpointError, match=refused):
            await execution.wait()
    assert runs == 1 and await store.node_records("r") == ()
    assert PAGE not in execution.result().values  # nothing published


async def _download(ctx: NodeContext) -> None:
    ctx.set(PAGE, "<" + ctx[URL] + ">")


@node_check
async def a_commit_whose_answer_was_lost_is_found_on_resume(store: Any) -> None:
    g = Graph("g", inputs=[URL])
    g.add_node("download", _download, requires=[URL], provides=[PAGE])
    faulty = FaultyNodeHooks(store, fail={"commit_nodes": 1}, after=True)
    execution = Execution(g, {URL: "u"}, checkpoint=ExecCheckpoint("r", faulty))
    async with execution:
        with raises(CheckpointError, match="answer lost"):
            await execution.wait()
    assert [r.node for r in await store.node_records("r")] == ["download"]  # it was confirmed after all
    again = await resumed(g, store, "r", {URL: "u"})
    async with again:
        assert (await again.wait())[PAGE] == "<u>"


@node_check
async def a_confirmed_scope_failure_from_open_child_is_a_business_failure_of_the_mount(store: Any) -> None:
    wrong_scope = False

    class FailedChild(PassThroughNodeHooks):
        async def open_child(self, child: CheckpointChild) -> CheckpointChildOpened:
            raise CheckpointScopeFailure("another scope" if wrong_scope else child.parent)

    doc = Doc()
    caught: list[type[BaseException]] = []

    async def note(ctx: NodeContext, proceed: Proceed) -> None:
        try:
            await proceed()
        except Exception as exc:
            caught.append(type(exc))
            raise

    p = Graph("pipeline", inputs=[FIRST_URL])
    p.sub("first", doc.graph(), inlets={URL: FIRST_URL}, outlets={SUMMARY: FIRST_SUMMARY}, aspects=[note])
    execution = Execution(p, {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("run", FailedChild(store)))
    async with execution:
        with raises(ConfirmedFailureError, match="its child failed for good"):
            await execution.wait()
    assert caught == [ConfirmedFailureError] and doc.runs == []  # a parent aspect saw it, no child ran
    wrong_scope = True  # a new run: the mount of the first one failed for good
    execution = Execution(p, {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("run-2", FailedChild(store)))
    async with execution:
        with raises(CheckpointError, match="unexpected scope failure signal"):
            await execution.wait()


@node_check
async def open_child_of_a_child_failed_for_good_signals_the_attempt_that_asked(store: Any) -> None:
    mount = await store.open_attempt(CheckpointAttemptRequest("run", "m", COMPLETE_CHAIN, 1))
    child = CheckpointChild(mount.scope, "m", "child", "1", "f", "x", ())
    opened = await store.open_child(child)
    node = await store.open_attempt(CheckpointAttemptRequest(opened.scope, "n", COMPLETE_CHAIN, 1))
    assert (await store.fail_attempt(node.scope)).exhausted  # the child's final failure, confirmed
    with raises(CheckpointScopeFailure) as caught:  # the mount's attempt is still active: it asks again
        await store.open_child(child)
    assert type(caught.value) is CheckpointScopeFailure and caught.value.scope == mount.scope


@node_check
async def a_child_scope_opened_under_its_legacy_fingerprint_is_the_same_child(store: Any) -> None:
    mount = await store.open_attempt(CheckpointAttemptRequest("run", "m", COMPLETE_CHAIN, 1))
    older = CheckpointChild(mount.scope, "m", "child", "1", "by-module", "x", ())  # fingerprint by module
    opened = await store.open_child(older)
    node = await store.open_attempt(CheckpointAttemptRequest(opened.scope, "n", COMPLETE_CHAIN, 1))
    await store.commit_nodes(
        [CheckpointCommit(opened.scope, node.scope, NodeCheckpoint("n", "completed", ()))]
    )
    now = CheckpointChild(mount.scope, "m", "child", "1", "by-shape", "x", (), legacy_fingerprint="by-module")
    again = await store.open_child(now)
    assert again.scope == opened.scope and [n.node for n in again.nodes] == ["n"]
    other = msgspec.structs.replace(now, legacy_fingerprint="another", fixed="y")
    with raises(CheckpointError, match="another child \\(fingerprint differs, fixed differs\\)"):
        await store.open_child(other)
    first = msgspec.structs.replace(
        now, mount="first"
    )  # a new scope keeps its identity without the legacy one
    assert (await store.open_child(first)).nodes == ()
    assert (await store.open_child(msgspec.structs.replace(first, legacy_fingerprint=None))).nodes == ()


@node_check
async def a_child_reopened_with_other_fixed_values_is_refused_as_incompatible_history(store: Any) -> None:
    lang = Key("lang", str)
    doc = Doc()
    child = Graph("child", version="1", inputs=[URL, lang])
    child.add_node("wait", _sleep_then_set, requires=[URL, lang], provides=[PAGE])

    def mounted(fixed: str) -> Graph:
        parent = Graph("parent", version="1", inputs=[FIRST_URL])
        parent.sub(
            "first", child, inlets={URL: FIRST_URL}, outlets={PAGE: Key("out", str)}, fixed={lang: fixed}
        )
        return parent

    entered = anyio.Event()
    _ENTERED.append(entered)
    await crash_while(
        Execution(mounted("en"), {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("run", store)), entered
    )
    _ENTERED.clear()
    # the same topology (fixed values are not in it), other fixed values: the child's history does not fit
    again = await resumed(mounted("de"), store, "run", {FIRST_URL: "x"})
    async with again:
        with raises(CheckpointError, match="holds results of another child \\(fixed differs\\)"):
            await again.wait()
    assert doc.runs == []


_ENTERED: list[anyio.Event] = []


async def _sleep_then_set(ctx: NodeContext) -> None:
    if _ENTERED:
        _ENTERED[0].set()
        await anyio.sleep_forever()
    ctx.set(PAGE, ctx[URL])


@node_check
async def a_retried_attempt_drops_what_the_failed_one_staged(store: Any) -> None:
    g = Graph("g", inputs=[URL])
    attempts: list[int] = []

    @g.node(requires=[URL], provides=[PAGE, TEXT], aspects=[Retry(2)])
    async def twice(ctx: NodeContext) -> None:
        attempts.append(len(attempts))
        ctx.set(PAGE, f"attempt {len(attempts)}")  # staged again by the retry: the first one's is gone
        if len(attempts) == 1:
            ctx.set(TEXT, "from the failed attempt")
            raise Flaky("first")

    execution = Execution(g, {URL: "u"}, checkpoint=ExecCheckpoint("r", store))
    async with execution:
        result = await execution.wait()
    assert attempts == [0, 1]
    assert result[PAGE] == "attempt 2" and result.get(TEXT) is NoValue  # nothing of the failed attempt
    [record] = await store.node_records("r")
    assert record.outputs == (
        CheckpointOutput("page", "ready", msgspec.msgpack.encode("attempt 2")),
        CheckpointOutput("text", "skipped"),
    )


@node_check
async def a_subs_outlets_are_published_when_the_mount_commits(store: Any) -> None:
    order: list[str] = []
    child = Graph("child", inputs=[URL])

    @child.node(requires=[URL], provides=[PAGE])
    async def early(ctx: NodeContext) -> None:
        ctx.set(PAGE, ctx[URL])
        order.append("child set page")

    @child.node(requires=[PAGE], provides=[TEXT])
    async def late(ctx: NodeContext) -> None:
        await anyio.sleep(0.01)  # a parent reader of page would run here if the outlet were published
        order.append("child done")
        ctx.set(TEXT, ctx[PAGE])

    parent = Graph("parent", inputs=[FIRST_URL])
    out = Key("out", str)
    parent.sub("mount", child, inlets={URL: FIRST_URL}, outlets={PAGE: out})

    @parent.node(requires=[out], provides=[SUMMARY])
    async def reader(ctx: NodeContext) -> None:
        order.append("parent read out")
        ctx.set(SUMMARY, ctx[out])

    execution = Execution(parent, {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("r", store))
    async with execution:
        assert (await execution.wait())[SUMMARY] == "x"
    assert order == ["child set page", "child done", "parent read out"]
    assert {r.node for r in await store.node_records("r")} == {"mount", "reader"}


def _faulted_hook_check(
    hook: str, after: bool, error: Callable[[str], BaseException] = InjectedFault
) -> Callable[[NodeWorld], Awaitable[None]]:
    """A ledger call fails (refused, made and its answer lost, or raising a cancellation nothing asked
    for): the run stops with CheckpointError, and a resume on the store finishes it with the right
    answer, running no confirmed node again."""

    async def run(world: NodeWorld) -> None:
        async with world.session() as store:
            doc = Doc()
            doc.summarize_failures = 1  # a failure to confirm, so fail_attempt is called too
            graph = pipeline(doc, mount_attempts=2)
            faulty = FaultyNodeHooks(store, fail={hook: 1}, after=after, error=error)
            execution = Execution(graph, {FIRST_URL: "x"}, checkpoint=ExecCheckpoint("run", faulty))
            raised = type(error("")).__qualname__
            async with execution:
                with raises(CheckpointError, match=f"{hook} failed: {raised}"):
                    await execution.wait()
            assert FIRST_SUMMARY not in execution.result().values  # nothing published past the fault
            confirmed = {r.node for r in await store.node_records("run")}
            runs_before = list(doc.runs)
            again = await resumed(graph, store, "run", {FIRST_URL: "x"})
            async with again:
                assert (await again.wait())[FIRST_SUMMARY] == "X"
            assert "first" not in confirmed or doc.runs == runs_before  # a confirmed mount runs nothing

    return run


for _hook in ("open_attempt", "fail_attempt", "open_child", "commit_nodes"):
    for _after in (False, True):
        NODE_CHECKS.append(
            (
                f"{_hook}_{'answer_lost' if _after else 'refused'}_stops_the_run_and_resume_finishes_it",
                _faulted_hook_check(_hook, _after),
            )
        )
    NODE_CHECKS.append(
        (
            f"{_hook}_raising_a_cancellation_stops_the_run_and_resume_finishes_it",
            _faulted_hook_check(_hook, False, stray_cancellation),
        )
    )
