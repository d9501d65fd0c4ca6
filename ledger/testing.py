"""Crash-testing your own pipeline: kill it with SIGKILL at random moments, and check its ledger's history.

::

    history = LedgerHistory(path)
    kills = kill_until_done([sys.executable, "my_pipeline.py", path], kills=50, after_kill=history.observe)
    history.observe()  # and compare the final answer with the uninterrupted one

:func:`kill_until_done` runs a command, kills it with SIGKILL after a random
moment, runs ``after_kill``, starts it again, and so on until it has been
killed ``kills`` times; then lets it finish and returns the kills made (a
run that finished before its kill counts none). :class:`LedgerHistory`
reads the ledger after every kill (read-only, while nothing runs) and fails
with :class:`HistoryViolation` when it is damaged or its history moved back:
a stream's appended messages, generation or terminal, a group's frontier,
its exhausted or failing messages' budgets.
"""

from streams.store import publish as _publish

from ._testing import HistoryViolation as HistoryViolation
from ._testing import LedgerHistory as LedgerHistory
from ._testing import kill_until_done as kill_until_done

__all__ = ["HistoryViolation", "LedgerHistory", "kill_until_done"]

_publish(globals(), __all__)
