"""What differs between the graph a run started with and the one given now: inputs and topology, by name.

A run's record keeps its graph's topology shape (:attr:`streams.Topology.shape`)
and its inputs, encoded. When a resume or a start is given another graph,
or other inputs, these say which node, port, type or input differs, so the
error names it instead of "another topology". A port's type is named by its
shape (``Order{number: int}``); when it changed, the difference says which
type inside it changed and how (``type Order: field 'note' is new``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from streams.store import CheckpointOutput, type_differences

__all__ = ["input_differences", "topology_differences"]

#: The most differences an error lists; the rest are counted.
SHOWN: Final = 5


def listed(differences: Sequence[str]) -> str:
    """``differences`` for an error message: the first few, and how many more."""
    shown = "; ".join(differences[:SHOWN])
    more = len(differences) - SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def input_differences(recorded: Sequence[CheckpointOutput], given: Sequence[CheckpointOutput]) -> list[str]:
    """The inputs whose encoded values differ (never the values: they are business data)."""
    before = {output.key: output for output in recorded}
    now = {output.key: output for output in given}
    found = []
    for name in sorted(before.keys() | now.keys()):
        was, is_ = before.get(name), now.get(name)
        if was is None:
            found.append(f"input {name!r} is new")
        elif is_ is None:
            found.append(f"input {name!r} is gone")
        elif (was.state, was.value) != (is_.state, is_.value):
            if "skipped" in (was.state, is_.state) and was.state != is_.state:
                found.append(f"input {name!r} was {was.state}, is {is_.state}")
            else:
                found.append(f"input {name!r} has another value")
    return found


def topology_differences(recorded: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """What differs between two topology shapes: members, ports and their types, Sub wiring."""
    return list(_graph_differences(recorded, given, ""))


def _graph_differences(before: Mapping[str, Any], now: Mapping[str, Any], at: str) -> Iterator[str]:
    where = f"in Sub {at!r}: " if at else ""
    for field in ("name", "version"):
        if before.get(field) != now.get(field):
            yield f"{where}graph {field} was {before.get(field)!r}, is {now.get(field)!r}"
    for role in ("input", "outlet"):
        found = _port_differences(role, before.get(f"{role}s", []), now.get(f"{role}s", []))
        yield from (where + d for d in found)
    old = {m["name"]: m for m in before.get("members", [])}
    new = {m["name"]: m for m in now.get("members", [])}
    for name in sorted(old.keys() - new.keys()):
        yield f"{where}node {name!r} is gone"
    for name in sorted(new.keys() - old.keys()):
        yield f"{where}node {name!r} is new"
    for name in sorted(old.keys() & new.keys()):
        was, is_ = old[name], new[name]
        for role in ("requires", "provides"):
            found = _port_differences(role, was.get(role, []), is_.get(role, []))
            yield from (f"{where}node {name!r} {d}" for d in found)
        if ("graph" in was) != ("graph" in is_):
            kinds = ["a Sub" if "graph" in m else "a node" for m in (was, is_)]
            yield f"{where}{name!r} was {kinds[0]}, is {kinds[1]}"
            continue
        if "graph" not in was:
            continue
        for wiring in ("inlets", "outlets", "fixed"):
            if was.get(wiring) != is_.get(wiring):
                yield f"{where}Sub {name!r} has other {wiring} (was {was.get(wiring)}, is {is_.get(wiring)})"
        yield from _graph_differences(was["graph"], is_["graph"], f"{at}/{name}" if at else name)


def _port_differences(
    role: str, before: Sequence[Sequence[str]], now: Sequence[Sequence[str]]
) -> Iterator[str]:
    """``role`` (an input, or what a node requires or provides): keys added, removed, or of another type."""
    old = {name: type_ for name, type_ in before}
    new = {name: type_ for name, type_ in now}
    label = role if role in ("input", "outlet") else f"{role} key"
    for name in sorted(old.keys() - new.keys()):
        yield f"{label} {name!r} is gone"
    for name in sorted(new.keys() - old.keys()):
        yield f"{label} {name!r} is new"
    for name in sorted(old.keys() & new.keys()):
        if old[name] != new[name]:
            inside = type_differences(old[name], new[name])
            detail = f" ({', '.join(inside)})" if inside else ""
            yield f"{label} {name!r} was {old[name]}, is {new[name]}{detail}"
