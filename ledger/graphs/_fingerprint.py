"""A fingerprint of a graph's nodes, so a checkpoint of another graph is not resumed.

A checkpoint names its next node by id. Ids the builder invents (``decision``,
``map``, ``broadcast``, a reducer's name, each numbered by insertion order) can
move to other nodes when the graph is built in another order, so a node's
fingerprint holds what the node is, not only its id: a step's function, a
``BaseNode`` class, a decision's branches, a fork's kind and outgoing paths, a
join's reducer and parent fork. Edges out of steps are not part of it: a
pending task does not depend on them. A changed edge into a decision can
still leave it untyped, which a resumed run finds on its own.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic_graph import Decision, Fork, Graph, Join, Step
from pydantic_graph.id_types import NodeID
from pydantic_graph.node import EndNode, StartNode
from pydantic_graph.paths import DestinationMarker, LabelMarker, Path, TransformMarker
from pydantic_graph.step import NodeStep

from ._quiescence import is_stream_step

__all__ = ["graph_fingerprint"]


def graph_fingerprint(graph: Graph) -> str:
    """A stable hex digest of what every node of ``graph`` is."""
    lines = [f"{node_id}={_describe(graph, node_id, node)}" for node_id, node in sorted(graph.nodes.items())]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _describe(graph: Graph, node_id: NodeID, node: Any) -> str:
    if isinstance(node, StartNode):
        return "start"
    if isinstance(node, EndNode):
        return "end"
    if isinstance(node, NodeStep):
        return f"node {_name(node.node_type)}"
    if isinstance(node, Step):
        return "stream" if is_stream_step(node) else f"step {_name(node.call)}"
    if isinstance(node, Decision):
        branches = []
        for branch in node.branches:
            matches = _name(branch.matches) if branch.matches else "-"
            branches.append(f"{_type(branch.source)} if {matches} -> {_path(branch.path)}")
        return f"decision [{'; '.join(branches)}]"
    if isinstance(node, Fork):
        # sorted: pydantic-graph 2.62 stores a broadcast's paths in the order added, 2.61 reversed
        paths = sorted(_path(path) for path in graph.edges_by_source.get(node_id, []))
        kind = "map" if node.is_map else "broadcast"
        return f"{kind} join={node.downstream_join_id} [{'; '.join(paths)}]"
    if isinstance(node, Join):
        parent = graph.parent_forks.get(node_id)
        return f"join {_name(node.reducer)} parent={parent.fork_id if parent else '-'}"
    return type(node).__qualname__


def _path(path: Path) -> str:
    parts = []
    for item in path.items:
        if isinstance(item, DestinationMarker):
            parts.append(f">{item.destination_id}")
        elif isinstance(item, TransformMarker):
            parts.append(f"~{_name(item.transform)}")
        elif not isinstance(item, LabelMarker):
            parts.append(type(item).__name__)
    return " ".join(parts)


def _name(obj: Any) -> str:
    # The qualified name without the module: a script run as __main__ and imported by name is one graph.
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def _type(tp: Any) -> str:
    return tp.__qualname__ if isinstance(tp, type) else repr(tp)
