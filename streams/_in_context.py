"""Store calls made on someone else's behalf, run in that caller's context variables.

A confirmation pipeline (:mod:`streams._pipeline`) makes its store calls
from whichever task leads it: a node task confirming other nodes' records,
a writer's or a handler's committer task. The store must still see the
context variables (a tenant, a trace) of the caller whose work it
confirms, so the caller's context is copied once when it stages the first
unit of a batch (:func:`contextvars.copy_context`, which shares the
variables and costs no more than an allocation) and the batch's call runs in
that copy with :func:`call_in_context`.

A coroutine keeps no context of its own: its body runs in the context of the
task that awaits it, whichever context it was created in. So
:class:`_InContext` steps the call itself, each ``send`` and ``throw`` inside
``context.run``, as an asyncio task steps its coroutine; everything the call
yields (an asyncio future, a trio trap) passes through untouched to the
awaiting task, so cancel scopes, shields and cancellation behave as if the
call were awaited directly, on asyncio and on trio. The call's own changes
to context variables stay in the copy, never in the awaiting task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from contextvars import Context
from typing import Any, Generic, ParamSpec, TypeVar

__all__ = ["call_in_context", "same_context"]

P = ParamSpec("P")
T = TypeVar("T")


def call_in_context(
    context: Context, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
) -> Awaitable[T]:
    """``fn(*args, **kwargs)``, its synchronous part and every step of its await run in ``context``.

    ``context`` must not be entered elsewhere while the call runs: pass a
    copy of one's own (:func:`contextvars.copy_context`).
    """
    return _InContext(context, fn, args, kwargs)


def same_context(a: Context, b: Context) -> bool:
    """Whether ``a`` and ``b`` hold the same variables with equal values.

    Contexts copied from one another share their variables, so this is
    immediate unless some variable was set since; then values are compared
    with ``==``, and values that cannot be compared (``==`` raised) count as
    different.
    """
    if a is b:
        return True
    try:
        return a == b
    except Exception:  # a value's __eq__ refused: not known to be the same context
        return False


class _InContext(Generic[T]):
    __slots__ = ("_args", "_context", "_fn", "_kwargs")

    def __init__(
        self,
        context: Context,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self._context = context
        self._fn = fn
        self._args = args
        self._kwargs = kwargs

    def _start(self) -> Generator[Any, Any, T]:
        return self._fn(*self._args, **self._kwargs).__await__()

    def __await__(self) -> Generator[Any, Any, T]:
        run = self._context.run
        steps = run(self._start)
        send, throw = steps.send, steps.throw
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = run(send, value) if error is None else run(throw, error)
            except StopIteration as done:
                result: T = done.value
                return result
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                run(steps.close)
                raise
            except BaseException as exc:  # delivered to the call: a cancellation, as into any await
                value, error = None, exc
