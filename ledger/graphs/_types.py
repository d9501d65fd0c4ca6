"""The types a checkpoint is written down and read back through.

A checkpoint holds the graph state, the graph's inputs and the next task's
inputs. Each is written through a pydantic ``TypeAdapter`` of its type:

* the state, inputs and output types are the graph's own; a state type
  pydantic has no schema for is refused at registration
  (:class:`GraphStateTypeError`), as are unusable input and output types;
* a step's input type is ``I`` in its ``StepContext[State, Deps, I]``
  annotation (``Annotated`` metadata dropped), the end node's is the graph's
  output type;
* a decision's or a fork's input type is inferred from the edges into it: when
  every such edge has no transform and comes from a step with a return
  annotation, from the start node (the graph's input type) or from a decision
  whose type is known, and all carry the same type, that is its type.
  Inference repeats until it learns nothing more;
* ``input_types={node_id: type}`` overrides all of the above, and decisions
  after an explicitly typed one infer from the explicit type.

What stays unknown (a transform on an edge, an edge from a join, a fork, a
``BaseNode`` or a stream step, a return annotation that is missing, ``Any`` or
a type variable, edges that disagree, an annotation or inferred type pydantic
has no schema for) leaves the node untyped, and no checkpoint is saved before it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, get_args, get_origin, get_type_hints

from pydantic import PydanticUserError, TypeAdapter
from pydantic_graph import Decision, Fork, Graph, Step, StepContext
from pydantic_graph.id_types import NodeID
from pydantic_graph.node import EndNode, StartNode
from pydantic_graph.paths import DestinationMarker, Path, TransformMarker
from pydantic_graph.step import NodeStep

from ._errors import GraphInputTypeError, GraphStateTypeError
from ._quiescence import is_stream_step

__all__ = ["GraphTypes", "graph_types"]

_UNKNOWN: Any = object()


@dataclass(frozen=True)
class GraphTypes:
    """The adapters of one graph: state, inputs, output, and every typed node's input."""

    state: TypeAdapter[Any]
    inputs: TypeAdapter[Any]
    output: TypeAdapter[Any]
    nodes: Mapping[str, TypeAdapter[Any]]
    decisions: frozenset[str]


def graph_types(graph: Graph, input_types: Mapping[str, Any]) -> GraphTypes:
    """Work out every input type of ``graph``; raise if a declared type cannot be written down."""
    name = graph.name or "graph"
    state = _adapter(graph.state_type)
    if state is None:
        raise GraphStateTypeError(
            f"the state type {_type_name(graph.state_type)} of {name} has no pydantic schema, so no "
            "checkpoint could hold it; use a dataclass, a pydantic model or another type pydantic "
            "can serialize"
        )
    inputs = _required(graph.input_type, f"the input type of {name}")
    output = _required(graph.output_type, f"the output type of {name}")

    nodes: dict[str, TypeAdapter[Any]] = {}
    known: dict[str, Any] = {}
    for node_id, node in graph.nodes.items():
        if isinstance(node, Step):
            tp = _step_input_type(node)
            adapter = None if tp is _UNKNOWN else _adapter(tp)
            if adapter is not None:
                nodes[node_id] = adapter
        elif isinstance(node, EndNode):
            nodes[node_id] = output
    for named, tp in input_types.items():
        node_id = NodeID(named)
        if node_id not in graph.nodes or node_id == StartNode.id:
            raise GraphInputTypeError(
                f"input_types names {node_id!r}, which is not a node of {name}; its nodes are "
                f"{sorted(n for n in graph.nodes if n != StartNode.id)}"
            )
        nodes[node_id] = _required(tp, f"input_types[{node_id!r}]")
        known[node_id] = tp

    _infer(graph, known, nodes, frozenset(input_types))
    decisions = frozenset(n for n, node in graph.nodes.items() if isinstance(node, Decision))
    return GraphTypes(state, inputs, output, nodes, decisions)


def _infer(
    graph: Graph,
    known: dict[str, Any],
    nodes: dict[str, TypeAdapter[Any]],
    explicit: frozenset[str],
) -> None:
    incoming: dict[str, list[tuple[NodeID, Path]]] = {}
    for source_id, paths in graph.edges_by_source.items():
        for path in paths:
            _add_edge(incoming, source_id, path)
    for node_id, node in graph.nodes.items():
        if isinstance(node, Decision):
            for branch in node.branches:
                _add_edge(incoming, node_id, branch.path)

    pending = [
        node_id
        for node_id, node in graph.nodes.items()
        if isinstance(node, Decision | Fork) and node_id not in explicit
    ]
    learned = True
    while learned:
        learned = False
        for node_id in list(pending):
            carried = [_carried(graph, known, source, path) for source, path in incoming.get(node_id, [])]
            if not carried or any(tp is _UNKNOWN for tp in carried):
                continue
            tp = carried[0]
            if any(other != tp for other in carried[1:]):
                continue
            pending.remove(node_id)
            adapter = _adapter(tp)
            if adapter is None:
                continue  # no schema: dropped, so the graph still registers
            known[node_id] = tp
            nodes[node_id] = adapter
            learned = True


def _add_edge(incoming: dict[str, list[tuple[NodeID, Path]]], source_id: NodeID, path: Path) -> None:
    for item in path.items:
        if isinstance(item, DestinationMarker):
            incoming.setdefault(item.destination_id, []).append((source_id, path))


def _carried(graph: Graph, known: Mapping[str, Any], source_id: NodeID, path: Path) -> Any:
    """The type an edge carries, or _UNKNOWN."""
    if any(isinstance(item, TransformMarker) for item in path.items):
        return _UNKNOWN
    node = graph.nodes[source_id]
    if isinstance(node, StartNode):
        return graph.input_type
    if isinstance(node, Decision):
        return known.get(source_id, _UNKNOWN)
    if isinstance(node, Step) and not isinstance(node, NodeStep) and not is_stream_step(node):
        return _return_type(node)
    return _UNKNOWN  # a join's reduced value, a fork's items or copies, a BaseNode


def _hints(node: Step) -> dict[str, Any] | None:
    try:
        return get_type_hints(node.call, include_extras=True)
    except (NameError, TypeError):
        return None  # an annotation that does not resolve here: untyped


def _step_input_type(node: Step) -> Any:
    hints = _hints(node)
    try:
        params = list(inspect.signature(node.call).parameters.values())
    except (TypeError, ValueError):
        return _UNKNOWN
    if hints is None or not params or params[0].name not in hints:
        return _UNKNOWN
    annotation = _strip_annotated(hints[params[0].name])
    if get_origin(annotation) is not StepContext:
        return _UNKNOWN
    args = get_args(annotation)
    return _strip_annotated(args[2]) if len(args) == 3 else _UNKNOWN


def _return_type(node: Step) -> Any:
    hints = _hints(node)
    if hints is None or "return" not in hints:
        return _UNKNOWN
    tp = _strip_annotated(hints["return"])
    if tp is Any or isinstance(tp, TypeVar):
        return _UNKNOWN
    return tp


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _adapter(tp: Any) -> TypeAdapter[Any] | None:
    try:
        return TypeAdapter(tp)
    except PydanticUserError:
        return None


def _required(tp: Any, what: str) -> TypeAdapter[Any]:
    adapter = _adapter(tp)
    if adapter is None:
        raise GraphInputTypeError(
            f"{what} is {_type_name(tp)}, which pydantic has no schema for, so no checkpoint could "
            "hold it; use a type pydantic can serialize"
        )
    return adapter


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)
