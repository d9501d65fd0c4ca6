"""Graphs: nodes with typed ports, Sub mounts, and the checks that make a definition runnable.

A :class:`Graph` declares its external ``inputs`` and its nodes. A node
``requires`` keys (each produced by exactly one node of the graph, or an
input) and ``provides`` keys. A Sub mount runs another graph as one node of
this one: ``inlets`` wire the child's inputs to keys of this graph (a child
input may instead be ``fixed`` to a value), ``outlets`` expose keys the child
provides under keys of this graph. Wiring is live: a child node starts as
soon as its own inputs have arrived, whatever other inlets still wait.

:meth:`Graph.validate` checks the whole tree at once and reports every
problem with its mount path (``checkpoint=True`` adds what only checkpoint
mode cannot run: a cycle through a Sub mount's commit, see :class:`_Waits`);
:meth:`Graph.topology` orders the nodes and fingerprints the structure;
:meth:`Graph.checkpoint_nodes` and :meth:`Graph.checkpoint_ports` copy the
declarations with their real types, as a store needs them to check and
decode a recovery plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from ._aliases import Alias, StreamPlan
from ._codec import codec_for
from ._errors import GraphError, PayloadTypeError
from ._keys import Key, check_name
from ._type_names import qualified_type_name, type_name

if TYPE_CHECKING:
    from ._aspects import Aspect
    from ._context import NodeContext

__all__ = [
    "Graph",
    "Member",
    "NodeDef",
    "NodeSpec",
    "PortSpec",
    "SubDef",
    "Topology",
    "TopologyNode",
    "members_of",
]

NodeFn = Callable[["NodeContext"], Awaitable[None]]
F = TypeVar("F", bound=NodeFn)


@dataclass(frozen=True, eq=False)
class NodeDef:
    """A business node: its function runs once its required keys have arrived."""

    name: str
    fn: NodeFn
    requires: tuple[Key[Any], ...]
    provides: tuple[Key[Any], ...]
    aspects: tuple[Aspect, ...] = ()
    resumable: bool = False  # its streams continue from their writer's position after a crash

    @property
    def streams(self) -> tuple[Key[Any], ...]:
        """The stream keys it writes."""
        return tuple(key for key in self.provides if key.is_stream)


@dataclass(frozen=True, eq=False)
class SubDef:
    """A Sub mount: ``graph`` run as one node, its ports wired to this graph's keys."""

    name: str
    graph: Graph
    inlets: tuple[tuple[Key[Any], Key[Any]], ...]  # (child input, key of this graph)
    outlets: tuple[tuple[Key[Any], Key[Any]], ...]  # (child key, key of this graph)
    fixed: tuple[tuple[Key[Any], Any], ...]  # (child input, the value read back as its type)
    aspects: tuple[Aspect, ...] = ()
    without_aspects: bool = False

    @property
    def requires(self) -> tuple[Key[Any], ...]:
        """The keys of this graph the mount reads: its wiring, not a gate (inlets may stay pending)."""
        return tuple(dict.fromkeys(parent for _, parent in self.inlets))  # one key may feed several inlets

    @property
    def provides(self) -> tuple[Key[Any], ...]:
        return tuple(parent for _, parent in self.outlets)


Member = NodeDef | SubDef


@dataclass(frozen=True)
class PortSpec:
    """One declared port of a graph in the tree: where, what, and its real type."""

    path: tuple[str, ...]  # mount names from the root to the graph declaring the port
    node: str  # the node or mount declaring it; "" for the graph's own inputs
    role: Literal["input", "requires", "provides", "inlet", "outlet", "fixed"]
    key: str
    type: Any
    type_name: str


@dataclass(frozen=True)
class NodeSpec:
    """One node of the tree as a recovery plan must match it."""

    path: tuple[str, ...]  # mount names from the root to the graph holding the node
    name: str
    kind: Literal["node", "sub"]
    requires: tuple[tuple[str, Any], ...]  # (key name, real type)
    provides: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class TopologyNode:
    name: str
    kind: Literal["node", "sub"]
    requires: tuple[str, ...]
    provides: tuple[str, ...]
    after: tuple[str, ...]  # the nodes whose outputs it reads
    child: Topology | None = None


