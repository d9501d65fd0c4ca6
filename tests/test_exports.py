"""The public surface: everything in __all__ exists, nothing private leaks, layering holds."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The public modules, each with ``__all__``.
PUBLIC = (
    *("streams", "streams.store", "streams.testing"),
    *("ledger", "ledger.graphs", "ledger.postgres", "ledger.testing"),
)


@pytest.mark.parametrize("name", PUBLIC)
def test_all_names_are_public_and_exist(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(set(module.__all__))
    for attr in module.__all__:
        assert not attr.startswith("_")
        assert hasattr(module, attr), f"{name}.{attr} is listed in __all__ but missing"
    public = {a for a in vars(module) if not a.startswith("_")}
    modules = {a for a in public if type(getattr(module, a)).__name__ == "module"}
    assert public - modules - set(module.__all__) == set(), "public names missing from __all__"


def test_streams_never_imports_ledger() -> None:
    for path in (ROOT / "streams").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "ledger" or n.startswith("ledger.") for n in names), path


def test_ledger_imports_only_the_public_modules_of_streams() -> None:
    for path in (ROOT / "ledger").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == "streams":
                    assert node.module in ("streams", "streams.store"), f"{path}: from {node.module}"
                    private = [a.name for a in node.names if a.name.startswith("_") and not _dunder(a.name)]
                    assert not private, f"{path}: imports {private} from {node.module}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("streams._"), f"{path}: import {alias.name}"


def _dunder(name: str) -> bool:
    """``__version__`` and its kind are public by convention, though they start with an underscore."""
    return name.startswith("__") and name.endswith("__")


def test_library_code_uses_anyio_not_asyncio() -> None:
    for package in ("streams", "ledger"):
        for path in (ROOT / package).rglob("*.py"):
            assert "import asyncio" not in path.read_text(), path


@pytest.mark.parametrize("name", ["streams", "ledger"])
def test_public_objects_say_they_live_in_their_package(name: str) -> None:
    module = importlib.import_module(name)
    for attr in module.__all__:
        obj = getattr(module, attr)
        if isinstance(obj, type | types.FunctionType):  # type aliases keep the module they name
            assert obj.__module__ == name, f"{name}.{attr} says it lives in {obj.__module__}"


def test_streams_and_streams_store_export_nothing_twice() -> None:
    """Programs import from ``streams``, store authors from ``streams.store``: each name lives in one."""
    engine, store = importlib.import_module("streams"), importlib.import_module("streams.store")
    assert set(engine.__all__) & set(store.__all__) == set()
    objects = {id(getattr(engine, name)): name for name in engine.__all__}
    twice = [name for name in store.__all__ if id(getattr(store, name)) in objects]
    assert twice == [], f"exported by streams under another name too: {twice}"


@pytest.mark.parametrize("name", ["ledger.graphs", "ledger.lmdb", "ledger.postgres", "ledger.testing"])
def test_ledger_subpackages_share_objects_only_as_ledger_names_them(name: str) -> None:
    """A subpackage's object that ``ledger`` also exports is the same one, named after ``ledger``."""
    root, sub = importlib.import_module("ledger"), importlib.import_module(name)
    for attr in sub.__all__:
        obj = getattr(sub, attr)
        if isinstance(obj, type | types.FunctionType) and attr in root.__all__:
            assert getattr(root, attr) is obj and obj.__module__ == "ledger", f"{name}.{attr}"


def _private_classes(hint: Any, found: set[str]) -> None:
    """The library's classes ``hint`` names that no public module exports (their module is private)."""
    if isinstance(hint, type):
        parts = hint.__module__.split(".")
        if parts[0] in ("streams", "ledger") and any(part.startswith("_") for part in parts):
            found.add(f"{hint.__module__}.{hint.__qualname__}")
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        _private_classes(origin, found)
    for arg in typing.get_args(hint):
        _private_classes(arg, found)


def _hints(fn: Any) -> dict[str, Any]:
    """``fn``'s annotations, with names imported only for type checking found in the library's modules."""
    try:
        return typing.get_type_hints(fn)
    except NameError:
        names: dict[str, Any] = {}
        for module_name, module in list(sys.modules.items()):
            if module is not None and module_name.split(".")[0] in ("streams", "ledger"):
                for key, value in vars(module).items():
                    if isinstance(value, type | typing.TypeVar):
                        names.setdefault(key, value)
        return typing.get_type_hints(fn, localns=names)


def test_public_attributes_show_no_object_of_a_private_module() -> None:
    """What a public class's properties and attributes hand out is public too (``ManagedStream.core`` was
    not: an engine object)."""
    leaks: dict[str, set[str]] = {}
    for name in PUBLIC:
        module = importlib.import_module(name)
        for attr in module.__all__:
            cls = getattr(module, attr)
            if not isinstance(cls, type) or issubclass(cls, BaseException):
                continue
            for member in dir(cls):
                if member.startswith("_"):
                    continue
                raw = inspect.getattr_static(cls, member)
                found: set[str] = set()
                if isinstance(raw, property) and raw.fget is not None:
                    _private_classes(_hints(raw.fget).get("return"), found)
                elif isinstance(raw, types.MemberDescriptorType):  # a slot, typed by __init__'s parameter
                    _private_classes(_hints(cls.__init__).get(member), found)
                if found:
                    leaks[f"{name}.{attr}.{member}"] = found
    assert leaks == {}


def test_the_private_attribute_check_finds_a_leak() -> None:
    class Leaky:
        @property
        def core(self) -> Any:  # annotated below with an engine class no public module exports
            return None

    from streams._stream import StreamCore

    Leaky.core.fget.__annotations__["return"] = StreamCore  # type: ignore[attr-defined]
    found: set[str] = set()
    _private_classes(_hints(Leaky.core.fget).get("return"), found)  # type: ignore[attr-defined]
    assert found == {"streams._stream.StreamCore"}
