"""The types a checkpoint is written down and read back through.

A checkpoint holds the graph state, the graph's inputs and the next task's
inputs. Each is written through a pydantic ``TypeAdapter`` of its type:

* the state, inputs and output types are the graph's own; a state type
  pydantic has no schema for, or whose adapter stays incomplete (it names
  a class nothing reaches), is refused at registration
  (:class:`GraphStateTypeError`), as are such input and output types
  (:class:`GraphInputTypeError`);
* a step's input type is ``I`` in its ``StepContext[State, Deps, I]``
  annotation (``Annotated`` metadata dropped), resolved as pydantic-graph
  resolves it (:mod:`._annotations`); an annotation that does not resolve is
  refused at registration, naming every such step and the fix; the end
  node's type is the graph's output type;
* a decision's or a fork's input type is inferred from the edges into it: when
  every such edge has no transform and comes from a step with a return
  annotation, from the start node (the graph's input type) or from a decision
  whose type is known, and all carry the same type, that is its type.
  Inference repeats until it learns nothing more;
* ``input_types={node_id: type}`` overrides all of the above, and decisions
  after an explicitly typed one infer from the explicit type.

* a ``BaseNode`` step's input type is its node class: pydantic-graph types
  the step's input ``Any``, but runs it only on an instance of that class
  (a class pydantic has no complete schema for leaves it untyped);

What stays unknown (a transform on an edge, an edge from a join, a fork, a
``BaseNode`` or a stream step, a return annotation that is missing, ``Any`` or
a type variable, edges that disagree, an annotation or inferred type pydantic
has no schema for) leaves the node untyped, and no checkpoint is saved before
it. :attr:`GraphTypes.untyped` says why for each untyped node that can come
right after a step outside a fork, the only places a checkpoint could be.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar, get_args, get_origin

import msgspec
from pydantic import TypeAdapter
from pydantic_graph import Decision, Fork, Graph, Join, Step, StepContext
from pydantic_graph.id_types import NodeID
from pydantic_graph.node import EndNode, StartNode
from pydantic_graph.paths import BroadcastMarker, DestinationMarker, MapMarker, Path, TransformMarker
from pydantic_graph.step import NodeStep

from ._annotations import NO_ANNOTATION, GraphNamespace, Incomplete, Unresolved, complete_adapter
from ._errors import GraphInputTypeError, GraphStateTypeError
from ._quiescence import ForkRegions, is_stream_step

__all__ = ["GraphTypes", "graph_types"]


class GraphTypes(msgspec.Struct, frozen=True):
    """The adapters of one graph: state, inputs, output, and every typed node's input.

    ``untyped`` maps each node that can follow a step outside a fork but has
    no known input type to why, in words; no checkpoint is saved before it.
    """

    state: TypeAdapter[Any]
    inputs: TypeAdapter[Any]
    output: TypeAdapter[Any]
    nodes: Mapping[str, TypeAdapter[Any]]
    decisions: frozenset[str]
    untyped: Mapping[str, str]


_SERIALIZABLE_STATE = "use a dataclass, a pydantic model or another type pydantic can serialize"


class _Unknown:
    """An input type that is not known, and why."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def graph_types(graph: Graph, input_types: Mapping[str, Any], namespace: GraphNamespace) -> GraphTypes:
    """Work out every input type of ``graph``; raise if a declared type cannot be written down."""
    name = graph.name or "graph"
    state = complete_adapter(graph.state_type, namespace)
    if not isinstance(state, TypeAdapter):
        raise GraphStateTypeError(
            f"the state type {_type_name(graph.state_type)} of {name} {_cannot(state)}, so no checkpoint "
            f"could hold it; {_fix(state, _SERIALIZABLE_STATE)}"
        )
    inputs = _required(graph.input_type, f"the input type of {name}", namespace)
    output = _required(graph.output_type, f"the output type of {name}", namespace)

    nodes: dict[str, TypeAdapter[Any]] = {}
    known: dict[str, Any] = {}
    why: dict[str, str] = {}
    refused: list[str] = []
    for node_id, node in graph.nodes.items():
        if isinstance(node, EndNode):
            nodes[node_id] = output
        elif isinstance(node, NodeStep) and node_id not in input_types:
            typed = _node_class_input(node, namespace)  # its input is an instance of its BaseNode class
            if isinstance(typed, TypeAdapter):
                nodes[node_id] = typed
            else:
                why[node_id] = typed.why
        elif isinstance(node, Step) and node_id not in input_types:
            found = _step_input(node, namespace)
            if isinstance(found, TypeAdapter):
                nodes[node_id] = found
            elif isinstance(found, _Unknown):
                why[node_id] = found.why
            else:
                refused.append(f"step {node_id!r}: {found}")
    if refused:
        raise GraphInputTypeError(
            f"the input types of these steps of {name} do not resolve, so no checkpoint could be "
            f"saved before them: {'; '.join(refused)}. Define those names at module level, build "
            "(or register) the graph inside the function that defines them, or name each step's input "
            "type with DurableGraph(..., input_types={step id: type})"
        )
    for named, tp in input_types.items():
        node_id = NodeID(named)
        if node_id not in graph.nodes or node_id == StartNode.id:
            raise GraphInputTypeError(
                f"input_types names {node_id!r}, which is not a node of {name}; its nodes are "
                f"{sorted(n for n in graph.nodes if n != StartNode.id)}"
            )
        nodes[node_id] = _required(tp, f"input_types[{node_id!r}]", namespace)
        known[node_id] = tp

    _infer(graph, namespace, known, nodes, why, frozenset(input_types))
    decisions = frozenset(n for n, node in graph.nodes.items() if isinstance(node, Decision))
    untyped: dict[str, str] = {}
    for after in _after_steps(graph):
        if after not in nodes:
            untyped[after] = why.get(after, "its input type is not known")
    return GraphTypes(state, inputs, output, nodes, decisions, untyped)


