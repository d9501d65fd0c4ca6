"""Fault injection for recovery tests: wrap a store and fail its Nth call.

Pass the wrapper where the store would go; nothing global is patched::

    faulty = FaultyHooks(store, fail={"commit": 3})
    async with open_scope(faulty, scope="t") as scope: ...

A call chosen to fail raises :class:`InjectedFault` either before reaching
the store (``after=False``: nothing confirmed) or after the store confirmed
it (``after=True``: the answer is lost, as when a process dies inside a
commit). ``error=`` raises another exception instead, such as the
cancellation an async database driver may raise while nothing cancelled its
caller (:func:`stray_cancellation`): a reliable failure all the same.

For a wrapper of your own (one that gates, counts or refuses some calls),
subclass :class:`PassThroughHooks` and override only the calls it changes.

A store of your own is proven by the conformance suite:
:func:`check_stream_store` runs every check against it, and
:func:`stream_store_checks` lists them for a test runner to run one by one
(see ``docs/stores.md``). A store of node checkpoints
(:class:`~streams.store.CheckpointHooks`) is proven the same way by
:func:`check_node_store` and :func:`node_store_checks`, and its calls are
failed on purpose by :class:`FaultyNodeHooks`.
"""

from ._public import publish as _publish
from ._store_checks import check_node_store as check_node_store
from ._store_checks import check_stream_store as check_stream_store
from ._store_checks import node_store_checks as node_store_checks
from ._store_checks import stream_store_checks as stream_store_checks
from ._testing import FaultyHooks as FaultyHooks
from ._testing import FaultyNodeHooks as FaultyNodeHooks
from ._testing import InjectedFault as InjectedFault
from ._testing import PassThroughHooks as PassThroughHooks
from ._testing import PassThroughNodeHooks as PassThroughNodeHooks
from ._testing import StoreWorld as StoreWorld
from ._testing import stray_cancellation as stray_cancellation

__all__ = [
    "FaultyHooks",
    "FaultyNodeHooks",
    "InjectedFault",
    "PassThroughHooks",
    "PassThroughNodeHooks",
    "StoreWorld",
    "check_node_store",
    "check_stream_store",
    "node_store_checks",
    "stray_cancellation",
    "stream_store_checks",
]

_publish(globals(), __all__)
