"""Errors out of task groups: one real error is raised as itself, not wrapped in a group."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

__all__ = ["leaves", "single_error"]


def leaves(errors: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The non-group exceptions inside ``errors``, depth first."""
    found: list[BaseException] = []
    for error in errors.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found.extend(leaves(error))
        else:
            found.append(error)
    return found


@contextmanager
def single_error() -> Iterator[None]:
    """Re-raise a task group's failure as its one error, so callers catch our types.

    Background tasks of the library fail one at a time (the first failure
    cancels the rest), so a group usually holds one real error, sometimes
    twice: as itself in the task that met it and as the cause of the error a
    waiting caller got. That caller's error is raised; a group of unrelated
    errors is raised unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as errors:
        found = list({id(e): e for e in leaves(errors)}.values())  # one error raised in several tasks
        cancelled = anyio.get_cancelled_exc_class()
        real = [e for e in found if not isinstance(e, cancelled)]
        if real and len(real) < len(found):
            found = real  # a cancellation that met a real error is that error's consequence
        causes = {id(e.__cause__) for e in found if e.__cause__ is not None}
        found = [e for e in found if id(e) not in causes] or found
        if len(found) == 1:
            raise found[0] from found[0].__cause__
        raise
