from __future__ import annotations

import types

import ledger
import ledger.graphs


def test_the_public_surface_is_exactly_all() -> None:
    public = {
        name
        for name, value in vars(ledger.graphs).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(ledger.graphs.__all__)


def test_public_objects_say_they_live_in_ledger_graphs() -> None:
    for name in ledger.graphs.__all__:
        value = getattr(ledger.graphs, name)
        if isinstance(value, type) or callable(value):
            # what ledger exports too (InvalidRunIdError) is named after ledger
            home = "ledger" if getattr(ledger, name, None) is value else "ledger.graphs"
            assert value.__module__ == home, name
