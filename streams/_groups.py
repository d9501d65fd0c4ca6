"""An operator's repairs of consumer groups: remove one, or move its frontier.

Both are one transaction of the store (:func:`streams.store.change_group`)
and raise the stream's generation, so endpoints still open on the stream
are fenced off (their next confirmation fails with
:class:`~streams.StaleGenerationError`) and reopen with the change.
"""

from __future__ import annotations

from typing import Literal

from ._store._hooks import GroupHooks
from ._store._records import GroupChange, GroupFrontier, StreamRef

__all__ = ["move_group", "remove_group"]


def _check_group(group: object) -> None:
    # not check_name: a graph's reader groups are node paths, with '/'
    if not isinstance(group, str) or not group:
        raise ValueError(f"a group name is a non-empty string, got {group!r}")


def _group_hooks(hooks: object) -> GroupHooks:
    if not callable(getattr(hooks, "change_group", None)):
        raise TypeError(f"the store {hooks!r} cannot change consumer groups: it has no change_group")
    return hooks  # type: ignore[return-value]  # checked above


async def remove_group(hooks: object, stream: StreamRef, group: str) -> None:
    """Remove consumer group ``group`` of ``stream``: its frontier, state, results and budgets.

    What it held back is freed: compaction runs again without it, and a
    writer at capacity because of it has room once it reopens. A group the
    application still names when it opens the stream comes back, new, at
    the open's ``start``.
    """
    _check_group(group)
    await _group_hooks(hooks).change_group(GroupChange(stream, group, remove=True))


async def move_group(
    hooks: object,
    stream: StreamRef,
    group: str,
    *,
    to: Literal["earliest", "latest"] | int,
    keep_state: bool,
) -> GroupFrontier:
    """Move ``group`` so that its next message is ``to``; returns its new frontier.

    ``to`` is ``"earliest"`` (sequence 1), ``"latest"`` (after the last
    appended) or a sequence: backwards redelivers acknowledged messages
    still held, forwards skips messages. The group's failures, exhausted
    messages, budgets and stop are forgotten (each message it handles again
    has its whole budget). ``keep_state`` says, with no default, whether
    its explicit state and results stay or are cleared. A sequence
    compaction removed is refused with :class:`~streams.CompactedHistoryError`,
    one never appended with :class:`~streams.SequenceError`; nothing changes then.
    """
    _check_group(group)
    if to not in ("earliest", "latest") and (not isinstance(to, int) or isinstance(to, bool) or to < 1):
        raise ValueError(f"a group moves to 'earliest', 'latest' or a sequence of at least 1, not {to!r}")
    moved = await _group_hooks(hooks).change_group(GroupChange(stream, group, to=to, keep_state=keep_state))
    assert moved is not None  # a move returns the frontier it wrote
    return moved
