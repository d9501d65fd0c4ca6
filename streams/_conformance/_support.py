"""What the conformance checks are made of: a world of sessions, a registry, and ``raises``."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from .._store._hooks import StreamHooks

__all__ = ["CHECKS", "Check", "World", "cases", "check", "raises"]

E = TypeVar("E", bound=BaseException)


class World(Protocol):
    """One store's storage, reached through sessions: each session is one process lifetime.

    Leaving a session and entering a new one is a restart: a store that keeps
    its records elsewhere (a file, a server) opens them again; an in-process
    store hands out the same object.
    """

    def session(self) -> AbstractAsyncContextManager[StreamHooks]: ...


class Check:
    """One behaviour of the contract, run against a fresh world."""

    __slots__ = ("name", "run")

    def __init__(self, name: str, run: Callable[[World], Awaitable[None]]) -> None:
        self.name = name
        self.run = run

    async def __call__(self, world: World) -> None:
        await self.run(world)

    def __repr__(self) -> str:
        return f"Check({self.name})"


#: Every check of the suite, in the order the modules define them.
CHECKS: list[Check] = []


def check(fn: Callable[[World], Awaitable[None]]) -> Callable[[World], Awaitable[None]]:
    """Register ``fn`` as a check."""
    CHECKS.append(Check(fn.__name__, fn))
    return fn


def cases(
    *params: tuple[Any, ...], ids: list[str]
) -> Callable[[Callable[..., Awaitable[None]]], Callable[..., Awaitable[None]]]:
    """Register ``fn`` once per tuple of extra arguments, named ``fn[id]``."""

    def register(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        for args, case in zip(params, ids, strict=True):
            CHECKS.append(Check(f"{fn.__name__}[{case}]", partial(_with, fn, args)))
        return fn

    return register


async def _with(fn: Callable[..., Awaitable[None]], args: tuple[Any, ...], world: World) -> None:
    await fn(world, *args)


class Raised(Generic[E]):
    """What :func:`raises` caught: ``value`` is the exception."""

    value: E


@contextmanager
def raises(expected: type[E] | tuple[type[E], ...], *, match: str | None = None) -> Iterator[Raised[E]]:
    """The block must raise ``expected`` (a subclass too) whose message matches ``match``."""
    caught: Raised[E] = Raised()
    try:
        yield caught
    except expected as exc:
        if match is not None and not re.search(match, str(exc)):
            raise AssertionError(f"{type(exc).__name__} {str(exc)!r} does not match {match!r}") from exc
        caught.value = exc
    else:
        names = [t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))]
        raise AssertionError(f"{' or '.join(names)} was not raised")
