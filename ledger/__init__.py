"""streamledger's durable store: an embedded LMDB ledger for streams, nodes and graph runs."""

from streams import __version__ as __version__
from streams.store import publish as _publish

from ._connect import connect as connect
from ._env import LedgerEnv as LedgerEnv
from ._env import WriteTicket as WriteTicket
from ._errors import CorruptRecordError as CorruptRecordError
from ._errors import DamagedLedgerError as DamagedLedgerError
from ._errors import LedgerClosedError as LedgerClosedError
from ._errors import LedgerError as LedgerError
from ._errors import LedgerInUseError as LedgerInUseError
from ._errors import LedgerLockedError as LedgerLockedError
from ._errors import LedgerPathError as LedgerPathError
from ._errors import LedgerReadOnlyError as LedgerReadOnlyError
from ._errors import LedgerUnreachableError as LedgerUnreachableError
from ._errors import MapFullError as MapFullError
from ._errors import MissingRecordError as MissingRecordError
from ._errors import NotALedgerError as NotALedgerError
from ._errors import SchemaVersionError as SchemaVersionError
from ._errors import UnattributedBudgetsError as UnattributedBudgetsError
from ._errors import UnfinishedLedgerError as UnfinishedLedgerError
from ._errors import WriteFailedError as WriteFailedError
from ._inspect import inspect_ledger as inspect_ledger
from ._ledger import Ledger as Ledger
from ._ledger import open_ledger as open_ledger
from ._nodes import LmdbNodeHooks as LmdbNodeHooks
from ._runs import RunActiveError as RunActiveError
from ._runs import RunAspectsMismatchError as RunAspectsMismatchError
from ._runs import RunExistsError as RunExistsError
from ._runs import RunMismatchError as RunMismatchError
from ._runs import RunRecord as RunRecord
from ._runs import RunResult as RunResult
from ._runs import Runs as Runs
from ._runs import UnknownRunError as UnknownRunError
from ._streams import LmdbStreamHooks as LmdbStreamHooks

__all__ = [
    "connect",
    "CorruptRecordError",
    "DamagedLedgerError",
    "Ledger",
    "LedgerClosedError",
    "LedgerEnv",
    "LedgerError",
    "LedgerInUseError",
    "LedgerLockedError",
    "LedgerReadOnlyError",
    "LedgerUnreachableError",
    "LmdbNodeHooks",
    "LmdbStreamHooks",
    "MapFullError",
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
