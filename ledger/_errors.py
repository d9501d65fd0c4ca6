"""Errors raised by the ledger: its two backends (LMDB and PostgreSQL), its services and its command line.

Every error a user can meet here derives from :class:`LedgerError`, but for
one: :class:`LeaseLostError` is a :class:`streams.CheckpointError`, because
the engine must treat a worker's lost lease as the reliable layer refusing
a write (stop and recover), never as a business failure. Each error says
what was wrong, names the ledger path or record involved, and never carries
a business payload. A ledger that raised one of these is left as it was.
Durable pydantic-graph runs draw their own errors (``ledger.graphs``).

::

    LedgerError
    ├── NotALedgerError (ValueError)           the path holds something else
    │   ├── UnfinishedLedgerError              a ledger whose creation stopped before its first commit
    │   └── MissingSchemaError                 a PostgreSQL URL's search_path names no schema that exists
    ├── LedgerPathError (ValueError)           a new ledger's directory cannot be made at the path
    ├── SchemaVersionError (ValueError)        written by another schema or codec version
    ├── CorruptRecordError (ValueError)        a record fails its checksum or does not decode
    │   └── MissingRecordError                 a record the ledger's other records or manifests name is
    │                                          missing, or sits under another key or database name
    ├── DamagedLedgerError (ValueError)        a ledger file is damaged (truncated) and is not mapped
    ├── LedgerLockedError                      another process owns the ledger
    ├── LedgerInUseError                       this process has the path open already
    ├── LedgerReadOnlyError                    the ledger cannot be written (a read-only filesystem or file)
    ├── LedgerClosedError                      the ledger was closed
    ├── MapFullError                           the map could not grow to fit a write
    ├── WriteFailedError                       LMDB refused a write transaction
    ├── InvalidRunIdError (ValueError)         a run id is empty or too long for a ledger key
    ├── MissingExtraError (ImportError)        a module needs an extra that is not installed
    ├── UnattributedBudgetsError (ValueError)  a group change met budgets keyed by one digest that
    │                                          does not say their group
    │   the errors of the PostgreSQL ledger's server:
    ├── LedgerUnreachableError                 the server cannot be reached, refuses us, or stayed away
    ├── OutcomeUnknownError                    the server went away while a commit was in flight
    ├── LedgerServerError                      the server failed a statement (a full disk, a timeout, ...)
    │   └── LedgerConflictError                conflicts with other workers outlasted every retry
    ├── ServerUnavailableError (RuntimeError)  a private server: no PostgreSQL binaries, or it did not start
    │   the errors of ledger.run and ledger.resume:
    ├── RunExistsError (ValueError)            ledger.run with a run id the ledger knows
    ├── UnknownRunError (LookupError)          ledger.resume with a run id the ledger does not know
    ├── RunMismatchError (ValueError)          ledger.resume with another graph (name, version, topology)
    │   ├── RunAspectsMismatchError            ... or another aspect chain than the run started with
    │   └── RunInputsMismatchError             ledger.start of a known run with other inputs
    ├── RunActiveError                         the run id is run by another execution of this process
    ├── RunNotEndedError                       ledger.retry of a run that is still running
    ├── RunCancelledError                      ledger.resume or ledger.start of a cancelled run
    ├── RunFinishedError (ValueError)          ledger.cancel of a run that is not running
    │   the errors of the command line's commands (python -m ledger):
    ├── BackupDestinationError (ValueError)    a backup's destination exists, or cannot be written
    ├── StreamNotFoundError (LookupError)      view or group names a stream the ledger does not hold
    ├── GroupChangeError (ValueError)          group move to a sequence the stream cannot start the group at
    ├── GraphsNotFoundError (ValueError)       worker --graphs names no mapping of graph names to graphs
    ├── PostgresOnlyError (ValueError)         worker or migrate given an LMDB ledger's path
    ├── ConsoleTokenError (ValueError)         console on an address not loopback without a token
    ├── ConsoleQueryError (ValueError)         a console view asked for with a value it cannot take
    ├── ListenAddressError (OSError)           console or metrics cannot listen: a port in use, an address
    │                                          not this machine's, a host that does not resolve
    ├── DemoMismatchError (ValueError)         the ledger holds another demo (another --messages), or more
    └── DemoWorkerError                        a worker process of the PostgreSQL demo stopped with an error

    streams.CheckpointError
    └── LeaseLostError                         this worker's lease on a run passed to another worker
"""