@dataclass(frozen=True)
class Topology:
    """A graph's nodes in an order that runs producers first, and a fingerprint of the structure.

    The fingerprint covers names, version, ports with their type names and the
    wiring of every Sub. A type is named by its shape, never its module
    (:func:`~streams.store.type_name`), so a graph run as ``python app.py``
    (its types in ``__main__``) has the fingerprint it has where ``import
    app`` loaded it. It cannot see a change inside a node's function, a
    fixed value or an aspect: change the graph's ``version`` when those change.
    A node's and a mount's aspects (and ``without_aspects``) place its
    persistent Retry boundaries, so a change to them is such a change. They
    stay out of the fingerprint on purpose: every run record and every Sub
    attempt's record holds a fingerprint, and one that covered them would
    leave every run in flight of a graph with node aspects unresumable after
    an upgrade. (The execution's own aspects are recorded by the durable host
    instead: ``ledger.run`` keeps them in the run's record.)
    """

    graph: str
    version: str
    inputs: tuple[str, ...]
    nodes: tuple[TopologyNode, ...]
    fingerprint: str = field(compare=False)
    #: What the fingerprint is the digest of, as JSON-ready lists and dicts: every member with its
    #: ports and their type names, each Sub with its child's shape and its wiring. A host that keeps
    #: it can say what differs when a fingerprint does not match.
    shape: Mapping[str, Any] = field(compare=False, default_factory=dict, repr=False)
    #: The graph's fingerprint and shape with types named with their modules
    #: (:func:`~streams.store.qualified_type_name`). A run or a Sub scope recorded under it is of this
    #: graph, when the code that recorded it runs it.
    legacy_fingerprint: str = field(compare=False, default="")
    legacy_shape: Mapping[str, Any] = field(compare=False, default_factory=dict, repr=False)


