"""The LMDB backend: a ledger in a local directory, one owning process, commits grouped by a writer thread."""

from streams.store import publish as _publish

from ._backend import LmdbBackend as LmdbBackend
from ._backend import LmdbRunBook as LmdbRunBook
from ._backend import open_ledger as open_ledger
from ._tools import TOOLS as TOOLS

__all__ = ["TOOLS", "LmdbBackend", "LmdbRunBook", "open_ledger"]

_publish(globals(), __all__)
