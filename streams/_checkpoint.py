"""Checkpoint mode: ``ExecCheckpoint(scope, hooks)`` for an execution and its whole tree.

In checkpoint mode every node that is not restored:

1. opens (or reclaims) the persistent attempt of its complete chain with
   ``hooks.open_attempt`` (limit 1: a confirmed final failure stays final);
2. stages what the body and its aspects set or skip in a write set outside
   the whole aspect chain (a :class:`~streams.Retry` opens its own
   persistent attempts, confirms each real failure with
   ``hooks.fail_attempt`` before the next, and drops what the failed
   attempt staged);
3. settles the keys it provides but did not set as skipped;
4. has every output validated (read back as its key's type when staged);
5. confirms the complete node record with ``hooks.commit_nodes`` (the
   seed's Commit, named apart from the stream hooks' ``commit``, since one
   store object usually implements both; like that one it takes a batch:
   the records of nodes that concluded while the previous batch was being
   confirmed leave together, all or nothing);
6. publishes its outputs key by key, only after that.

A Sub mount asks ``hooks.open_child`` for the scope of its child under the
mount's current attempt, and for the child's confirmed nodes, which are
restored without running. A persistent scope is an attempt identity the
store assigns: the same mount under another parent attempt has another
scope, so a retried parent never borrows the results of a failed one.
"""

from __future__ import annotations

from ._store._hooks import CheckpointHooks

__all__ = ["CHECKPOINT_HOOKS", "ExecCheckpoint"]

#: The methods a complete set of node hooks has; checked when an execution is built. The
#: ``streams`` attribute (the stream hooks) is optional: only a graph with stream ports needs it.
CHECKPOINT_HOOKS = ("open_attempt", "fail_attempt", "open_child", "commit_nodes")


class ExecCheckpoint:
    """Checkpoint mode for an execution and its tree: the run's ``scope`` and the store's ``hooks``.

    ``new_scope=True`` promises that the store holds nothing under
    ``scope`` yet (a run id created in the same call, as ``ledger.run``
    creates it) and assigns attempt scopes by the store rules of
    :mod:`streams.store`: every retry boundary the tree opens is then new,
    and its first attempt is known without an ``open_attempt`` read. A
    resume, or a store with rules of its own, leaves it ``False``.
    """

    def __init__(self, scope: str, hooks: CheckpointHooks, *, new_scope: bool = False) -> None:
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"a checkpoint scope must be a non-empty string, got {scope!r}")
        missing = [name for name in CHECKPOINT_HOOKS if not callable(getattr(hooks, name, None))]
        if missing:
            raise TypeError(
                f"checkpoint hooks {hooks!r} lack {', '.join(missing)} (each an async method): a store "
                "implements all four"
            )
        self.scope = scope
        self.hooks = hooks
        self.new_scope = new_scope

    def __repr__(self) -> str:
        return f"ExecCheckpoint({self.scope!r}, {self.hooks!r})"
