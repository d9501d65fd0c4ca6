"""The conformance suite of stores: every behaviour a ``StreamHooks`` store must show, as checks.

Published through :func:`streams.testing.check_stream_store` and
:func:`streams.testing.stream_store_checks`; each module holds the checks of
one part of the contract (streams, handlers, lifecycles, values, runs of
commits). Importing this package registers them all.
"""

from . import dead_letters as dead_letters
from . import follow as follow
from . import groups as groups
from . import handle as handle
from . import keyed as keyed
from . import lifecycle as lifecycle
from . import partitions as partitions
from . import runs as runs
from . import streams as streams
from . import values as values
from ._support import CHECKS as CHECKS
from ._support import Check as Check
from ._support import World as World
