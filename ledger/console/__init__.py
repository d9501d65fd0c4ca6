"""A read-only web console of a ledger: ``python -m ledger console PATH|URL``.

It shows the ledger's streams and consumer groups with their lag, rates and
the age of their oldest unacknowledged message, plotted over the time the
console has watched, and each group's health with the reason for it; the
runs, filtered by status; and a run's graph with each node's status, a
timeline of its node attempts and their failures.
Pages update on each read of the ledger (server-sent events), read as
``inspect`` reads it, beside the running programs. Everything it serves
ships in this package; it needs nothing beyond the standard library.
"""

from ._model import Watcher as Watcher
from ._model import health_of as health_of
from ._server import ConsoleServer as ConsoleServer
from ._server import is_loopback as is_loopback

__all__ = ["ConsoleServer", "Watcher", "health_of", "is_loopback"]
