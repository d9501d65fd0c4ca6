"""Aspects: async wrappers around the rest of a node's chain (retries, timeouts, your own).

An aspect is any ``async def aspect(ctx, proceed) -> None`` that calls
``await proceed()`` to run the next link (the next aspect, finally the node's
function) and may call it again, skip it, or wrap it. A node's chain is, from
the outside in: the execution's own aspects (unless a Sub mount above it was
made ``without_aspects``), then the node's aspects in the order given, then
its function. A Sub mount's aspects wrap the whole child execution.

What an aspect raises fails the node; what it catches does not. A node that
skips itself (``ctx.skip_node()``) and a cancellation pass through
:class:`Retry` untouched.

An aspect that runs the rest of the chain again makes its place in the
chain a retry boundary with ``ctx.retry_boundary(limit)``
(:class:`~streams.RetryBoundary`): :class:`Retry` is such an aspect, built on
that public API and nothing else, and a user's own retrying aspect gets the
same durable budget, attempts and idempotency keys.

In checkpoint mode a retry boundary's budget is keyed by its position in the
chain, so a durable host records the chain it ran with
(:func:`describe_aspect`, one line per aspect) and refuses to resume the
run with another.
"""

from __future__ import annotations

import math
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import anyio

from ._context import NodeContext, enter_link
from ._errors import CheckpointError, ConfirmedFailureError, OutputError, SkippedInputError

__all__ = ["Aspect", "Proceed", "Retry", "Timeout", "chain", "describe_aspect"]

Proceed = Callable[[], Awaitable[None]]


class Aspect(Protocol):
    """``async def __call__(ctx, proceed)``: ``await proceed()`` zero or more times, and what you like."""

    async def __call__(self, ctx: NodeContext, proceed: Proceed, /) -> None: ...


#: Errors of the caller's own contract, and reliable failures (latched for the whole execution):
#: retrying cannot help, so Retry lets them through at once.
NOT_RETRIED: tuple[type[BaseException], ...] = (OutputError, SkippedInputError, CheckpointError)


class Retry:
    """Run the rest of the chain up to ``attempts`` times while it raises, ``delay`` seconds apart.

    The last failure is raised. Contract errors (a key set twice, an output
    not declared, a skipped input read) and reliable failures are raised at
    once, and so is whatever the chain raised once it was cancelled: a
    cancelled chain is never retried and spends no budget. Before the next
    attempt, every message the failed one sent is confirmed, so a writer
    continuing from ``writer.position`` sends nothing twice. Each attempt
    has message budgets of its own, and its own ``ctx.attempt`` (0-based)
    and ``ctx.idempotency_key``.
    """

    def __init__(self, attempts: int = 3, *, delay: float = 0.0) -> None:
        if not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"Retry needs at least one attempt, got {attempts!r}")
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"Retry's delay must be a finite number of seconds >= 0, got {delay!r}")
        self.attempts = attempts
        self.delay = float(delay)  # Retry(delay=0) and Retry(delay=0.0) describe alike

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(attempts={self.attempts}, delay={self.delay})"

    async def __call__(self, ctx: NodeContext, proceed: Proceed, /) -> None:
        """In checkpoint mode the budget lives in the store, keyed by the enclosing attempt and this
        position: each real failure is confirmed before the next attempt, and what the failed attempt
        staged is dropped. A restart reclaims the current attempt; a budget used up earlier stays used
        up. A failure raised after a cancellation reached the chain is no failure: nothing is
        confirmed and it is not retried (:mod:`streams._outcome`)."""
        boundary = await ctx.retry_boundary(self.attempts)
        if boundary.exhausted:
            raise ConfirmedFailureError(
                f"node {ctx.node!r}: the Retry at position {boundary.position} of its chain used its "
                f"{self.attempts} attempts (confirmed earlier); its budget is not refilled"
            )
        while True:
            try:
                await boundary.run(proceed)
                return
            except NOT_RETRIED:
                raise
            except Exception as exc:
                if not await boundary.fail(exc):
                    raise
            if self.delay:
                await anyio.sleep(self.delay)


class Timeout:
    """Fail the rest of the chain with :class:`TimeoutError` if it runs longer than ``seconds``."""

    def __init__(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"Timeout needs a finite number of seconds > 0, got {seconds!r}")
        self.seconds = float(seconds)  # Timeout(5) and Timeout(5.0) describe alike

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}({self.seconds})"

    async def __call__(self, ctx: NodeContext, proceed: Proceed, /) -> None:
        with anyio.fail_after(self.seconds):
            await proceed()


def describe_aspect(aspect: Aspect) -> str:
    """The aspect as a run records it: the same in every process and from every entry point.

    :class:`Retry` and :class:`Timeout` are their repr, parameters included
    (``Retry(attempts=3, delay=0.0)``, ``Timeout(5.0)``). A function (or a
    method) is its qualified name, a callable object the qualified name of
    its type; never the module, which is ``__main__`` in a program started
    as ``python app.py`` and ``app`` in one that imports it. So an object's
    own parameters are not part of its description, and two lambdas (both
    ``<lambda>``) look alike.
    """
    if isinstance(aspect, Retry | Timeout):
        return repr(aspect)
    if isinstance(aspect, types.FunctionType | types.MethodType | types.BuiltinFunctionType | type):
        return aspect.__qualname__
    return type(aspect).__qualname__


def chain(aspects: Sequence[Aspect], ctx: NodeContext, body: Proceed) -> Proceed:
    """``body`` wrapped by ``aspects``, the first one outermost."""
    link = body
    for position, aspect in reversed(list(enumerate(aspects, start=1))):
        link = _link(aspect, ctx, link, position)
    return link


def _link(aspect: Aspect, ctx: NodeContext, proceed: Proceed, position: int) -> Proceed:
    async def run() -> None:
        enter_link(ctx, position)  # a retry boundary is keyed by it
        await aspect(ctx, proceed)

    return run
