"""Every module of ``streams`` and ``ledger`` uses another's objects through their public members only, and
no two of them import each other, however indirectly.

The engine's own, stricter rules (no import inside a function, its modules
by name) are ``tests/streams/test_engine_structure.py``; these are the rules
every module keeps. One module's private attribute (``x._name``, where
``x`` is not ``self`` or ``cls``) is read or written only by the module
that defines it; the one private member of another library read on purpose
is listed below with why.
"""

from __future__ import annotations

import re

import pytest

from .module_graph import MODULES, circles, import_graph, reaches

#: A private member of another library that a module reads on purpose: (module, expression) -> why.
FOREIGN = {
    ("ledger.graphs._quiescence", "run._iterator_instance"): (
        "pydantic-graph says nothing public of the tasks in flight at a yield; the module reads two "
        "fields of its iterator, on the releases VERIFIED_VERSIONS pins"
    ),
}


def _reaches_of(name: str) -> list[str]:
    found = []
    for reach in reaches(MODULES[name].read_text()):
        expression = re.sub(r"^line \d+: ", "", reach)
        if (name, expression) not in FOREIGN:
            found.append(reach)
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_uses_only_the_private_members_it_defines(name: str) -> None:
    assert _reaches_of(name) == []


def test_every_foreign_reach_listed_is_still_made() -> None:
    """A reach that is gone leaves the list: the list never excuses one that is not there."""
    for name, expression in FOREIGN:
        made = [re.sub(r"^line \d+: ", "", reach) for reach in reaches(MODULES[name].read_text())]
        assert expression in made, (name, expression)


def test_no_module_is_in_an_import_circle() -> None:
    """Counting every import: at module level, inside functions (a backend imported only when asked
    for) and under ``TYPE_CHECKING``."""
    assert circles(import_graph()) == []
