"""How a node attempt, an aspect or a hook call ended: one classification, used by the whole engine.

Every ending falls in exactly one class:

- **business failure**: the node's code (or an aspect, or a message
  handler) raised while nothing cancelled it. It is confirmed
  (``fail_attempt``, ``fail_message``), spends budget, and a Retry may run
  it again.
- **cancellation**: the caller's contexts were cancelled (the host,
  ``Execution.cancel``, a failing sibling, a deadline or a Timeout around
  it). Nothing is confirmed and no budget is spent, whatever the code did
  after the cancellation reached it (raise, return, skip): the attempt stays
  active for recovery. :func:`interrupted` tells.
- **reliable failure**: any exception from a store hook, cancellation
  exceptions included when nothing cancelled the caller (:func:`is_fault`).
  It latches the tree's :class:`~streams.CheckpointError`, which no Retry or
  aspect swallows.
- **uncertain confirmation**: the call was made and its answer lost; it is a
  reliable failure here, and resume reads what the store holds.

Before a reliable operation is accepted, :func:`accept` checks the caller's
contexts: a cancelled caller starts none. Once accepted, a call is shielded
and runs to its answer.
"""

from __future__ import annotations

import math

import anyio
import anyio.lowlevel

__all__ = ["accept", "interrupted", "is_fault"]


def interrupted() -> bool:
    """Whether a scope enclosing the calling task was cancelled: what follows is an interruption."""
    return anyio.current_effective_deadline() == -math.inf


async def accept() -> None:
    """Before a reliable operation: raise the caller's cancellation if its contexts are cancelled.

    It yields only then (what :func:`interrupted` tells is what anyio's
    ``checkpoint_if_cancelled`` checks, without computing a deadline).
    """
    await anyio.lowlevel.checkpoint_if_cancelled()


def is_fault(exc: BaseException, *, shielded: bool) -> bool:
    """Whether ``exc``, raised out of a hook call, is a reliable failure of the store.

    Every ``Exception`` is. A cancellation exception is too when nothing
    cancelled the caller, or when the call was shielded (no cancellation can
    reach a shielded call, so the store raised it itself, as async database
    drivers do). ``KeyboardInterrupt``, ``SystemExit`` and the like are not:
    they stop the process, and resume reads what the store holds.
    """
    if isinstance(exc, Exception):
        return True
    return isinstance(exc, anyio.get_cancelled_exc_class()) and (shielded or not interrupted())