class Graph:
    """A named, versioned graph of nodes and Sub mounts; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        version: str = "1",
        inputs: Iterable[Key[Any]] = (),
        outlets: Iterable[Key[Any]] = (),
    ) -> None:
        check_name(name, "a graph name")
        if not isinstance(version, str) or not version:
            raise ValueError(f"a graph version must be a non-empty string, got {version!r}")
        self.name = name
        self.version = version
        self.inputs: tuple[Key[Any], ...] = _keys(inputs, f"graph {name!r} inputs")
        #: Streams of this graph a host may read when it runs as the root (``Execution(host_readers=)``):
        #: ``validate()`` does not ask them for a reader node; the execution's start checks that
        #: each has a reader, a node or a host.
        self.outlets: tuple[Key[Any], ...] = _keys(outlets, f"graph {name!r} outlets")
        self._members: list[Member] = []
        self._checked: tuple[int, tuple[str, ...], Topology | None] | None = None  # (changes, problems, ...)
        self._plans: dict[tuple[tuple[str, ...], str], StreamPlan] = {}
        self._all_problems: tuple[str, ...] = ()
        self._checkpoint_problems: tuple[str, ...] | None = None  # reset with _checked

    def _changes(self) -> int:
        """How many members the tree holds: validation is redone only when it grows."""
        return len(self._members) + sum(m.graph._changes() for m in self._members if isinstance(m, SubDef))

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, version={self.version!r}, nodes={len(self._members)})"

    @overload
    def node(self, fn: F, /) -> F: ...
    @overload
    def node(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        requires: Iterable[Key[Any]] = (),
        provides: Iterable[Key[Any]] = (),
        aspects: Iterable[Aspect] = (),
        resumable: bool = False,
    ) -> Callable[[F], F]: ...
    def node(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        requires: Iterable[Key[Any]] = (),
        provides: Iterable[Key[Any]] = (),
        aspects: Iterable[Aspect] = (),
        resumable: bool = False,
    ) -> F | Callable[[F], F]:
        """Add ``async def fn(ctx)`` as a node (a decorator, with or without arguments); returns ``fn``."""

        def add(fn: F) -> F:
            self.add_node(
                name or fn.__name__,
                fn,
                requires=requires,
                provides=provides,
                aspects=aspects,
                resumable=resumable,
            )
            return fn

        return add if fn is None else add(fn)

    def add_node(
        self,
        name: str,
        fn: NodeFn,
        *,
        requires: Iterable[Key[Any]] = (),
        provides: Iterable[Key[Any]] = (),
        aspects: Iterable[Aspect] = (),
        resumable: bool = False,
    ) -> NodeDef:
        """Add node ``name``. A stream key in ``provides`` makes it the stream's writer, in
        ``requires`` a reader in a consumer group of its own. ``resumable=True`` promises that
        after a crash it continues its streams from their writers' ``position`` (only then may an
        interrupted writer run again on the streams it had begun)."""
        check_name(name, "a node name")
        if not callable(fn):
            raise TypeError(f"node {name!r}: its function must be an async callable, got {fn!r}")
        node = NodeDef(
            name,
            fn,
            _keys(requires, f"node {name!r} requires"),
            _keys(provides, f"node {name!r} provides"),
            _aspects(aspects, name),
            bool(resumable),
        )
        self._members.append(node)
        return node

    def sub(
        self,
        name: str,
        graph: Graph,
        *,
        inlets: Mapping[Key[Any], Key[Any]] | None = None,
        outlets: Mapping[Key[Any], Key[Any]] | None = None,
        fixed: Mapping[Key[Any], Any] | None = None,
        aspects: Iterable[Aspect] = (),
        without_aspects: bool = False,
    ) -> SubDef:
        """Mount ``graph`` as node ``name``: ``inlets``/``outlets`` map child keys to keys of this graph.

        ``fixed`` gives child inputs a value instead (read back as the key's
        type now). ``aspects`` wrap the whole mount; ``without_aspects``
        keeps the execution's own aspects off the nodes inside it.
        """
        check_name(name, "a Sub mount name")
        if not isinstance(graph, Graph):
            raise TypeError(f"Sub {name!r}: expected a Graph, got {graph!r}")
        wiring = {"inlets": dict(inlets or {}), "outlets": dict(outlets or {})}
        for what, pairs in wiring.items():
            for child, parent in pairs.items():
                if not isinstance(child, Key) or not isinstance(parent, Key):
                    raise TypeError(f"Sub {name!r}: {what} map Keys to Keys, got {child!r}: {parent!r}")
        values: list[tuple[Key[Any], Any]] = []
        for key, value in (fixed or {}).items():
            if not isinstance(key, Key):
                raise TypeError(f"Sub {name!r}: fixed values are given per Key, got {key!r}")
            if key.is_stream:
                problem = f"Sub {name!r} fixes stream {key!r}; a stream is wired, never a fixed value"
                raise GraphError(problem, problems=(problem,))
            try:
                copy, _ = codec_for(key.type).prepare(value, what=f"fixed {key!r} of Sub {name!r}")
            except PayloadTypeError as exc:
                raise GraphError(str(exc), problems=(str(exc),)) from None
            values.append((key, copy))
        mount = SubDef(
            name,
            graph,
            tuple(wiring["inlets"].items()),
            tuple(wiring["outlets"].items()),
            tuple(values),
            _aspects(aspects, name),
            bool(without_aspects),
        )
        self._members.append(mount)
        return mount

    # -- checks ----------------------------------------------------------------------------

    def validate(self, *, checkpoint: bool = False) -> None:
        """Check the whole tree; :class:`GraphError` lists every problem, each with its mount path.

        Besides the structure, every stream must have a reader somewhere in
        the tree (a child graph whose stream is read only by its parent
        passes :meth:`topology`, not this, when checked alone), except the
        root's declared ``outlets``, which await a host reader; a stream
        input of the root is written by the host
        (:meth:`~streams.Execution.host_writer`).

        ``checkpoint=True`` also refuses what only checkpoint mode cannot run
        (``Execution(..., checkpoint=...)`` checks it): a cycle through a Sub
        mount's commit. There a mount publishes an outlet of an ordinary value
        only once its record is committed, after its whole child finished, so
        a node that waits for that outlet cannot feed an inlet the child's
        nodes wait for, directly or through other nodes or nested mounts.
        Ordinary mode publishes outlets as the child sets them and runs such a
        graph. Stream outlets are handed on live in both modes.
        """
        structural, problems = self._check()
        if checkpoint and not structural:
            problems = (*problems, *self._checkpoint_check())
        self._raise(problems)

    def _check(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(structural problems, all problems), computed once per shape of the tree."""
        changes = self._changes()
        if self._checked is None or self._checked[0] != changes:
            plans = _stream_plans(self)
            self._plans = plans
            structural = (*_problems(self, ()), *_outlet_problems(self))
            self._checked = (changes, structural, None)
            self._all_problems = (*structural, *_stream_problems(plans, self.outlets))
            self._checkpoint_problems = None
        return self._checked[1], self._all_problems

    def _checkpoint_check(self) -> tuple[str, ...]:
        """The problems only checkpoint mode has, of the structurally sound tree (after :meth:`_check`)."""
        if self._checkpoint_problems is None:
            self._checkpoint_problems = tuple(_commit_cycles(self, (), _Waits(checkpoint=True)))
        return self._checkpoint_problems

    def _raise(self, problems: tuple[str, ...]) -> None:
        if problems:
            more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
            listed = "; ".join(problems[:10]) + more
            raise GraphError(f"graph {self.name!r} cannot run: {listed}", problems=tuple(problems))

    def topology(self) -> Topology:
        """The structurally valid graph's nodes, producers first, and its structural fingerprint."""
        self._raise(self._check()[0])
        assert self._checked is not None
        changes, problems, topology = self._checked
        if topology is None:
            topology = _topology(self)
            self._checked = (changes, problems, topology)
        return topology

    def stream_plans(self) -> Mapping[tuple[tuple[str, ...], str], StreamPlan]:
        """Every stream of the validated tree by each of its aliases (level path, key name)."""
        self.validate()
        return self._plans

    def has_streams(self) -> bool:
        """Whether any node of the tree writes or reads a stream."""
        for member in self._members:
            if any(key.is_stream for key in (*member.requires, *member.provides)):
                return True
            if isinstance(member, SubDef) and member.graph.has_streams():
                return True
        return False

    def checkpoint_nodes(self) -> tuple[NodeSpec, ...]:
        """Every node of the tree with its mount path and ports (a fresh copy each call)."""
        return tuple(_node_specs(self, ()))

    def checkpoint_ports(self) -> tuple[PortSpec, ...]:
        """Every declared port of the tree, used or not, pass-through ports included (a fresh copy)."""
        return tuple(_port_specs(self, ()))


