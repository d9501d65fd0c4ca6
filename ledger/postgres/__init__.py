"""The PostgreSQL ledger: the LMDB ledger's records and rules, on a server many workers share.

Install the ``postgres`` extra (psycopg 3). ``open_postgres(url)`` connects,
makes the tables in an empty database (or checks the schema of a ledger),
and yields a :class:`PostgresLedger` whose ``streams`` is a
:class:`~streams.StreamHooks` store, exactly as ``open_ledger(path)`` does
for a directory.
"""

from streams.store import publish as _publish

from .._errors import LedgerConflictError as LedgerConflictError
from .._errors import LedgerServerError as LedgerServerError
from .._errors import MissingSchemaError as MissingSchemaError
from .._errors import OutcomeUnknownError as OutcomeUnknownError
from ._leases import Lease as Lease
from ._leases import LeaseLostError as LeaseLostError
from ._ledger import PostgresLedger as PostgresLedger
from ._ledger import open_postgres as open_postgres
from ._nodes import PgNodeHooks as PgNodeHooks
from ._streams import PgStreamHooks as PgStreamHooks
from ._worker import work as work

__all__ = [
    "Lease",
    "LeaseLostError",
    "LedgerConflictError",
    "LedgerServerError",
    "MissingSchemaError",
    "OutcomeUnknownError",
    "PgNodeHooks",
    "PgStreamHooks",
    "PostgresLedger",
    "open_postgres",
    "work",
]

_publish(globals(), __all__)
