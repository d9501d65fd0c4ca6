"""Graph definitions: validate() finds every problem with its place, topology() and the checkpoint copies."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from streams import Graph, GraphError, Key, NodeContext, NodeSpec, PortSpec, Stream
from streams._graph import _fingerprint, _shape
from streams._type_names import qualified_type_name

URL = Key("url", str)
PAGE = Key("page", str)
TEXT = Key("text", str)
SUMMARY = Key("summary", str)
LANG = Key("lang", str)
FIRST_URL = Key("first_url", str)
FIRST_SUMMARY = Key("first_summary", str)


async def noop(ctx: NodeContext) -> None:
    pass


def doc_graph() -> Graph:
    doc = Graph("doc", version="1", inputs=[URL, LANG])
    doc.add_node("download", noop, requires=[URL], provides=[PAGE])
    doc.add_node("extract", noop, requires=[PAGE], provides=[TEXT])
    doc.add_node("summarize", noop, requires=[TEXT, LANG], provides=[SUMMARY])
    return doc


def pipeline_graph(doc: Graph | None = None) -> Graph:
    pipeline = Graph("pipeline", version="1", inputs=[FIRST_URL])
    pipeline.sub(
        "first",
        doc or doc_graph(),
        inlets={URL: FIRST_URL},
        outlets={SUMMARY: FIRST_SUMMARY},
        fixed={LANG: "en"},
    )
    return pipeline


def problems_of(graph: Graph, *, checkpoint: bool = False) -> tuple[str, ...]:
    with pytest.raises(GraphError) as caught:
        graph.validate(checkpoint=checkpoint)
    return caught.value.problems


def test_a_sound_tree_validates_and_orders_producers_first() -> None:
    pipeline = pipeline_graph()
    pipeline.validate()
    topology = pipeline.topology()
    [first] = topology.nodes
    assert (first.name, first.kind, first.requires, first.provides) == (
        "first",
        "sub",
        ("first_url",),
        ("first_summary",),
    )
    assert first.child is not None
    assert [(n.name, n.after) for n in first.child.nodes] == [
        ("download", ()),
        ("extract", ("download",)),
        ("summarize", ("extract",)),
    ]


def test_topology_lists_a_node_after_its_producers_whatever_the_order_they_were_added() -> None:
    g = Graph("g", inputs=[URL])
    g.add_node("summarize", noop, requires=[TEXT], provides=[SUMMARY])
    g.add_node("extract", noop, requires=[PAGE], provides=[TEXT])
    g.add_node("download", noop, requires=[URL], provides=[PAGE])
    assert [n.name for n in g.topology().nodes] == ["download", "extract", "summarize"]


def test_a_missing_producer_names_the_node_the_key_and_the_graph() -> None:
    g = Graph("g", inputs=[URL])
    g.add_node("extract", noop, requires=[PAGE], provides=[TEXT])
    assert problems_of(g) == (
        "node 'extract' requires Key('page', str), which no node provides and which is not an input "
        "of graph 'g'",
    )


def test_two_producers_of_one_key_are_refused() -> None:
    g = Graph("g", inputs=[URL])
    g.add_node("a", noop, requires=[URL], provides=[PAGE])
    g.add_node("b", noop, requires=[URL], provides=[PAGE])
    assert problems_of(g) == ("key Key('page', str) has two producers: node 'a' and node 'b'",)
    h = Graph("h", inputs=[URL])
    h.add_node("a", noop, provides=[URL])
    assert problems_of(h) == ("key Key('url', str) has two producers: the graph's inputs and node 'a'",)


def test_a_cycle_is_named_with_its_keys_and_nodes() -> None:
    g = Graph("g")
    g.add_node("a", noop, requires=[TEXT], provides=[PAGE])
    g.add_node("b", noop, requires=[PAGE], provides=[TEXT])
    [problem] = problems_of(g)
    assert problem.startswith("cycle: ")
    assert "page (a)" in problem and "text (b)" in problem
    own = Graph("own")
    own.add_node("a", noop, requires=[PAGE], provides=[PAGE])
    assert "node 'a' requires and provides Key('page', str): a cycle" in problems_of(own)


def test_a_key_required_with_another_type_is_a_type_mismatch() -> None:
    g = Graph("g", inputs=[URL])
    g.add_node("a", noop, requires=[URL], provides=[PAGE])
    g.add_node("b", noop, requires=[Key("page", bytes)], provides=[TEXT])
    assert problems_of(g) == (
        "node 'b' requires Key('page', bytes), but node 'a' provides Key('page', str): the types differ",
    )


def test_wiring_across_a_sub_is_checked_port_by_port() -> None:
    parent = Graph("parent", inputs=[Key("n", int)])
    parent.sub(
        "first",
        doc_graph(),
        inlets={URL: Key("n", int), PAGE: Key("n", int)},
        outlets={SUMMARY: Key("total", int), Key("nothing", str): Key("other", str)},
    )
    assert problems_of(parent) == (
        "Sub 'first' wires Key('n', int) to Key('url', str): the types differ (int into str)",
        "Sub 'first' wires inlet Key('page', str), which is not an input of graph 'doc'",
        "Sub 'first' wires Key('n', int) to Key('page', str): the types differ (int into str)",
        "Sub 'first': input Key('lang', str) of graph 'doc' is neither wired by an inlet nor fixed, so "
        "nothing produces it",
        "Sub 'first' exposes Key('summary', str) as Key('total', int): the types differ (str into int)",
        "Sub 'first' exposes Key('nothing', str), which graph 'doc' does not provide",
    )


def test_a_fixed_value_is_read_back_as_its_key_type_when_mounted() -> None:
    parent = Graph("parent", inputs=[FIRST_URL])
    with pytest.raises(GraphError, match="fixed Key\\('lang', str\\) of Sub 'first' takes str"):
        parent.sub("first", doc_graph(), inlets={URL: FIRST_URL}, fixed={LANG: 7})
    both = Graph("both", inputs=[FIRST_URL, Key("lang", str)])
    both.sub("first", doc_graph(), inlets={URL: FIRST_URL, LANG: LANG}, fixed={LANG: "en"})
    assert problems_of(both) == ("Sub 'first' both wires and fixes Key('lang', str)",)


def test_problems_inside_a_sub_carry_its_mount_path_and_all_are_listed() -> None:
    broken = Graph("doc", inputs=[URL])
    broken.add_node("extract", noop, requires=[PAGE], provides=[TEXT])
    broken.add_node("extract", noop, requires=[URL], provides=[SUMMARY])
    outer = Graph("outer", inputs=[FIRST_URL])
    outer.sub("first", broken, inlets={URL: FIRST_URL})
    outer.sub("first", broken, inlets={URL: FIRST_URL})
    problems = problems_of(outer)
    assert "two nodes are named 'first'" in problems
    assert problems.count("first: two nodes are named 'extract'") == 2
    assert any(p.startswith("first: node 'extract' requires Key('page', str)") for p in problems)
    with pytest.raises(GraphError, match=r"graph 'outer' cannot run: .*first: two nodes"):
        outer.validate()


def test_a_cycle_through_a_sub_is_found_and_independent_wiring_is_not_one() -> None:
    child = Graph("child", inputs=[URL, LANG])
    child.add_node("echo", noop, requires=[URL], provides=[PAGE])
    child.add_node("other", noop, requires=[LANG], provides=[TEXT])
    # page depends on url only: feeding lang from page is no cycle
    fine = Graph("fine", inputs=[FIRST_URL])
    fine.sub(
        "c", child, inlets={URL: FIRST_URL, LANG: Key("page_out", str)}, outlets={PAGE: Key("page_out", str)}
    )
    fine.validate()
    # text depends on lang: feeding lang from text is one
    looped = Graph("looped", inputs=[FIRST_URL])
    looped.sub(
        "c", child, inlets={URL: FIRST_URL, LANG: Key("text_out", str)}, outlets={TEXT: Key("text_out", str)}
    )
    [problem] = problems_of(looped)
    assert problem == "cycle: text_out (c) <- text_out (c)"


def echo_and_other() -> Graph:
    """page comes from url alone, text from lang alone."""
    child = Graph("child", inputs=[URL, LANG])
    child.add_node("echo", noop, requires=[URL], provides=[PAGE])
    child.add_node("other", noop, requires=[LANG], provides=[TEXT])
    return child


def test_a_mounts_outlet_fed_back_into_its_inlet_is_refused_for_checkpoint_mode_only() -> None:
    # page depends on url only, so ordinary mode publishes it while lang still waits; in checkpoint
    # mode page waits for the mount's commit, which waits for "other", which waits for lang
    direct = Graph("direct", inputs=[FIRST_URL])
    direct.sub(
        "c",
        echo_and_other(),
        inlets={URL: FIRST_URL, LANG: Key("page_out", str)},
        outlets={PAGE: Key("page_out", str)},
    )
    direct.validate()
    assert problems_of(direct, checkpoint=True) == (
        "checkpoint mode cannot run the cycle page_out (Sub 'c', at its commit) <- page_out: Sub 'c' "
        "publishes outlet page_out only once its record is committed, after its child finished, and "
        "'c/other' waits for page_out (inlet lang). Ordinary mode runs it, publishing each outlet as the "
        "child sets it; for checkpoint mode, break the cycle: feed the inlet from outside it, or split 'c' "
        "so that what the cycle needs from it comes from another Sub",
    )
    through_a_node = Graph("through_a_node", inputs=[FIRST_URL])
    through_a_node.sub("c", echo_and_other(), inlets={URL: FIRST_URL, LANG: LANG}, outlets={PAGE: PAGE})
    through_a_node.add_node("detect", noop, requires=[PAGE], provides=[LANG])
    through_a_node.validate()
    [problem] = problems_of(through_a_node, checkpoint=True)
    assert problem.startswith(
        "checkpoint mode cannot run the cycle page (Sub 'c', at its commit) <- lang (node 'detect') <- page: "
        "Sub 'c' publishes outlet page only once its record is committed, after its child finished, and "
        "'c/other' waits for lang (inlet lang)."
    )
    outer = Graph("outer")  # mounted, it is found with its mount path
    outer.sub("inner", through_a_node, fixed={FIRST_URL: "x"})
    [problem] = problems_of(outer, checkpoint=True)
    assert problem.startswith("inner: checkpoint mode cannot run the cycle page (Sub 'c', at its commit)")
    outer.validate()


def test_a_cycle_through_a_mounts_commit_is_found_through_other_nodes_and_nested_mounts() -> None:
    # through two nodes of the parent graph
    chained = Graph("chained", inputs=[FIRST_URL])
    chained.sub("c", echo_and_other(), inlets={URL: FIRST_URL, LANG: LANG}, outlets={PAGE: PAGE})
    chained.add_node("read", noop, requires=[PAGE], provides=[SUMMARY])
    chained.add_node("detect", noop, requires=[SUMMARY], provides=[LANG])
    [problem] = problems_of(chained, checkpoint=True)
    assert problem.startswith(
        "checkpoint mode cannot run the cycle page (Sub 'c', at its commit) <- lang (node 'detect') <- "
        "summary (node 'read') <- page: "
    )
    # into a mount nested in the mount: its node waits, two levels down
    nesting = Graph("nesting", inputs=[URL, LANG])
    nesting.add_node("echo", noop, requires=[URL], provides=[PAGE])
    nesting.sub("deeper", echo_and_other(), inlets={URL: URL, LANG: LANG})
    nested = Graph("nested", inputs=[FIRST_URL])
    nested.sub("c", nesting, inlets={URL: FIRST_URL, LANG: LANG}, outlets={PAGE: PAGE})
    nested.add_node("detect", noop, requires=[PAGE], provides=[LANG])
    nested.validate()
    [problem] = problems_of(nested, checkpoint=True)
    assert "and 'c/deeper/other' waits for lang (inlet lang)" in problem
    # out of a mount nested in the mount: the outer mount's outlet still waits for its commit
    exposing = Graph("exposing", inputs=[URL, LANG])
    exposing.sub("deeper", echo_and_other(), inlets={URL: URL, LANG: LANG}, outlets={PAGE: PAGE})
    looped = Graph("looped", inputs=[FIRST_URL])
    looped.sub("c", exposing, inlets={URL: FIRST_URL, LANG: LANG}, outlets={PAGE: PAGE})
    looped.add_node("detect", noop, requires=[PAGE], provides=[LANG])
    looped.validate()
    [problem] = problems_of(looped, checkpoint=True)
    assert "and 'c/deeper/other' waits for lang (inlet lang)" in problem
    # two mounts, each waiting for the other's outlet: both commits named
    pair = Graph("pair", inputs=[FIRST_URL])
    pair.sub(
        "a",
        echo_and_other(),
        inlets={URL: FIRST_URL, LANG: Key("b_page", str)},
        outlets={PAGE: Key("a_page", str)},
    )
    pair.sub(
        "b",
        echo_and_other(),
        inlets={URL: FIRST_URL, LANG: Key("a_page", str)},
        outlets={PAGE: Key("b_page", str)},
    )
    pair.validate()
    [problem] = problems_of(pair, checkpoint=True)
    assert problem.startswith(
        "checkpoint mode cannot run the cycle a_page (Sub 'a', at its commit) <- b_page (Sub 'b', at its "
        "commit) <- a_page: Sub 'a' publishes outlet a_page only once its record is committed, after its "
        "child finished, and 'a/other' waits for b_page (inlet lang); Sub 'b' publishes outlet b_page "
    )
    assert problem.endswith(
        "or split 'a' and 'b' so that what the cycle needs from it comes from another Sub"
    )


ITEMS = Key("items", Stream[str])
ECHOED = Key("echoed", Stream[str])


def test_stream_outlets_are_handed_on_live_so_only_cycles_through_a_commit_are_refused() -> None:
    # the mount's stream comes back into it through a node of the parent: the endpoint is handed on as
    # soon as its writer opens it, so nothing waits for the mount's commit
    child = Graph("child", inputs=[ECHOED, LANG])
    child.add_node("write", noop, provides=[ITEMS])
    child.add_node("read", noop, requires=[ECHOED], provides=[SUMMARY])
    child.add_node("other", noop, requires=[LANG], provides=[TEXT])
    loop = Graph("loop")
    loop.sub("c", child, inlets={ECHOED: ECHOED, LANG: LANG}, outlets={ITEMS: ITEMS})
    loop.add_node("echo", noop, requires=[ITEMS], provides=[ECHOED, LANG])  # a stream and a value
    loop.validate(checkpoint=True)
    # its writer waits for a mount inside, whose commit waits for what the loop brings back
    inner = Graph("inner", inputs=[LANG])
    inner.add_node("detect", noop, provides=[PAGE])
    inner.add_node("use", noop, requires=[LANG], provides=[TEXT])
    writing = Graph("writing", inputs=[LANG])
    writing.sub("deeper", inner, inlets={LANG: LANG}, outlets={PAGE: PAGE})
    writing.add_node("write", noop, requires=[PAGE], provides=[ITEMS])
    nested = Graph("nested")
    nested.sub("c", writing, inlets={LANG: LANG}, outlets={ITEMS: ITEMS})
    nested.add_node("echo", noop, requires=[ITEMS], provides=[LANG])
    nested.validate()
    [problem] = problems_of(nested, checkpoint=True)
    assert problem.startswith(
        "checkpoint mode cannot run the cycle items (Sub 'c') <- lang (node 'echo') <- items: Sub 'c' "
        "opens stream outlet items only after a mount inside it committed, which waits for lang (inlet "
        "lang)."
    )
    # a stream passed through: the mount's record names the stream's source, so it waits for it
    passing = Graph("passing", inputs=[ECHOED, URL])
    passing.add_node("echo", noop, requires=[URL], provides=[PAGE])
    passed = Graph("passed", inputs=[FIRST_URL])
    passed.sub("c", passing, inlets={ECHOED: ECHOED, URL: FIRST_URL}, outlets={ECHOED: ITEMS, PAGE: PAGE})
    passed.add_node("echo", noop, requires=[PAGE], provides=[ECHOED])
    passed.add_node("read", noop, requires=[ITEMS])
    passed.validate()
    [problem] = problems_of(passed, checkpoint=True)
    assert "and 'c' waits for echoed (inlet echoed)" in problem


def test_bad_declarations_are_refused_when_made() -> None:
    g = Graph("g")
    with pytest.raises(ValueError, match="a node name must be"):
        g.add_node("a/b", noop)
    with pytest.raises(TypeError, match="expected Keys"):
        g.add_node("a", noop, requires=["url"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="an aspect is an async callable"):
        g.add_node("a", noop, aspects=[3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="a graph version must be"):
        Graph("g", version="")
    with pytest.raises(TypeError, match="expected a Graph"):
        g.sub("s", "doc")  # type: ignore[arg-type]
    assert g._members == []  # nothing half-added


def test_the_fingerprint_follows_structure_not_fixed_values() -> None:
    base = pipeline_graph().topology().fingerprint
    assert pipeline_graph().topology().fingerprint == base
    other_lang = Graph("pipeline", version="1", inputs=[FIRST_URL])
    other_lang.sub(
        "first", doc_graph(), inlets={URL: FIRST_URL}, outlets={SUMMARY: FIRST_SUMMARY}, fixed={LANG: "de"}
    )
    assert other_lang.topology().fingerprint == base  # the version must change when such semantics do
    retyped = doc_graph()
    retyped.add_node("count", noop, requires=[TEXT], provides=[Key("words", int)])
    assert pipeline_graph(retyped).topology().fingerprint != base
    bumped = Graph("pipeline", version="2", inputs=[FIRST_URL])
    bumped.sub(
        "first", doc_graph(), inlets={URL: FIRST_URL}, outlets={SUMMARY: FIRST_SUMMARY}, fixed={LANG: "en"}
    )
    assert bumped.topology().fingerprint != base


def test_checkpoint_nodes_copy_the_tree_with_mount_paths_and_real_types() -> None:
    class Page(msgspec.Struct):
        html: str

    doc = Graph("doc", inputs=[URL, LANG])
    doc.add_node("download", noop, requires=[URL], provides=[Key("page", Page)])
    pipeline = pipeline_graph(doc)
    nodes = pipeline.checkpoint_nodes()
    assert nodes == (
        NodeSpec((), "first", "sub", (("first_url", str),), (("first_summary", str),)),
        NodeSpec(("first",), "download", "node", (("url", str),), (("page", Page),)),
    )
    assert nodes[1].provides[0][1] is Page  # the real type, to decode with
    doc.add_node("late", noop)
    assert pipeline.checkpoint_nodes() != nodes and len(nodes) == 2  # an earlier copy does not change


def test_checkpoint_ports_include_unused_and_pass_through_ports() -> None:
    child = Graph("child", inputs=[URL, LANG])  # lang is used by no node
    child.add_node("echo", noop, requires=[URL], provides=[PAGE])
    parent = Graph("parent", inputs=[FIRST_URL, Key("unused", int)])
    parent.sub("c", child, inlets={URL: FIRST_URL}, outlets={URL: Key("url_again", str)}, fixed={LANG: "en"})
    parent.validate()
    ports = {(p.path, p.node, p.role, p.key) for p in parent.checkpoint_ports()}
    assert ports == {
        ((), "", "input", "first_url"),
        ((), "", "input", "unused"),
        ((), "c", "inlet", "first_url"),
        ((), "c", "outlet", "url_again"),  # the child's input, passed straight through
        ((), "c", "fixed", "lang"),
        (("c",), "", "input", "url"),
        (("c",), "", "input", "lang"),
        (("c",), "echo", "requires", "url"),
        (("c",), "echo", "provides", "page"),
    }
    assert PortSpec((), "", "input", "unused", int, "int") in parent.checkpoint_ports()


def test_a_graph_is_validated_again_after_a_node_is_added_anywhere_in_its_tree() -> None:
    doc = doc_graph()
    pipeline = pipeline_graph(doc)
    pipeline.validate()
    before = pipeline.topology().fingerprint
    doc.add_node("orphan", noop, requires=[Key("nowhere", int)])  # inside the mounted child
    with pytest.raises(GraphError, match="first: node 'orphan' requires Key\\('nowhere', int\\)"):
        pipeline.validate()
    doc.add_node("source", noop, provides=[Key("nowhere", int)])
    assert pipeline.topology().fingerprint != before


class _Parcel(msgspec.Struct):
    weight: int


@pytest.mark.parametrize("port", [int, list[str], _Parcel, Stream[_Parcel]], ids=repr)
def test_the_legacy_fingerprint_digests_the_shape_with_module_qualified_names(port: Any) -> None:
    """Computed once when every port type is named alike both ways, twice when not: the same answer."""
    inner = Graph("inner", inputs=[Key("a", port)])
    inner.add_node("use", _noop, requires=[Key("a", port)], provides=[Key("b", int)])
    outer = Graph("outer", inputs=[Key("x", port)])
    outer.sub("m", inner, inlets={Key("a", port): Key("x", port)}, outlets={Key("b", int): Key("y", int)})
    outer.add_node("end", _noop, requires=[Key("y", int)], provides=[Key("z", int)])
    topology = outer.topology()
    legacy = _shape(outer, qualified_type_name)
    assert topology.legacy_shape == legacy
    assert topology.legacy_fingerprint == _fingerprint(legacy)
    assert (topology.legacy_fingerprint == topology.fingerprint) == (port in (int, list[str]))


async def _noop(ctx: NodeContext) -> None:
    pass