def members_of(graph: Graph) -> Sequence[Member]:
    """The nodes and Sub mounts of ``graph``, in the order they were added (the engine runs them)."""
    return graph._members


def _keys(keys: Iterable[Key[Any]], what: str) -> tuple[Key[Any], ...]:
    found = tuple(keys)
    for key in found:
        if not isinstance(key, Key):
            raise TypeError(f"{what}: expected Keys, got {key!r}")
    return found


def _aspects(aspects: Iterable[Aspect], name: str) -> tuple[Aspect, ...]:
    found = tuple(aspects)
    for aspect in found:
        if not callable(aspect):
            raise TypeError(f"node {name!r}: an aspect is an async callable (ctx, proceed), got {aspect!r}")
    return found


def _where(path: tuple[str, ...]) -> str:
    return "/".join(path) + ": " if path else ""


def _problems(graph: Graph, path: tuple[str, ...]) -> Iterator[str]:
    at = _where(path)
    names: set[str] = set()
    producers: dict[Key[Any], str] = {}
    for key in graph.inputs:
        if key in producers:
            yield f"{at}input {key!r} is declared twice"
        producers[key] = "the graph's inputs"
    for member in graph._members:
        if member.name in names:
            yield f"{at}two nodes are named {member.name!r}"
        names.add(member.name)
        for what, keys in (("requires", member.requires), ("provides", member.provides)):
            if len(set(keys)) != len(keys):
                yield f"{at}node {member.name!r} {what} a key twice"
        for key in member.provides:
            other = producers.get(key)
            if other is not None:
                yield f"{at}key {key!r} has two producers: {other} and node {member.name!r}"
            else:
                producers[key] = f"node {member.name!r}"
        if isinstance(member, NodeDef):  # a Sub mount's wiring is followed through its child instead
            for key in set(member.requires) & set(member.provides):
                yield f"{at}node {member.name!r} requires and provides {key!r}: a cycle"
        if isinstance(member, SubDef):
            yield from _sub_problems(member, path)
    named = {key.name: key for key in producers}
    for member in graph._members:
        for key in member.requires:
            if key in producers:
                continue
            similar = named.get(key.name)
            if similar is not None:
                differ = "types" if similar.type != key.type else "partitions"
                yield (
                    f"{at}node {member.name!r} requires {key!r}, but {producers[similar]} provides "
                    f"{similar!r}: the {differ} differ"
                )
            else:
                yield (
                    f"{at}node {member.name!r} requires {key!r}, which no node provides and which is not "
                    f"an input of graph {graph.name!r}"
                )
    yield from _cycles(graph, at)


def _outlet_problems(graph: Graph) -> Iterator[str]:
    """A declared outlet is a stream a node of the graph (not a child) writes or a Sub exposes."""
    provided = {key for member in graph._members for key in member.provides}
    for key in graph.outlets:
        if not key.is_stream:
            yield f"outlet {key!r} of graph {graph.name!r} is not a stream: only streams have host readers"
        elif key not in provided:
            yield f"outlet {key!r} of graph {graph.name!r} is provided by no node of the graph"
    if len(set(graph.outlets)) != len(graph.outlets):
        yield f"graph {graph.name!r} declares an outlet twice"