def _node_class_input(node: NodeStep, namespace: GraphNamespace) -> TypeAdapter[Any] | _Unknown:
    """A BaseNode step's input adapter: its node class (pydantic-graph types the step's input Any, but
    runs it only on an instance of that class), or why the class has no complete schema."""
    adapter = complete_adapter(node.node_type, namespace)
    if isinstance(adapter, TypeAdapter):
        return adapter
    if isinstance(adapter, Incomplete):
        return _Unknown(f"its node class {_type_name(node.node_type)} {_cannot(adapter)}")
    return _Unknown(f"its node class {_type_name(node.node_type)} has no pydantic schema")


def _step_input(node: Step, namespace: GraphNamespace) -> TypeAdapter[Any] | _Unknown | str:
    """A step's input adapter, why it has none, or (a string) why its annotation is refused."""
    try:
        params = list(inspect.signature(node.call).parameters.values())
    except (TypeError, ValueError):
        return _Unknown("its function has no signature to read")
    if not params:
        return _Unknown("its function takes no parameter")
    annotation = namespace.resolve_annotation(node.call, params[0].name)
    if annotation is NO_ANNOTATION:
        return _Unknown(f"its parameter {params[0].name!r} has no StepContext[State, Deps, Input] annotation")
    if isinstance(annotation, Unresolved):
        return f"{annotation.text} does not resolve ({annotation.error})"
    annotation = _strip_annotated(annotation)
    args = get_args(annotation)
    if get_origin(annotation) is not StepContext or len(args) != 3:
        return _Unknown(
            f"its parameter is annotated {_type_name(annotation)}, not StepContext[State, Deps, Input]"
        )
    tp = _strip_annotated(args[2])
    adapter = complete_adapter(tp, namespace)
    if isinstance(adapter, Incomplete):
        return f"its input type {_type_name(tp)} {_cannot(adapter)}"
    if adapter is None:
        return _Unknown(f"its input type {_type_name(tp)} has no pydantic schema")
    return adapter


