"""streamledger's durable store: the ledger of streams, nodes and graph runs, on LMDB or PostgreSQL."""

from streams import __version__ as __version__
from streams.store import publish as _publish

from ._backend import Backend as Backend
from ._backend import NodeStore as NodeStore
from ._committer import WriteTicket as WriteTicket
from ._connect import connect as connect
from ._errors import BackupDestinationError as BackupDestinationError
from ._errors import ConsoleQueryError as ConsoleQueryError
from ._errors import ConsoleTokenError as ConsoleTokenError
from ._errors import CorruptRecordError as CorruptRecordError
from ._errors import DamagedLedgerError as DamagedLedgerError
from ._errors import DemoMismatchError as DemoMismatchError
from ._errors import DemoWorkerError as DemoWorkerError
from ._errors import GraphsNotFoundError as GraphsNotFoundError
from ._errors import GroupChangeError as GroupChangeError
from ._errors import InvalidRunIdError as InvalidRunIdError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import LedgerClosedError as LedgerClosedError
from ._errors import LedgerConflictError as LedgerConflictError
from ._errors import LedgerError as LedgerError
from ._errors import LedgerInUseError as LedgerInUseError
from ._errors import LedgerLockedError as LedgerLockedError
from ._errors import LedgerPathError as LedgerPathError
from ._errors import LedgerReadOnlyError as LedgerReadOnlyError
from ._errors import LedgerServerError as LedgerServerError
from ._errors import LedgerUnreachableError as LedgerUnreachableError
from ._errors import ListenAddressError as ListenAddressError
from ._errors import MapFullError as MapFullError
from ._errors import MissingExtraError as MissingExtraError
from ._errors import MissingRecordError as MissingRecordError
from ._errors import MissingSchemaError as MissingSchemaError
from ._errors import NotALedgerError as NotALedgerError
from ._errors import OutcomeUnknownError as OutcomeUnknownError
from ._errors import PostgresOnlyError as PostgresOnlyError
from ._errors import RunActiveError as RunActiveError
from ._errors import RunAspectsMismatchError as RunAspectsMismatchError
from ._errors import RunCancelledError as RunCancelledError
from ._errors import RunExistsError as RunExistsError
from ._errors import RunFinishedError as RunFinishedError
from ._errors import RunInputsMismatchError as RunInputsMismatchError
from ._errors import RunMismatchError as RunMismatchError
from ._errors import RunNotEndedError as RunNotEndedError
from ._errors import SchemaVersionError as SchemaVersionError
from ._errors import ServerUnavailableError as ServerUnavailableError
from ._errors import StreamNotFoundError as StreamNotFoundError
from ._errors import UnattributedBudgetsError as UnattributedBudgetsError
from ._errors import UnfinishedLedgerError as UnfinishedLedgerError
from ._errors import UnknownRunError as UnknownRunError
from ._errors import WriteFailedError as WriteFailedError
from ._graph_runs import GraphRunBook as GraphRunBook
from ._ledger import Ledger as Ledger
from ._ledger_metrics import LEDGER_METRICS as LEDGER_METRICS
from ._ledger_metrics import LedgerMetric as LedgerMetric
from ._ledger_metrics import LedgerReading as LedgerReading
from ._ledger_metrics import ObservedLedger as ObservedLedger
from ._ledger_metrics import observe_ledger as observe_ledger
from ._ledger_metrics import read_ledger_metrics as read_ledger_metrics
from ._runs import RunBook as RunBook
from ._runs import RunCancel as RunCancel
from ._runs import RunDeleted as RunDeleted
from ._runs import RunRecord as RunRecord
from ._runs import RunResult as RunResult
from ._runs import RunRetry as RunRetry
from ._runs import Runs as Runs
from .lmdb import LmdbBackend as LmdbBackend
from .lmdb import open_ledger as open_ledger
from .lmdb._env import LedgerEnv as LedgerEnv
from .lmdb._inspect import inspect_ledger as inspect_ledger
from .lmdb._nodes import LmdbNodeHooks as LmdbNodeHooks
from .lmdb._streams import LmdbStreamHooks as LmdbStreamHooks

__all__ = [
    "LEDGER_METRICS",
    "Backend",
    "BackupDestinationError",
    "CorruptRecordError",
    "DamagedLedgerError",
    "DemoMismatchError",
    "DemoWorkerError",
    "GraphRunBook",
    "GraphsNotFoundError",
    "GroupChangeError",
    "InvalidRunIdError",
    "MissingExtraError",
    "LeaseLostError",
    "Ledger",
    "LedgerClosedError",
    "LedgerConflictError",
    "LedgerEnv",
    "LedgerError",
    "LedgerInUseError",
    "LedgerLockedError",
    "LedgerMetric",
    "LedgerPathError",
    "LedgerReadOnlyError",
    "LedgerReading",
    "LedgerServerError",
    "LedgerUnreachableError",
    "LmdbBackend",
    "LmdbNodeHooks",
    "LmdbStreamHooks",
    "MapFullError",
    "MissingRecordError",
    "MissingSchemaError",
    "NodeStore",
    "NotALedgerError",
    "ObservedLedger",
    "OutcomeUnknownError",
    "PostgresOnlyError",
    "RunActiveError",
    "RunAspectsMismatchError",
    "RunCancelledError",
    "ConsoleQueryError",
    "ListenAddressError",
    "ConsoleTokenError",
    "RunFinishedError",
    "RunNotEndedError",
    "RunInputsMismatchError",
    "RunExistsError",
    "RunMismatchError",
    "RunBook",
    "RunCancel",
    "RunDeleted",
    "RunRetry",
    "RunRecord",
    "RunResult",
    "Runs",
    "SchemaVersionError",
    "ServerUnavailableError",
    "StreamNotFoundError",
    "UnattributedBudgetsError",
    "UnfinishedLedgerError",
    "UnknownRunError",
    "WriteFailedError",
    "WriteTicket",
    "connect",
    "inspect_ledger",
    "observe_ledger",
    "open_ledger",
    "read_ledger_metrics",
]

_publish(globals(), __all__)  # tracebacks and docs name the public module
