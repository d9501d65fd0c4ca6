"""Reading a graph's annotations the way pydantic-graph reads them, after its builder has returned.

pydantic-graph resolves a step's annotations with ``get_type_hints`` while the
builder runs, with the builder's frame as the local namespace, so types local
to the builder and names imported inside it resolve there, with or without
``from __future__ import annotations``. A durable graph is registered after
the builder returned, when that frame is gone, so it looks names up in
everything that still reaches them, most specific first:

1. the function's own closure (what its body uses);
2. the locals of the function that registers the graph, when that function
   is not a module (a graph registered inside its builder sees the builder's
   frame, as pydantic-graph does);
3. the graph's own types by name: state, deps, input and output types, the
   classes decisions match, ``BaseNode`` classes;
4. the closures of the graph's other steps;
5. pydantic-graph's public names (``StepContext``, ``GraphBuilder`` …);
6. the module globals of whoever registers the graph.

Layers 1 and 2 take precedence over the function's module globals, as the
builder's frame does for pydantic-graph; layers 3 to 6 only fill names the
module does not define. A name none of these reaches does not resolve: the
caller gets the ``NameError`` and says so in plain words
(:func:`resolve_annotation`).

The same namespace completes pydantic adapters whose types refer to such names
(a state dataclass whose field names a class local to the builder):
:func:`complete_adapter` rebuilds them with it through ``TypeAdapter.rebuild``'s
``_types_namespace`` (pinned with pydantic-graph's private fields in
``tests/ledger/graphs/test_quiescence.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import FrameType, SimpleNamespace
from typing import Any, Final, get_origin, get_type_hints

import msgspec
import pydantic_graph
from pydantic import PydanticUserError, TypeAdapter
from pydantic.errors import PydanticUndefinedAnnotation
from pydantic_graph import Decision, Graph, Step
from pydantic_graph.step import NodeStep

__all__ = ["NO_ANNOTATION", "GraphNamespace", "Incomplete", "Unresolved", "caller_frame", "complete_adapter"]


class Unresolved(msgspec.Struct, frozen=True):
    """An annotation that names something no namespace reaches."""

    text: str
    error: str  # "name 'Order' is not defined"


class Incomplete(msgspec.Struct, frozen=True):
    """A type whose pydantic adapter cannot be completed: it refers to names nothing reaches."""

    error: str


class _NoAnnotation:
    def __repr__(self) -> str:
        return "NO_ANNOTATION"


#: What :meth:`GraphNamespace.resolve_annotation` returns for a name that is not annotated.
NO_ANNOTATION: Final = _NoAnnotation()


def caller_frame(depth: int) -> FrameType | None:
    """The frame ``depth`` calls up, skipping ``typing``'s (``DurableGraph[...](...)`` adds one)."""
    frame = inspect.currentframe()
    for _ in range(depth + 1):
        if frame is None:
            return None
        frame = frame.f_back
    while frame is not None and frame.f_globals.get("__name__") == "typing":
        frame = frame.f_back
    return frame


class GraphNamespace:
    """Where the names in a graph's annotations are looked up (see the module docstring)."""

    __slots__ = ("_caller_locals", "_fallback")

    def __init__(self, graph: Graph, caller: FrameType | None) -> None:
        self._caller_locals: dict[str, Any] = {}
        self._fallback: dict[str, Any] = {}
        if caller is not None:
            if caller.f_locals is caller.f_globals:
                self._fallback.update(caller.f_globals)
            else:
                self._caller_locals = dict(caller.f_locals)
                self._fallback.update(caller.f_globals)
        self._fallback.update(_public_names(pydantic_graph))
        for node in graph.nodes.values():
            if isinstance(node, Step):
                self._fallback.update(_closure(node.call))
        for tp in _graph_types(graph):
            # classes only: list[str].__name__ is "list", and would shadow the builtin
            if isinstance(tp, type) and get_origin(tp) is None and tp.__module__ != "builtins":
                self._fallback[tp.__name__] = tp

    def for_function(self, fn: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The globals and locals to evaluate ``fn``'s annotations in."""
        target = inspect.unwrap(fn)
        module: dict[str, Any] = getattr(target, "__globals__", {})
        local = {name: value for name, value in self._fallback.items() if name not in module}
        local.update(self._caller_locals)
        local.update(_closure(target))
        return module, local

    def for_types(self) -> dict[str, Any]:
        """The namespace to complete adapters of the graph's types with."""
        return {**self._fallback, **self._caller_locals}

    def resolve_annotation(self, fn: Callable[..., Any], name: str) -> Any:
        """``fn``'s annotation ``name`` (a parameter or ``"return"``), resolved.

        Returns the annotation with ``Annotated`` metadata kept, :data:`NO_ANNOTATION` when
        there is none, or :class:`Unresolved` when it names something unreachable.
        """
        try:
            raw = inspect.get_annotations(fn).get(name, NO_ANNOTATION)
        except TypeError:
            return NO_ANNOTATION
        if raw is NO_ANNOTATION:
            return NO_ANNOTATION
        module, local = self.for_function(fn)
        holder = SimpleNamespace(__annotations__={name: raw})
        try:
            return get_type_hints(holder, globalns=module, localns=local, include_extras=True)[name]
        except (NameError, AttributeError, TypeError, SyntaxError) as exc:
            return Unresolved(raw if isinstance(raw, str) else repr(raw), _plain_error(exc))


def complete_adapter(tp: Any, namespace: GraphNamespace) -> TypeAdapter[Any] | Incomplete | None:
    """A complete adapter of ``tp``; :class:`Incomplete` if names stay unresolved; None if no schema."""
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(tp)
    except PydanticUndefinedAnnotation as exc:
        return Incomplete(_plain_error(exc))
    except PydanticUserError:
        return None
    if adapter.pydantic_complete:
        return adapter
    try:
        adapter.rebuild(raise_errors=True, _types_namespace=namespace.for_types())
    except PydanticUndefinedAnnotation as exc:
        return Incomplete(_plain_error(exc))
    except PydanticUserError:
        return None
    if not adapter.pydantic_complete:
        return Incomplete("pydantic could not complete its schema")
    return adapter


def _plain_error(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _closure(fn: Callable[..., Any]) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    found: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # an empty cell: the name was never bound
            continue
    return found


def _public_names(module: Any) -> Mapping[str, Any]:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    return {name: getattr(module, name) for name in names if hasattr(module, name)}


def _graph_types(graph: Graph) -> list[Any]:
    found = [graph.state_type, graph.deps_type, graph.input_type, graph.output_type]
    for node in graph.nodes.values():
        if isinstance(node, NodeStep):
            found.append(node.node_type)
        elif isinstance(node, Decision):
            found.extend(branch.source for branch in node.branches)
    return found
