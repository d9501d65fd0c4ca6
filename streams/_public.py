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
    An object a package and one of its subpackages both export keeps the
    outer package's name (``ledger.LeaseLostError``, also exported by
    ``ledger.postgres``), whichever of them is imported first.
    """
    package = namespace["__name__"]
    for name in names:
        obj = namespace[name]
        # not type aliases, whose module is fixed
        if isinstance(obj, type | types.FunctionType) and not _inside(package, obj.__module__):
            obj.__module__ = package


def _inside(package: str, module: str) -> bool:
    """Whether ``package`` is a subpackage of ``module``, a public package (no part private)."""
    public = not any(part.startswith("_") for part in module.split("."))
    return public and package.startswith(module + ".")
