"""Naming a package's public classes and functions after the package that exports them."""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["publish"]


def publish(namespace: Mapping[str, Any], names: Iterable[str]) -> None:
    """Set ``__module__`` of each exported class and function to the exporting package.

    Call it at the end of a package's ``__init__`` as
    ``publish(globals(), __all__)``: tracebacks, reprs and docs then say
    ``ledger.graphs.DurableGraph``, not the private module it is defined in.
    """
    package = namespace["__name__"]
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type | types.FunctionType):  # not type aliases, whose module is fixed
            obj.__module__ = package