def _sub_problems(mount: SubDef, path: tuple[str, ...]) -> Iterator[str]:
    at, child = _where(path), mount.graph
    inner = (*path, mount.name)
    child_inputs = set(child.inputs)
    child_provided = {key for member in child._members for key in member.provides}
    wired: dict[Key[Any], str] = {}
    for key, parent in mount.inlets:
        if key not in child_inputs:
            yield f"{at}Sub {mount.name!r} wires inlet {key!r}, which is not an input of graph {child.name!r}"
        if key.type != parent.type:
            yield (
                f"{at}Sub {mount.name!r} wires {parent!r} to {key!r}: the types differ "
                f"({type_name(parent.type)} into {type_name(key.type)})"
            )
        elif key.partitions != parent.partitions:
            yield (
                f"{at}Sub {mount.name!r} wires {parent!r} to {key!r}: the partitions differ "
                f"({_partitions(parent)} into {_partitions(key)})"
            )
        if key in wired:
            yield f"{at}Sub {mount.name!r} wires {key!r} twice"
        wired[key] = "inlet"
    for key, _ in mount.fixed:
        if key not in child_inputs:
            yield f"{at}Sub {mount.name!r} fixes {key!r}, which is not an input of graph {child.name!r}"
        if key in wired:
            yield f"{at}Sub {mount.name!r} both wires and fixes {key!r}"
        wired[key] = "fixed"
    for key in child.inputs:
        if key not in wired:
            yield (
                f"{at}Sub {mount.name!r}: input {key!r} of graph {child.name!r} is neither wired by an "
                "inlet nor fixed, so nothing produces it"
            )
    for key, parent in mount.outlets:
        if key not in child_provided and key not in child_inputs:
            yield f"{at}Sub {mount.name!r} exposes {key!r}, which graph {child.name!r} does not provide"
        if key.type != parent.type:
            yield (
                f"{at}Sub {mount.name!r} exposes {key!r} as {parent!r}: the types differ "
                f"({type_name(key.type)} into {type_name(parent.type)})"
            )
        elif key.partitions != parent.partitions:
            yield (
                f"{at}Sub {mount.name!r} exposes {key!r} as {parent!r}: the partitions differ "
                f"({_partitions(key)} into {_partitions(parent)})"
            )
    yield from _problems(child, inner)


def _partitions(key: Key[Any]) -> str:
    return "not partitioned" if key.partitions is None else f"{key.partitions} partitions"


def _stream_problems(
    plans: Mapping[tuple[tuple[str, ...], str], StreamPlan], outlets: tuple[Key[Any], ...]
) -> Iterator[str]:
    seen: set[int] = set()
    exported = {id(plans[((), key.name)]) for key in outlets if ((), key.name) in plans}
    for plan in plans.values():
        if id(plan) in seen or plan.groups or id(plan) in exported:
            continue
        seen.add(id(plan))
        if plan.writer is not None:
            yield (
                f"{_where(plan.path)}node {plan.writer.name!r} writes stream {plan.key!r}, which no node "
                "reads: add a node that requires it (its messages wait for every reader), or declare it "
                "among the root graph's outlets for a host to read"
            )
        elif plan.path == ():
            yield (
                f"the host writes stream {plan.key!r}, an input of the root graph, which no node reads: "
                "add a node that requires it"
            )


class _Waits:
    """What each key of a graph in the tree waits for before it is published, in one mode.

    In ordinary mode a Sub's outlet is published as the child sets it, so it
    waits only for the inlets its child key is computed from. In checkpoint
    mode an outlet of an ordinary value is published only once the mount's
    complete record is committed, which comes after every node of its child
    finished: it waits for every inlet the child's nodes wait for
    (:meth:`completion`). A stream outlet is handed on live in both modes (its
    endpoint, as soon as its source opens it), so it waits as in ordinary
    mode. A node's outputs wait for its required keys in both.

    One instance memoizes the graphs and mounts it has seen (a graph holds
    the same waits wherever it is mounted).
    """

    def __init__(self, *, checkpoint: bool) -> None:
        self.checkpoint = checkpoint
        self._dependencies: dict[int, dict[Key[Any], set[Key[Any]]]] = {}
        self._closures: dict[int, dict[Key[Any], set[Key[Any]]]] = {}
        self._completions: dict[SubDef, dict[Key[Any], tuple[tuple[str, ...], Key[Any]]]] = {}

    def dependencies(self, graph: Graph) -> dict[Key[Any], set[Key[Any]]]:
        """For each key a member provides, the keys of the same graph it waits for."""
        found = self._dependencies.get(id(graph))
        if found is not None:
            return found
        deps: dict[Key[Any], set[Key[Any]]] = {}
        for member in graph._members:
            if isinstance(member, NodeDef):
                for key in member.provides:
                    deps.setdefault(key, set()).update(member.requires)
                continue
            inner = self.closure(member.graph)
            inlet_of = dict(member.inlets)
            for child_key, parent in member.outlets:
                if self.checkpoint and not parent.is_stream:  # published with the mount's record
                    deps.setdefault(parent, set()).update(self.completion(member))
                    continue
                needed = inner.get(child_key, set()) | ({child_key} if child_key in inlet_of else set())
                deps.setdefault(parent, set()).update(inlet_of[k] for k in needed if k in inlet_of)
        self._dependencies[id(graph)] = deps
        return deps

    def closure(self, graph: Graph) -> dict[Key[Any], set[Key[Any]]]:
        """For each key of ``graph``, the inputs of ``graph`` it waits for, transitively (a sound graph)."""
        known = self._closures.get(id(graph))
        if known is not None:
            return known
        deps = self.dependencies(graph)
        inputs = set(graph.inputs)
        found: dict[Key[Any], set[Key[Any]]] = {}

        def visit(key: Key[Any], seen: frozenset[Key[Any]]) -> set[Key[Any]]:
            if key in found:
                return found[key]
            result: set[Key[Any]] = {key} & inputs
            for dep in deps.get(key, ()):
                if dep not in seen:
                    result |= visit(dep, seen | {dep})
            found[key] = result
            return result

        for key in deps:
            visit(key, frozenset({key}))
        self._closures[id(graph)] = found
        return found

    def completion(self, mount: SubDef) -> dict[Key[Any], tuple[tuple[str, ...], Key[Any]]]:
        """The keys of the mount's graph that must arrive before the mount can conclude (checkpoint mode).

        Each maps to the first node found that waits for it (its path from
        the mount's graph: ``("mount", "node")``, deeper through nested
        mounts; just the mount for a stream it passes through, whose source
        its record names) and the inlet it comes in through.
        """
        known = self._completions.get(mount)
        if known is not None:
            return known
        child = mount.graph
        closure = self.closure(child)
        inputs = set(child.inputs)
        waiting: dict[Key[Any], tuple[str, ...]] = {}  # child input -> who waits for it

        def wait_for(key: Key[Any], who: tuple[str, ...]) -> None:
            for needed in sorted(closure.get(key, {key} & inputs), key=lambda k: k.name):
                waiting.setdefault(needed, who)

        for member in child._members:
            if isinstance(member, NodeDef):
                for key in member.requires:
                    wait_for(key, (mount.name, member.name))
            else:
                for key, (who, _) in self.completion(member).items():
                    wait_for(key, (mount.name, *who))
        for child_key, parent in mount.outlets:
            if parent.is_stream:  # its record names the stream's source: it waits for the endpoint
                wait_for(child_key, (mount.name,))
        inlet_of = dict(mount.inlets)
        found = {inlet_of[key]: (who, key) for key, who in waiting.items() if key in inlet_of}
        self._completions[mount] = found
        return found


