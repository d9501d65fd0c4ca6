"""The conformance suites of stores, as named checks and as one call: what ``streams.testing`` publishes.

Above both the checks (:mod:`streams._conformance`) and the wrappers they
use (:mod:`streams._testing`), so that neither imports the other's user.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ._conformance import CHECKS
from ._conformance import contexts as _contexts  # noqa: F401 - registers its node checks
from ._conformance import failure_paths as _failure_paths  # noqa: F401 - registers its node checks
from ._conformance import host_streams as _host_streams  # noqa: F401 - registers its node checks
from ._conformance import node_partitions as _node_partitions  # noqa: F401 - registers its node checks
from ._conformance import node_streams as _node_streams  # noqa: F401 - registers its node checks
from ._conformance.nodes import NODE_CHECKS
from ._testing import StoreWorld

__all__ = ["check_node_store", "check_stream_store", "node_store_checks", "stream_store_checks"]


def stream_store_checks() -> list[tuple[str, Callable[[StoreWorld], Awaitable[None]]]]:
    """Every check of the conformance suite, named, to run one by one (one test each).

    Each check wants a fresh world: storage that no check used before.
    """
    return [(c.name, c.run) for c in CHECKS]


async def check_stream_store(new_world: Callable[[], StoreWorld]) -> None:
    """Run the whole conformance suite against a store; raise at the first check that fails.

    ``new_world()`` gives fresh storage for each check. The failure says
    which check failed (as a note on the exception).
    """
    for name, run in stream_store_checks():
        try:
            await run(new_world())
        except BaseException as exc:
            exc.add_note(f"conformance check {name} failed")
            raise


def node_store_checks() -> list[tuple[str, Callable[[Any], Awaitable[None]]]]:
    """Every check of the node-hook conformance suite, named; each wants a fresh world.

    A world has ``session()``, an async context manager yielding the store's
    :class:`~streams.store.CheckpointHooks` (with ``node_records(scope)`` and
    ``scope_failed(scope)``, what a host reads to resume).
    """
    return list(NODE_CHECKS)


async def check_node_store(new_world: Callable[[], Any]) -> None:
    """Run the node-hook conformance suite against a store; raise at the first check that fails."""
    for name, run in node_store_checks():
        try:
            await run(new_world())
        except BaseException as exc:
            exc.add_note(f"node conformance check {name} failed")
            raise
