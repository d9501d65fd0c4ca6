"""The PostgreSQL ledger: the LMDB ledger's records and rules, on a server many workers share.

Install the ``postgres`` extra (psycopg 3). ``open_postgres(url)`` connects,
makes the tables in an empty database (or checks the schema of a ledger),
and yields a :class:`~ledger.Ledger` (over a :class:`PgBackend`) whose ``streams`` is a
:class:`~streams.StreamHooks` store, exactly as ``open_ledger(path)`` does
for a directory.
"""

# ruff: noqa: E402 - the package imports its modules once its extra is known to be installed

from streams.store import publish as _publish

from .._errors import require_extra as _require_extra

_require_extra("psycopg", "postgres", "ledger.postgres (the PostgreSQL ledger)")

from .._errors import LeaseLostError as LeaseLostError
from ._leases import Lease as Lease
from ._ledger import PgBackend as PgBackend
from ._ledger import open_postgres as open_postgres
from ._members import MemberReport as MemberReport
from ._members import PartitionLease as PartitionLease
from ._members import consume as consume
from ._nodes import PgNodeHooks as PgNodeHooks
from ._store import PgConnection as PgConnection
from ._store import describe_url as describe_url
from ._streams import PgStreamHooks as PgStreamHooks
from ._tools import TOOLS as TOOLS
from ._tools import migrate_url as migrate_url
from ._worker import work as work

__all__ = [
    "Lease",
    "LeaseLostError",
    "MemberReport",
    "PartitionLease",
    "PgBackend",
    "PgConnection",
    "PgNodeHooks",
    "PgStreamHooks",
    "TOOLS",
    "consume",
    "describe_url",
    "migrate_url",
    "open_postgres",
    "work",
]

_publish(globals(), __all__)