def _loops(graph: Graph, deps: Mapping[Key[Any], set[Key[Any]]]) -> Iterator[list[Key[Any]]]:
    """Each cycle of ``deps`` (keys, each waiting for the next, back to the first), once per member set."""
    producer = {key: member.name for member in graph._members for key in member.provides}
    state: dict[Key[Any], int] = {}  # 1: on the current path, 2: done
    reported: set[frozenset[str]] = set()

    def visit(key: Key[Any], trail: list[Key[Any]]) -> Iterator[list[Key[Any]]]:
        state[key] = 1
        trail.append(key)
        for dep in sorted(deps.get(key, ()), key=lambda k: k.name):
            if state.get(dep) == 1:
                loop = [*trail[trail.index(dep) :], dep]
                members = frozenset(producer.get(k, "") for k in loop)
                if members not in reported:
                    reported.add(members)
                    yield loop
            elif dep not in state:
                yield from visit(dep, trail)
        trail.pop()
        state[key] = 2

    for key in sorted(deps, key=lambda k: k.name):
        if key not in state:
            yield from visit(key, [])


def _cycles(graph: Graph, at: str) -> Iterator[str]:
    producer = {key: member.name for member in graph._members for key in member.provides}
    for loop in _loops(graph, _Waits(checkpoint=False).dependencies(graph)):
        steps = " <- ".join(f"{k.name} ({producer.get(k, 'input')})" for k in loop)
        yield f"{at}cycle: {steps}"