from __future__ import annotations

from streams import CheckpointError

__all__ = [
    "BackupDestinationError",
    "ConsoleQueryError",
    "ConsoleTokenError",
    "ListenAddressError",
    "CorruptRecordError",
    "DamagedLedgerError",
    "DemoMismatchError",
    "DemoWorkerError",
    "GraphsNotFoundError",
    "GroupChangeError",
    "InvalidRunIdError",
    "MissingExtraError",
    "LeaseLostError",
    "LedgerClosedError",
    "LedgerConflictError",
    "LedgerError",
    "LedgerInUseError",
    "LedgerLockedError",
    "LedgerPathError",
    "LedgerReadOnlyError",
    "LedgerServerError",
    "LedgerUnreachableError",
    "MapFullError",
    "MissingRecordError",
    "MissingSchemaError",
    "NotALedgerError",
    "OutcomeUnknownError",
    "PostgresOnlyError",
    "RunActiveError",
    "RunAspectsMismatchError",
    "RunCancelledError",
    "RunFinishedError",
    "RunInputsMismatchError",
    "RunExistsError",
    "RunMismatchError",
    "RunNotEndedError",
    "SchemaVersionError",
    "ServerUnavailableError",
    "StreamNotFoundError",
    "UnattributedBudgetsError",
    "UnfinishedLedgerError",
    "UnknownRunError",
    "WriteFailedError",
]


class LedgerError(Exception):
    """Root of every error raised by the ledger, but :class:`LeaseLostError` (a ``CheckpointError``)."""


class NotALedgerError(LedgerError, ValueError):
    """The path exists but is not a streamledger ledger."""


class UnfinishedLedgerError(NotALedgerError):
    """The path holds a ledger whose creation stopped before its first commit: it holds nothing yet.

    Opening it for writing finishes the creation; reading it has nothing to read.
    """


class LedgerPathError(LedgerError, ValueError):
    """A new ledger's directory cannot be made at the path (a parent cannot be made, a file is in the way)."""


class MissingSchemaError(NotALedgerError):
    """A PostgreSQL URL's ``search_path`` names no schema that exists: create it, or fix the URL."""


class LedgerUnreachableError(LedgerError):
    """The server holding a PostgreSQL ledger cannot be reached (or refused the connection).

    Raised at once for a refusal (no such database or role, failed
    authentication); for a server that is down or went away, once the
    ledger's bounded reconnection time ran out.
    """


class OutcomeUnknownError(LedgerError):
    """The PostgreSQL server went away while a call's commit was in flight: it may have landed, or not.

    Nothing is assumed: the ledger holds the answer, and resuming the run
    reads it (a worker does so at once).
    """


class LedgerServerError(LedgerError):
    """The PostgreSQL server failed a statement (its disk is full, a statement timed out, ...).

    The transaction was rolled back: nothing of the failed call was confirmed.
    """


class LedgerConflictError(LedgerServerError):
    """A transaction kept conflicting with other workers' past every retry; nothing of it was confirmed."""


class UnattributedBudgetsError(LedgerError, ValueError):
    """A group change met message budgets keyed by one digest, from which no group can be read."""


class SchemaVersionError(LedgerError, ValueError):
    """The ledger was written by another schema or codec version."""


class CorruptRecordError(LedgerError, ValueError):
    """A stored record fails its checksum or does not decode as its layout."""


class MissingRecordError(CorruptRecordError):
    """A record the ledger's other records (or a database's manifest) say it holds is not where it belongs.

    It is missing, sits under another key, or its database is under another
    name: a damaged key. The ledger is refused when it opens, before anything
    is written, so the damage is never read as empty history (a new stream, a
    new group, a fresh budget, a run never started) nor laundered into a
    sound-looking ledger by the next write.
    """


class DamagedLedgerError(LedgerError, ValueError):
    """A ledger file is damaged so that mapping it could kill the process (it was truncated)."""


class LedgerLockedError(LedgerError):
    """Another process holds the ledger's owner lock."""


