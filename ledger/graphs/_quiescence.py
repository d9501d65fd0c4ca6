"""When a pydantic-graph run is at a quiescent step boundary, and the versions this was verified on.

``Graph.iter`` yields once per finished task: the new tasks that task
produced (a step's successors, a decision's branch, a fork's copies or
items, a join's continuation). The public API says nothing of what else is in
flight at that moment: other branches of a fork, a join's partial results, a
map still reading a stream. A checkpoint is only sound when nothing else is
in flight, so this module reads two fields of the run's private iterator:

* ``GraphRun._iterator_instance.active_tasks``: the tasks started and not yet
  finished. At a yield it holds the finished task whose result this is (it is
  removed after the yield) and every task still running.
* ``GraphRun._iterator_instance.active_reducers``: the joins holding partial
  results.

A yield is a quiescent step boundary when the only active task is the step
that just finished, no join holds partial results, exactly one task comes
next, and that task is not inside a fork (see :class:`ForkRegions`). Those
two fields are the whole private surface; :data:`VERIFIED_VERSIONS` pins the
pydantic-graph releases they were read and tested on, and a durable graph
refuses to register on any other (``tests/ledger/graphs/test_quiescence.py``
checks the pin against the installed release).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Final

import msgspec
from pydantic_graph import Graph, GraphBuilder, GraphRun, GraphTask, GraphTaskRequest, Join, Step, StepContext
from pydantic_graph.node import StartNode

from ._errors import UnsupportedPydanticGraphError

__all__ = [
    "VERIFIED_VERSIONS",
    "Boundary",
    "ForkRegions",
    "check_pydantic_graph_version",
    "installed_pydantic_graph_version",
    "is_stream_step",
    "quiescent_boundary",
]

#: pydantic-graph releases whose private run fields (see the module docstring) were verified:
#: 2.51.0 to 2.66.0, and 2.68.0 (there is no 2.67). CI runs the graph tests on the lowest and the
#: highest; the extra ``pydantic-graph`` asks for the same range.
VERIFIED_VERSIONS: Final = frozenset({*(f"2.{minor}.0" for minor in range(51, 67)), "2.68.0"})


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def installed_pydantic_graph_version() -> str:
    return importlib.metadata.version("pydantic-graph")


def check_pydantic_graph_version(version: str) -> None:
    """Refuse a pydantic-graph release whose run internals were not verified."""
    if version not in VERIFIED_VERSIONS:
        verified = sorted(VERIFIED_VERSIONS, key=_release)
        raise UnsupportedPydanticGraphError(
            f"pydantic-graph {version} is installed, but durable graph runs were verified only on "
            f"{verified[0]} to {verified[-1]} ({', '.join(verified)}); install one of those "
            f"(pip install 'pydantic-graph=={verified[-1]}') or a streamledger release that lists yours"
        )


async def _probe_stream(ctx: StepContext) -> AsyncIterator[None]:
    yield None


#: ``GraphBuilder.stream`` wraps every stream function in the same closure; its code object
#: tells a stream step from a plain one without reading private fields.
_STREAM_WRAPPER_CODE: Final = getattr(GraphBuilder().stream(_probe_stream).call, "__code__", None)


def is_stream_step(node: object) -> bool:
    """Whether ``node`` is a step made by ``GraphBuilder.stream``."""
    return isinstance(node, Step) and getattr(node.call, "__code__", None) is _STREAM_WRAPPER_CODE


class ForkRegions(msgspec.Struct, frozen=True):
    """The parts of a graph that lie between a fork and its join.

    pydantic-graph treats the start node as a fork with one thread, and by
    default picks the farthest dominating fork as a join's parent, which is
    often the start node. Only real forks (``Fork`` nodes) make regions here:
    a task is inside a fork when a fork in its fork stack is the parent of a
    join whose region (``graph.parent_forks[join].intermediate_nodes``) holds
    the task's node, or when a fork in its stack is the parent of no join at
    all (its copies never meet again), or when the task's node is a join.
    """

    joins: frozenset[str]
    regions: Mapping[str, frozenset[str]]  # parent fork id -> nodes of the regions of its joins

    @classmethod
    def of(cls, graph: Graph) -> ForkRegions:
        regions: dict[str, set[str]] = {}
        for join_id, parent in graph.parent_forks.items():
            if parent.fork_id == StartNode.id:
                continue
            regions.setdefault(parent.fork_id, set()).update(parent.intermediate_nodes, {join_id})
        joins = frozenset(node_id for node_id, node in graph.nodes.items() if isinstance(node, Join))
        return cls(joins, {fork: frozenset(nodes) for fork, nodes in regions.items()})

    def inside_fork(self, task: GraphTaskRequest) -> bool:
        if task.node_id in self.joins:
            return True
        for frame in task.fork_stack:
            if frame.fork_id == StartNode.id:
                continue
            region = self.regions.get(frame.fork_id)
            if region is None or task.node_id in region:
                return True
        return False


class Boundary(msgspec.Struct, frozen=True):
    """A quiescent step boundary: the step that finished and the one task that comes next."""

    step_id: str
    task: GraphTaskRequest


def quiescent_boundary(run: GraphRun, event: Sequence[GraphTask], regions: ForkRegions) -> Boundary | None:
    """The boundary this yield is, if it is a quiescent step boundary, else None."""
    if len(event) != 1:
        return None
    iterator = run._iterator_instance  # private: see the module docstring
    if iterator is None or iterator.active_reducers or len(iterator.active_tasks) != 1:
        return None
    (finished,) = iterator.active_tasks.values()
    if not isinstance(run.graph.nodes.get(finished.node_id), Step):
        return None  # the start node, a decision or a fork: not a step boundary
    (task,) = event
    if regions.inside_fork(task):
        return None
    return Boundary(finished.node_id, task)
