"""Node-hook conformance: every store call sees the context variables of the nodes whose work it carries.

The engine confirms work in batches from whichever task leads the
confirmations: a node task confirming other nodes' records, a writer's or a
handler's committer. A store that reads a context variable (a tenant set by
node code) must still see, in each call, the values of the node whose work
that call confirms:

- ``commit_nodes`` carries only records of nodes whose context variables are
  equal, and runs in them (nodes of other values leave in calls of their own);
- ``append`` runs in the writer's variables as they were at the batch's first
  send;
- a handler's ``commit`` runs in the variables of the ``handle_messages``
  caller as they were when the batch's first message was staged.

Each check holds the first store call of a batch until more work was staged
in other values, so the next call is made from a task with the first call's
values. Registered in :data:`~streams._conformance.nodes.NODE_CHECKS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import anyio

from .._checkpoint import ExecCheckpoint
from .._context import NodeContext
from .._execution import Execution
from .._graph import Graph
from .._handle import MessageTx
from .._keys import Key, Stream
from .._store._hooks import StreamHooks
from .._store._node_records import CheckpointCommit
from .._store._records import AppendBatch, MessageCommit
from .._testing import PassThroughHooks, PassThroughNodeHooks
from .nodes import node_check

__all__: list[str] = []

#: What node code sets and a store reads: the tenant the work belongs to.
TENANT: ContextVar[str] = ContextVar("streamledger_conformance_tenant", default="none")

N = Key("n", int)
ORDERS = Key("orders", Stream[int])
COUNT = Key("count", int)


@node_check
async def node_records_are_confirmed_in_their_own_nodes_context_variables(store: Any) -> None:
    tenants = {f"{tenant}{i}": tenant for tenant in ("a", "b", "c") for i in (1, 2)}
    concluded = anyio.Event()
    calls: list[tuple[str, list[str]]] = []  # each commit_nodes call: the tenant it saw, its nodes

    class Recording(PassThroughNodeHooks):
        async def commit_nodes(self, commits: Sequence[CheckpointCommit]) -> None:
            calls.append((TENANT.get(), [commit.checkpoint.node for commit in commits]))
            if len(calls) == 1:  # the others conclude while the first record is in the store
                await concluded.wait()
            await super().commit_nodes(commits)

    bodies_done = 0

    def tenant_node(tenant: str) -> Any:
        async def node(ctx: NodeContext) -> None:
            nonlocal bodies_done
            TENANT.set(tenant)
            bodies_done += 1
            if bodies_done == len(tenants):
                concluded.set()  # the last one stages its record before anything else runs

        return node

    g = Graph("tenants", inputs=[N])
    for name, tenant in tenants.items():
        g.add_node(name, tenant_node(tenant), requires=[N], provides=[])
    async with Execution(g, {N: 1}, checkpoint=ExecCheckpoint("r", Recording(store))) as execution:
        await execution.wait()
    assert sorted(node for _, nodes in calls for node in nodes) == sorted(tenants)
    for seen, nodes in calls:
        assert {tenants[node] for node in nodes} == {seen}, calls  # only its own nodes' tenant, and it
    later = [seen for seen, _ in calls[1:]]
    assert len(later) == len(set(later)), calls  # nodes of one tenant that waited together left together


def _shop(write: Any, handle: Any) -> Graph:
    g = Graph("shop", inputs=[N])
    g.add_node("orders", write, requires=[N], provides=[ORDERS])

    @g.node(requires=[ORDERS], provides=[COUNT])
    async def audit(ctx: NodeContext) -> None:
        await ctx.handle_messages(ORDERS, handle, initial_state=0)

    return g


async def _count(tx: MessageTx[int], order: int) -> None:
    tx.set_state(tx.state + 1)
    tx.set(COUNT, tx.state)


class _Streams(PassThroughNodeHooks):
    """The node store, its stream hooks replaced by ``streams``."""

    def __init__(self, inner: Any, streams: StreamHooks) -> None:
        super().__init__(inner)
        self._streams = streams

    @property
    def streams(self) -> StreamHooks:
        return self._streams


@node_check
async def appends_are_confirmed_in_the_writers_context_variables_at_each_batchs_first_send(
    store: Any,
) -> None:
    in_store, release = anyio.Event(), anyio.Event()
    appends: list[tuple[str, int, int]] = []  # the tenant each append saw, its first sequence, its size

    class Recording(PassThroughHooks):
        async def append(self, batch: AppendBatch) -> None:
            appends.append((TENANT.get(), batch.first_seq, len(batch.payloads)))
            if len(appends) == 1:
                in_store.set()
                await release.wait()
            await super().append(batch)

    async def write(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        TENANT.set("w1")
        await writer.send(1)
        await in_store.wait()  # the committer holds the first batch; what follows is the next one
        TENANT.set("w2")
        await writer.send(2)
        TENANT.set("w3")
        await writer.send(3)
        release.set()

    hooks = _Streams(store, Recording(store.streams))
    async with Execution(_shop(write, _count), {N: 3}, checkpoint=ExecCheckpoint("r", hooks)) as execution:
        assert (await execution.wait())[COUNT] == 3
    assert appends == [("w1", 1, 1), ("w2", 2, 2)], appends  # not the committer's: each batch's first send's


@node_check
async def message_commits_are_confirmed_in_the_handlers_context_variables_at_each_batchs_first_message(
    store: Any,
) -> None:
    first_handled, staged = anyio.Event(), anyio.Event()
    commits: list[tuple[str, int]] = []  # the tenant each commit saw, its first sequence

    class Recording(PassThroughHooks):
        async def commit(self, batch: Sequence[MessageCommit]) -> None:
            commits.append((TENANT.get(), batch[0].message.seq))
            if len(commits) == 1:  # messages 2 and 3 are staged while the first commit is in the store
                await staged.wait()
            await super().commit(batch)

    async def write(ctx: NodeContext) -> None:
        writer = ctx.writer(ORDERS)
        await writer.send(1)
        await first_handled.wait()
        await writer.send(2)
        await writer.send(3)

    async def handle(tx: MessageTx[int], order: int) -> None:
        TENANT.set(f"m{order}")  # in the handle_messages caller's task: the node's own context
        await _count(tx, order)
        if order == 1:
            first_handled.set()
        if order == 3:
            staged.set()  # it is staged as this returns, before anything else runs

    hooks = _Streams(store, Recording(store.streams))
    async with Execution(_shop(write, handle), {N: 3}, checkpoint=ExecCheckpoint("r", hooks)) as execution:
        assert (await execution.wait())[COUNT] == 3
    assert commits == [("m1", 1), ("m2", 2)], commits  # not the committer's: each batch's first message's