class LedgerInUseError(LedgerError):
    """This process already has the ledger path open."""


class LedgerReadOnlyError(LedgerError):
    """The ledger cannot be opened for writing: its filesystem is read-only, or its files are.

    Reading it still works (:meth:`~ledger.LedgerEnv.open_readonly`, ``python -m ledger inspect``
    and ``check``).
    """


class LedgerClosedError(LedgerError):
    """An operation was attempted on a closed ledger."""


class MapFullError(LedgerError):
    """A write did not fit even after growing the map to its limit."""


class WriteFailedError(LedgerError):
    """LMDB refused a write transaction; the run must stop and recover."""


class InvalidRunIdError(LedgerError, ValueError):
    """The run id cannot be a ledger key: empty, or longer than the key limit."""


class BackupDestinationError(LedgerError, ValueError):
    """A backup's destination exists already, or the copy cannot be written there."""


class ServerUnavailableError(LedgerError, RuntimeError):
    """No PostgreSQL binaries on this machine, or the private server would not start."""


class ConsoleTokenError(LedgerError, ValueError):
    """``console`` on an address that is not loopback without a token every request must carry."""


class ConsoleQueryError(LedgerError, ValueError):
    """A console view asked for with a value it cannot take (a time not in ISO 8601): answered 400."""


class ListenAddressError(LedgerError, OSError):
    """``console`` or ``metrics`` cannot listen on its address: a port in use, an address that is not
    this machine's, a host name that does not resolve."""


class MissingExtraError(LedgerError, ImportError):
    """A module of the ledger needs an optional extra that is not installed; it says which ``pip install``."""


def require_extra(module: str, extra: str, needed_by: str) -> None:
    """:class:`MissingExtraError` unless ``module`` imports (streamledger's ``extra`` brings it)."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(
            f"{needed_by} needs the {extra} extra, which is not installed: "
            f"pip install 'streamledger[{extra}]'"
        ) from None


class RunExistsError(LedgerError, ValueError):
    """``run`` with a run id the ledger knows: resume it, or use a new id."""


class UnknownRunError(LedgerError, LookupError):
    """``resume`` with a run id the ledger does not know."""


class RunMismatchError(LedgerError, ValueError):
    """The graph given to ``resume`` is not the one the run started with (name, version or topology)."""


class RunAspectsMismatchError(RunMismatchError):
    """``resume`` was given another aspect chain than the run started with, which keys its Retry budgets."""


class RunInputsMismatchError(RunMismatchError):
    """``start`` of a known run id with other inputs than the run started with (it names which)."""


class RunCancelledError(LedgerError):
    """``resume`` or ``start`` of a run that was cancelled: it is not resumed."""


class RunFinishedError(LedgerError, ValueError):
    """``cancel`` of a run that already completed, failed for good, or was cancelled."""


class RunNotEndedError(LedgerError):
    """``retry`` or ``delete`` of a run that is still running: cancel it first."""


class RunActiveError(LedgerError):
    """The run id is being run by another execution: of this process, or (on PostgreSQL) of another
    process that holds the run's lease."""


class StreamNotFoundError(LedgerError, LookupError):
    """The ledger holds no stream by that reference."""


class GroupChangeError(LedgerError, ValueError):
    """The move asks for a sequence the stream cannot start the group at; nothing changed."""


class GraphsNotFoundError(LedgerError, ValueError):
    """``--graphs`` does not name a mapping of graph names to graphs, a list of graphs or one graph."""


class PostgresOnlyError(LedgerError, ValueError):
    """A command of PostgreSQL ledgers only (``worker``, ``migrate``) was given an LMDB ledger's path."""


class DemoMismatchError(LedgerError, ValueError):
    """The ledger holds a demo of another number of messages, a cancelled one, or more than the demo; nothing
    changed."""


class DemoWorkerError(LedgerError):
    """A worker process of the demo stopped with an error."""


class LeaseLostError(CheckpointError):
    """This worker's lease on a run expired and another worker took the run over; nothing was confirmed.

    A :class:`streams.CheckpointError`, not a :class:`LedgerError`: the
    engine stops the run as it does for any write the reliable layer refused.
    """