def _commit_cycles(graph: Graph, path: tuple[str, ...], waits: _Waits) -> Iterator[str]:
    """The cycles only checkpoint mode has (of a structurally sound tree): through a mount's commit.

    Such a cycle leaves the mount through an outlet of an ordinary value and
    comes back into it through an inlet one of its nodes waits for, directly
    or through other nodes and mounts. Ordinary mode runs it (the outlet is
    published as the child sets it); checkpoint mode would wait forever.
    """
    if not any(isinstance(member, SubDef) for member in graph._members):
        return  # only a mount waits otherwise in checkpoint mode: its waits are the ordinary ones
    at = _where(path)
    producer = {key: member for member in graph._members for key in member.provides}
    ordinary = _Waits(checkpoint=False).dependencies(graph)

    def why(key: Key[Any], dep: Key[Any]) -> str:
        """Why ``key`` waits for ``dep`` in checkpoint mode only; "" if it waits so in both modes."""
        mount = producer[key]
        if not isinstance(mount, SubDef):
            return ""
        if not key.is_stream:
            who, inlet = waits.completion(mount)[dep]
            return (
                f"Sub {mount.name!r} publishes outlet {key.name} only once its record is committed, after "
                f"its child finished, and {'/'.join(who)!r} waits for {dep.name} (inlet {inlet.name})"
            )
        if dep in ordinary.get(key, ()):
            return ""
        child_key = next(c for c, p in mount.outlets if p == key)
        reached = waits.closure(mount.graph).get(child_key, {child_key})
        inlet = next(c for c, p in sorted(mount.inlets, key=lambda i: i[0].name) if p == dep and c in reached)
        return (
            f"Sub {mount.name!r} opens stream outlet {key.name} only after a mount inside it committed, "
            f"which waits for {dep.name} (inlet {inlet.name})"
        )

    for loop in _loops(graph, waits.dependencies(graph)):
        edges = [(key, dep, why(key, dep)) for key, dep in pairwise(loop)]
        # the tree has no cycle in ordinary mode, so some edge of this one waits in checkpoint mode only
        first = next(i for i, (_, _, reason) in enumerate(edges) if reason)
        edges = [*edges[first:], *edges[:first]]  # told from there
        steps: list[str] = []
        for key, _, _ in edges:
            member = producer[key]
            kind = "node" if isinstance(member, NodeDef) else "Sub"
            commit = ", at its commit" if kind == "Sub" and not key.is_stream else ""
            steps.append(f"{key.name} ({kind} {member.name!r}{commit})")
        steps.append(edges[0][0].name)
        reasons = "; ".join(reason for _, _, reason in edges if reason)
        mounts = " and ".join(dict.fromkeys(repr(producer[key].name) for key, _, reason in edges if reason))
        yield (
            f"{at}checkpoint mode cannot run the cycle {' <- '.join(steps)}: {reasons}. Ordinary mode runs "
            "it, publishing each outlet as the child sets it; for checkpoint mode, break the cycle: feed "
            f"the inlet from outside it, or split {mounts} so that what the cycle needs from it comes "
            "from another Sub"
        )
    for member in graph._members:
        if isinstance(member, SubDef):
            yield from _commit_cycles(member.graph, (*path, member.name), waits)


def _ordered(graph: Graph) -> list[Member]:
    producer = {key: member for member in graph._members for key in member.provides}
    placed: list[Member] = []
    seen: set[str] = set()

    def place(member: Member) -> None:
        if member.name in seen:
            return
        seen.add(member.name)
        for key in member.requires:
            before = producer.get(key)
            if before is not None:
                place(before)
        placed.append(member)

    for member in graph._members:
        place(member)
    return placed


def _topology(graph: Graph) -> Topology:
    producer = {key: member.name for member in graph._members for key in member.provides}
    nodes = tuple(
        TopologyNode(
            member.name,
            "node" if isinstance(member, NodeDef) else "sub",
            tuple(k.name for k in member.requires),
            tuple(k.name for k in member.provides),
            tuple(sorted({producer[k] for k in member.requires if k in producer})),
            _topology(member.graph) if isinstance(member, SubDef) else None,
        )
        for member in _ordered(graph)
    )
    inputs = tuple(k.name for k in graph.inputs)
    names = _OncePerType(type_name)
    shape = _shape(graph, names)
    fingerprint = _fingerprint(shape)
    if names.same_as(qualified_type_name):  # every port type is named alike both ways: the same shape
        return Topology(graph.name, graph.version, inputs, nodes, fingerprint, shape, fingerprint, shape)
    legacy = _shape(graph, _OncePerType(qualified_type_name))
    return Topology(
        graph.name, graph.version, inputs, nodes, fingerprint, shape, _fingerprint(legacy), legacy
    )


class _OncePerType:
    """A naming of types asked once per type of one topology: a graph's ports share a few types."""

    def __init__(self, name: Callable[[Any], str]) -> None:
        self._name = name
        self._named: dict[Any, str] = {}
        self._unhashable = False

    def __call__(self, tp: Any) -> str:
        try:
            return self._named[tp]
        except KeyError:
            found = self._named[tp] = self._name(tp)
            return found
        except TypeError:  # an unhashable annotation: named each time
            self._unhashable = True
            return self._name(tp)

    def same_as(self, other: Callable[[Any], str]) -> bool:
        """Whether ``other`` names every type this one named as it did (then a shape is the same)."""
        return not self._unhashable and all(other(tp) == named for tp, named in self._named.items())