def _infer(
    graph: Graph,
    namespace: GraphNamespace,
    known: dict[str, Any],
    nodes: dict[str, TypeAdapter[Any]],
    why: dict[str, str],
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
            carried = [
                _carried(graph, namespace, known, source, path) for source, path in incoming.get(node_id, [])
            ]
            unknown = [tp for tp in carried if isinstance(tp, _Unknown)]
            if not carried or unknown:
                why[node_id] = unknown[0].why if unknown else "no edge leads into it"
                continue
            tp = carried[0]
            pending.remove(node_id)
            if any(other != tp for other in carried[1:]):
                why[node_id] = "the edges into it carry different types: " + ", ".join(
                    sorted({_type_name(t) for t in carried})
                )
                continue
            adapter = complete_adapter(tp, namespace)
            if not isinstance(adapter, TypeAdapter):
                why[node_id] = f"its inferred input type {_type_name(tp)} {_cannot(adapter)}"
                continue  # dropped, so the graph still registers
            known[node_id] = tp
            nodes[node_id] = adapter
            why.pop(node_id, None)
            learned = True


def _add_edge(incoming: dict[str, list[tuple[NodeID, Path]]], source_id: NodeID, path: Path) -> None:
    for item in path.items:
        if isinstance(item, DestinationMarker):
            incoming.setdefault(item.destination_id, []).append((source_id, path))


def _carried(
    graph: Graph, namespace: GraphNamespace, known: Mapping[str, Any], source_id: NodeID, path: Path
) -> Any:
    """The type an edge carries, or an :class:`_Unknown` saying why not."""
    if any(isinstance(item, TransformMarker) for item in path.items):
        return _Unknown(f"the edge from {source_id!r} transforms its value")
    node = graph.nodes[source_id]
    if isinstance(node, StartNode):
        return graph.input_type
    if isinstance(node, Decision):
        return known.get(source_id, _Unknown(f"the decision {source_id!r} before it is untyped"))
    if isinstance(node, Join):
        return _Unknown(f"the edge from the join {source_id!r} carries its reduced value")
    if isinstance(node, Fork):
        return _Unknown(f"the edge from the fork {source_id!r} carries its items or copies")
    if isinstance(node, NodeStep):
        return _Unknown(f"the edge from the BaseNode step {source_id!r} is not typed")
    if isinstance(node, Step) and is_stream_step(node):
        return _Unknown(f"the edge from the stream step {source_id!r} is not typed")
    if isinstance(node, Step):
        return _return_type(source_id, node, namespace)
    return _Unknown(f"the edge from {source_id!r} is not typed")


def _return_type(node_id: str, node: Step, namespace: GraphNamespace) -> Any:
    annotation = namespace.resolve_annotation(node.call, "return")
    if annotation is NO_ANNOTATION:
        return _Unknown(f"the step {node_id!r} before it has no return annotation")
    if isinstance(annotation, Unresolved):
        return _Unknown(
            f"the return annotation {annotation.text} of the step {node_id!r} before it does not resolve "
            f"({annotation.error})"
        )
    tp = _strip_annotated(annotation)
    if tp is Any:
        return _Unknown(f"the step {node_id!r} before it returns Any")
    if isinstance(tp, TypeVar):
        return _Unknown(f"the step {node_id!r} before it returns a type variable")
    return tp


def _after_steps(graph: Graph) -> list[NodeID]:
    """Nodes that can be the one task after a step outside a fork: where checkpoints can be."""
    regions = ForkRegions.of(graph)
    inside = regions.joins.union(*regions.regions.values())
    found: list[NodeID] = []
    for source_id, paths in graph.edges_by_source.items():
        source = graph.nodes.get(source_id)
        if source_id in inside or not isinstance(source, Step) or is_stream_step(source):
            continue  # a stream step's output is an iterator: never written down, whatever its type
        for path in paths:
            if any(isinstance(item, MapMarker | BroadcastMarker) for item in path.items):
                continue
            for item in path.items:
                if isinstance(item, DestinationMarker) and item.destination_id not in (*inside, *found):
                    found.append(item.destination_id)
    return found


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _required(tp: Any, what: str, namespace: GraphNamespace) -> TypeAdapter[Any]:
    adapter = complete_adapter(tp, namespace)
    if not isinstance(adapter, TypeAdapter):
        raise GraphInputTypeError(
            f"{what} is {_type_name(tp)}, which {_cannot(adapter)}, so no checkpoint could hold it; "
            f"{_fix(adapter, 'use a type pydantic can serialize')}"
        )
    return adapter


def _cannot(problem: Incomplete | None) -> str:
    if problem is None:
        return "has no pydantic schema"
    return f"names types that do not resolve ({problem.error})"


def _fix(problem: Incomplete | None, otherwise: str) -> str:
    if problem is None:
        return otherwise
    return (
        "define the types it names at module level, or build (or register) the graph inside the "
        "function that defines them"
    )


def _type_name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)
