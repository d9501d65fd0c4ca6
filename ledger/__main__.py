"""``python -m ledger``: see :mod:`ledger._cli`."""

from ._cli import main

raise SystemExit(main())
