"""``python -m ledger``: see :mod:`ledger._cli`."""

import sys

try:
    from ._cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still loading
    print("interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
