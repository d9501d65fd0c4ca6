"""streamledger's durable store: an embedded LMDB ledger for streams, nodes and graph runs."""

from streams import __version__ as __version__
from streams.store import publish as _publish

from ._backend import Backend as Backend
from ._backend import NodeStore as NodeStore
from ._committer import WriteTicket as WriteTicket
from ._connect import connect as connect
from ._errors import BackupDestinationError as BackupDestinationError
from ._errors import CorruptRecordError as CorruptRecordError
from ._errors import DamagedLedgerError as DamagedLedgerError
from ._errors import LedgerClosedError as LedgerClosedError
from ._errors import LedgerConflictError as LedgerConflictError
from ._errors import LedgerError as LedgerError
from ._errors import LedgerInUseError as LedgerInUseError
from ._errors import LedgerLockedError as LedgerLockedError
from ._errors import LedgerPathError as LedgerPathError
from ._errors import LedgerReadOnlyError as LedgerReadOnlyError
from ._errors import LedgerServerError as LedgerServerError
from ._errors import LedgerUnreachableError as LedgerUnreachableError
from ._errors import MapFullError as MapFullError
from ._errors import MissingRecordError as MissingRecordError
from ._errors import MissingSchemaError as MissingSchemaError
from ._errors import NotALedgerError as NotALedgerError
from ._errors import OutcomeUnknownError as OutcomeUnknownError
from ._errors import SchemaVersionError as SchemaVersionError
from ._errors import UnattributedBudgetsError as UnattributedBudgetsError
from ._errors import UnfinishedLedgerError as UnfinishedLedgerError
from ._errors import WriteFailedError as WriteFailedError
from ._ledger import Ledger as Ledger
from ._runs import RunActiveError as RunActiveError
from ._runs import RunAspectsMismatchError as RunAspectsMismatchError
from ._runs import RunExistsError as RunExistsError
from ._runs import RunMismatchError as RunMismatchError
from ._runs import RunRecord as RunRecord
from ._runs import RunResult as RunResult
from ._runs import Runs as Runs
from ._runs import UnknownRunError as UnknownRunError
from .lmdb import LmdbBackend as LmdbBackend
from .lmdb import open_ledger as open_ledger
from .lmdb._env import LedgerEnv as LedgerEnv
from .lmdb._inspect import inspect_ledger as inspect_ledger
from .lmdb._nodes import LmdbNodeHooks as LmdbNodeHooks
from .lmdb._streams import LmdbStreamHooks as LmdbStreamHooks

__all__ = [
    "Backend",
    "BackupDestinationError",
    "connect",
    "CorruptRecordError",
    "DamagedLedgerError",
    "Ledger",
    "LedgerClosedError",
    "LedgerEnv",
    "LedgerConflictError",
    "LedgerError",
    "LedgerServerError",
    "MissingSchemaError",
    "OutcomeUnknownError",
    "LedgerInUseError",
    "LedgerLockedError",
    "LedgerReadOnlyError",
    "LedgerUnreachableError",
    "LmdbBackend",
    "LmdbNodeHooks",
    "LmdbStreamHooks",
    "MapFullError",
    "NodeStore",
    "MissingRecordError",
    "NotALedgerError",
    "LedgerPathError",
    "RunActiveError",
    "RunAspectsMismatchError",
    "RunExistsError",
    "RunMismatchError",
    "RunRecord",
    "RunResult",
    "Runs",
    "SchemaVersionError",
    "UnattributedBudgetsError",
    "UnfinishedLedgerError",
    "UnknownRunError",
    "WriteFailedError",
    "WriteTicket",
    "inspect_ledger",
    "open_ledger",
]

_publish(globals(), __all__)  # tracebacks and docs name the public module
