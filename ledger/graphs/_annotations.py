"""Reading a graph's annotations the way pydantic-graph reads them, after its builder has returned.

pydantic-graph resolves a step's annotations with ``get_type_hints`` while the
builder runs, with the builder's frame as the local namespace, so types local
to the builder and names imported inside it resolve there, with or without
``from __future__ import annotations``. A durable graph is usually registered
after the builder returned, when that frame is gone. So importing
``ledger.graphs`` makes ``GraphBuilder.build`` keep the locals of the function
that calls it (:func:`remember_builder_locals`: the frame pydantic-graph's own
``GraphBuilder.add`` reads, at the end of the builder), and a graph looks
names up in everything that still reaches them, most specific first:

1. the function's own closure (what its body uses);
2. the locals of the function that called ``build()``, when that function is
   not a module: a ``Literal`` alias, a class or a name imported inside the
   builder;
3. the locals of the function that registers the graph, when that function
   is not a module (a graph registered inside its builder sees the builder's
   frame, as pydantic-graph does);
4. the graph's own types by name: state, deps, input and output types, the
   classes decisions match, ``BaseNode`` classes;
5. the closures of the graph's other steps;
6. pydantic-graph's public names (``StepContext``, ``GraphBuilder`` …);
7. the module globals of whoever registers the graph.

Layers 1 to 3 take precedence over the function's module globals, as the
builder's frame does for pydantic-graph; layers 4 to 7 only fill names the
module does not define. A name none of these reaches does not resolve (one
imported only under ``if TYPE_CHECKING:``, or local to a function other than
the one that built the graph, or a graph built before ``ledger.graphs`` was
imported): the caller gets the ``NameError`` and says so in plain words
(:func:`resolve_annotation`).

The same namespace completes pydantic adapters whose types refer to such names
(a state dataclass whose field names a class local to the builder):
:func:`complete_adapter` rebuilds them with it through ``TypeAdapter.rebuild``'s
``_types_namespace`` (pinned with pydantic-graph's private fields in
``tests/ledger/graphs/test_quiescence.py``).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping
from types import FrameType, ModuleType, SimpleNamespace
from typing import Any, Final, NewType, TypeVar, get_origin, get_type_hints

import msgspec
import pydantic_graph
from pydantic import PydanticUserError, TypeAdapter
from pydantic.errors import PydanticUndefinedAnnotation
from pydantic_graph import Decision, Graph, GraphBuilder, Step
from pydantic_graph.step import NodeStep

__all__ = [
    "NO_ANNOTATION",
    "GraphNamespace",
    "Incomplete",
    "Unresolved",
    "builder_locals",
    "caller_frame",
    "complete_adapter",
    "remember_builder_locals",
]


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


#: The locals of the function that built each graph built since ``ledger.graphs`` was imported, by
#: the graph's id; an entry goes with its graph.
_BUILT_IN: dict[int, dict[str, Any]] = {}


#: The wrappers :func:`remember_builder_locals` put in place of ``GraphBuilder.build`` (one per process).
_WRAPPERS: list[Any] = []


def builder_locals(graph: Graph) -> Mapping[str, Any]:
    """The locals of the function that called ``build()`` for ``graph``, as they were then (or none)."""
    return _BUILT_IN.get(id(graph), {})


def remember_builder_locals() -> None:
    """Make ``GraphBuilder.build`` keep the locals of the function that calls it (once per process).

    The graph it returns is the one pydantic-graph built, unchanged; only
    the caller's locals are kept beside it, until the graph is collected. A
    builder called from a module (where locals are its globals) keeps
    nothing. It wraps the public ``GraphBuilder.build`` only, which reads no
    frame itself (``GraphBuilder.add`` reads its caller's, and is left as it
    is).
    """
    build = GraphBuilder.build
    if build in _WRAPPERS:
        return

    @functools.wraps(build)
    def build_keeping_locals(self: Any, *args: Any, **kwargs: Any) -> Any:
        graph = build(self, *args, **kwargs)
        builder = caller_frame(1)
        if builder is not None and builder.f_locals is not builder.f_globals:
            _BUILT_IN[id(graph)] = {n: v for n, v in builder.f_locals.items() if _nameable(v)}
            weakref.finalize(graph, _BUILT_IN.pop, id(graph), None)
        return graph

    _WRAPPERS.append(build_keeping_locals)
    setattr(GraphBuilder, "build", build_keeping_locals)  # noqa: B010 - mypy refuses assigning a method


def _nameable(value: object) -> bool:
    """Whether an annotation can name ``value``: a class, a module, a typing form or alias.

    Only those are kept of a builder's locals: its other values (the builder,
    the graph itself, data) would be held as long as the graph, and the
    graph would never be collected if they held it.
    """
    if isinstance(value, type | ModuleType | TypeVar | NewType) or get_origin(value) is not None:
        return True
    return type(value).__module__ in ("typing", "typing_extensions")


class GraphNamespace:
    """Where the names in a graph's annotations are looked up (see the module docstring)."""

    __slots__ = ("_builder_locals", "_caller_locals", "_fallback")

    def __init__(self, graph: Graph, caller: FrameType | None) -> None:
        self._builder_locals = dict(builder_locals(graph))
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
        local.update(self._builder_locals)
        local.update(_closure(target))
        return module, local

    def for_types(self) -> dict[str, Any]:
        """The namespace to complete adapters of the graph's types with."""
        return {**self._fallback, **self._caller_locals, **self._builder_locals}

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