def _fingerprint(shape: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def _shape(graph: Graph, name: Callable[[Any], str]) -> dict[str, Any]:
    """What the fingerprint digests, each port's type named by ``name``."""

    def ports(keys: Sequence[Key[Any]]) -> list[list[str]]:
        return sorted([k.name, _port_type(k, name)] for k in keys)

    members: list[dict[str, Any]] = []
    for member in graph._members:
        shape: dict[str, Any] = {"name": member.name, "requires": ports(member.requires)}
        shape["provides"] = ports(member.provides)
        if isinstance(member, SubDef):
            shape["graph"] = _shape(member.graph, name)
            shape["inlets"] = sorted([c.name, p.name] for c, p in member.inlets)
            shape["outlets"] = sorted([c.name, p.name] for c, p in member.outlets)
            shape["fixed"] = sorted(k.name for k, _ in member.fixed)
        members.append(shape)
    members.sort(key=lambda m: str(m["name"]))
    shape = {"name": graph.name, "version": graph.version, "inputs": ports(graph.inputs), "members": members}
    if graph.outlets:  # only when declared: the fingerprints of graphs without host readers stay as they were
        shape["outlets"] = ports(graph.outlets)
    return shape


def _port_type(key: Key[Any], name: Callable[[Any], str]) -> str:
    """A port's type in the fingerprint: a partitioned stream's with its partitions (others as they were)."""
    named = name(key.type)
    return named if key.partitions is None else f"{named} in {key.partitions} partitions"


def _node_specs(graph: Graph, path: tuple[str, ...]) -> Iterator[NodeSpec]:
    for member in graph._members:
        kind: Literal["node", "sub"] = "node" if isinstance(member, NodeDef) else "sub"
        yield NodeSpec(
            path,
            member.name,
            kind,
            tuple((k.name, k.type) for k in member.requires),
            tuple((k.name, k.type) for k in member.provides),
        )
        if isinstance(member, SubDef):
            yield from _node_specs(member.graph, (*path, member.name))


def _port_specs(graph: Graph, path: tuple[str, ...]) -> Iterator[PortSpec]:
    def port(node: str, role: Any, key: Key[Any]) -> PortSpec:
        return PortSpec(path, node, role, key.name, key.type, type_name(key.type))

    for key in graph.inputs:
        yield port("", "input", key)
    for member in graph._members:
        if isinstance(member, NodeDef):
            for key in member.requires:
                yield port(member.name, "requires", key)
            for key in member.provides:
                yield port(member.name, "provides", key)
            continue
        for _, parent in member.inlets:
            yield port(member.name, "inlet", parent)
        for _, parent in member.outlets:
            yield port(member.name, "outlet", parent)
        for key, _ in member.fixed:
            yield port(member.name, "fixed", key)
        yield from _port_specs(member.graph, (*path, member.name))


def _stream_plans(root: Graph) -> dict[Alias, StreamPlan]:
    """Every alias of every stream of the tree, mapped to the stream's plan."""
    parent: dict[Alias, Alias] = {}

    def find(alias: Alias) -> Alias:
        while parent.setdefault(alias, alias) != alias:
            parent[alias] = parent[parent[alias]]
            alias = parent[alias]
        return alias

    writers: dict[Alias, tuple[tuple[str, ...], NodeDef, Key[Any]]] = {}
    readers: dict[Alias, list[str]] = {}
    keys: dict[Alias, Key[Any]] = {}
    for path, graph in _levels(root, ()):
        for key in graph.inputs:
            if key.is_stream:
                keys[(path, key.name)] = key
                find((path, key.name))
        for member in graph._members:
            if isinstance(member, NodeDef):
                for key in member.requires:
                    if key.is_stream:
                        readers.setdefault((path, key.name), []).append("/".join((*path, member.name)))
                        keys[(path, key.name)] = key
                        find((path, key.name))
                for key in member.streams:
                    writers[(path, key.name)] = (path, member, key)
                    keys[(path, key.name)] = key
                    find((path, key.name))
                continue
            inner = (*path, member.name)
            for child, outer in (*member.inlets, *member.outlets):
                if child.is_stream and outer.is_stream:
                    keys.setdefault((path, outer.name), outer)
                    keys.setdefault((inner, child.name), child)
                    parent[find((inner, child.name))] = find((path, outer.name))
    members: dict[Alias, list[Alias]] = {}
    for alias in list(parent):
        members.setdefault(find(alias), []).append(alias)
    plans: dict[Alias, StreamPlan] = {}
    for aliases in members.values():
        written = [writers[a] for a in aliases if a in writers]
        groups = tuple(group for a in sorted(aliases) for group in readers.get(a, ()))
        if written:
            path, writer, key = written[0]
            plan = StreamPlan(path, writer, key, groups)
        else:
            first = min(aliases)
            plan = StreamPlan(first[0], None, keys[first], groups)
        for alias in aliases:
            plans[alias] = plan
    return plans


def _levels(graph: Graph, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Graph]]:
    yield path, graph
    for member in graph._members:
        if isinstance(member, SubDef):
            yield from _levels(member.graph, (*path, member.name))
