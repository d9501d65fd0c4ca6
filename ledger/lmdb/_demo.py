"""The demo on an LMDB ledger: ``python -m ledger demo PATH``, one owning process."""

from __future__ import annotations

import os

from .._demo import DEMO_SCOPE, DemoSummary, ProgressCallback, run_demo_on
from ._backend import open_ledger
from ._inspect import inspect_ledger

__all__ = ["run_demo"]


async def run_demo(
    path: str | os.PathLike[str],
    messages: int = 100_000,
    *,
    progress: ProgressCallback | None = None,
    progress_interval: float = 0.25,
    sync: bool = True,
    max_map_size: int = 1 << 40,
    run_id: str = DEMO_SCOPE,
    fresh: bool = False,
) -> DemoSummary:
    """Run (or resume) the demo graph on the ledger at ``path`` and return its figures.

    The demo is graph run ``demo`` (:func:`demo_graph`): ``ledger.run`` the
    first time, ``ledger.resume`` after. ``progress`` is called with a
    :class:`DemoProgress` once when the streams are open, then every
    ``progress_interval`` seconds, and once at the end; it reads endpoint
    snapshots and never touches the messages. If the ledger holds a finished
    demo of ``messages`` orders, nothing is opened or written and the summary
    has ``already_finished=True``. ``max_map_size`` is the ledger's map limit
    (:func:`~ledger.open_ledger`): a message whose write does not fit stops
    the run with a :class:`~streams.CheckpointError` caused by
    :class:`~ledger.MapFullError`, and the same call with a larger limit resumes.
    ``run_id`` names the demo's run (several may run in one ledger, side by
    side); ``fresh`` deletes that run first, its records and streams, and
    starts it anew.

    Raises :class:`~ledger.DemoMismatchError`, having changed nothing, if the
    ledger holds a demo (finished or not) of another number of ``messages``,
    or anything but the demo (an application's streams or runs: the demo
    never writes beside them), and the ledger's own errors
    (:class:`~ledger.NotALedgerError`, :class:`~ledger.LedgerLockedError`, …)
    for a path that cannot be opened.
    """
    if messages < 1:
        raise ValueError("the demo needs at least one message")
    if progress_interval <= 0:
        raise ValueError("progress_interval must be positive")
    async with open_ledger(path, sync=sync, max_map_size=max_map_size) as ledger:
        report = inspect_ledger(ledger.backend.env)
        return await run_demo_on(
            ledger, report, path, messages, progress, progress_interval, run_id=run_id, fresh=fresh
        )
