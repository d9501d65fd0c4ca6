"""The rules a store's records keep with each other, written once over decoded records.

Each function takes records as a backend decoded them (descriptors,
frontiers, the sequences of stored messages, node boundaries) and returns
the problems it finds, one sentence each, naming the records and never a
payload; none reads storage. The LMDB backend applies them when a ledger
opens (``ledger/lmdb/_verify.py``) and in ``python -m ledger check``
(``ledger/lmdb/_check.py``); a backend that stores the same records (PostgreSQL)
applies the same functions to what its queries return. What is checked on
raw bytes (checksums, key order, manifests of keys) stays with the backend.

A rule here says what would otherwise read as empty history: a group
without its frontier would start over as a new group, a message missing
below what was appended would never be delivered, a committed node without
its record would run again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from ._layouts import StreamDescriptor
from ._records import GroupFrontier
from ._rules import min_frontier

__all__ = [
    "NodeBoundary",
    "checkpoint_problems",
    "group_problems",
    "node_problems",
    "stream_id_problems",
    "tail_floor",
    "tail_problems",
]


def stream_id_problems(counter: int, ids: Iterable[int]) -> list[str]:
    """Stream ids are allocated 1, 2, ... by the counter and never freed: each one has a descriptor."""
    held = set(ids)
    problems = [f"stream id {i} is above the last allocated, {counter}" for i in sorted(held) if i > counter]
    missing = [i for i in range(1, counter + 1) if i not in held]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        problems.append(f"stream ids {shown} were allocated (up to {counter}) but have no descriptor")
    return problems


def group_problems(desc: StreamDescriptor, frontiers: Mapping[str, GroupFrontier]) -> list[str]:
    """Every group a descriptor lists has its frontier, no frontier is of a group it does not list, and
    no group acknowledged past the last message appended."""
    problems = [
        f"stream {desc.ref} lists group {group!r}, whose frontier is missing"
        for group in desc.groups
        if group not in frontiers
    ]
    problems.extend(
        f"frontier of group {group!r} belongs to no group stream {desc.ref} lists"
        for group in frontiers
        if group not in desc.groups
    )
    problems.extend(
        f"group {group!r} of stream {desc.ref} acknowledged through {frontier.acked_through}, past the "
        f"{desc.appended} messages appended"
        for group, frontier in frontiers.items()
        if frontier.acked_through > desc.appended
    )
    return problems


def tail_floor(desc: StreamDescriptor, frontiers: Mapping[str, GroupFrontier]) -> int:
    """The sequence after which a stream's messages must all be held: what an open of it reads."""
    return min_frontier([frontiers[g] for g in desc.groups if g in frontiers], desc.appended)


def tail_problems(desc: StreamDescriptor, floor: int, seqs: Sequence[int]) -> list[str]:
    """The messages held after ``floor`` are exactly ``floor + 1`` to the last appended, in order."""
    start = max(floor, desc.compacted_through)
    expected = range(start + 1, desc.appended + 1)
    if len(seqs) == len(expected) and all(s == e for s, e in zip(seqs, expected, strict=True)):
        return []
    found = f"{len(seqs)} message(s)" + (f", {seqs[0]} to {seqs[-1]}" if seqs else "")
    return [
        f"stream {desc.ref} should hold messages {start + 1} to {desc.appended} (compacted through "
        f"{desc.compacted_through}), it holds {found}"
    ]


class NodeBoundary(Protocol):
    """What the node rule reads of a retry boundary's record (``_nodes.NodeAttemptRecord``)."""

    @property
    def parent(self) -> str: ...

    @property
    def node(self) -> str: ...

    @property
    def committed(self) -> bool: ...


def node_problems(boundaries: Iterable[NodeBoundary], has_record: Callable[[str, str], bool]) -> list[str]:
    """A node whose complete-chain boundary says committed has its record in its parent scope."""
    return [
        f"node {b.node!r} in scope {b.parent!r} is committed, but its record is missing"
        for b in boundaries
        if b.committed and not has_record(b.parent, b.node)
    ]


def checkpoint_problems(run_ids: Iterable[str], checkpoint_ids: Iterable[str]) -> list[str]:
    """A durable graph run's checkpoint belongs to a run record."""
    runs = set(run_ids)
    return [f"graph run {c!r} has a checkpoint but no run record" for c in checkpoint_ids if c not in runs]
