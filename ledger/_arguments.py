"""The types of the command line's arguments: each refuses bad input with a one-line usage error (exit 2)."""

from __future__ import annotations

import argparse
import re
from typing import Final

__all__ = ["age", "age_seconds", "port", "positive_float", "positive_int", "size"]


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


#: The suffixes ``--max-map-size`` takes, each a power of 1024.
_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(text: str) -> int:
    """A positive size in bytes: ``65536``, ``64K``, ``1M``, ``2G`` (binary units; ``KiB`` or ``KB`` too)."""
    digits = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = digits[-1:] if digits[-1:] in _UNITS else ""
    number = digits.removesuffix(unit) if unit else digits
    if not (number.isascii() and number.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (like 65536, 64K, 1M or 2G)")
    value = int(number) * _UNITS[unit]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1 byte")
    return value


def port(text: str) -> int:
    """A TCP port to listen on: 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (a whole number, 0 to 65535)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: 0 (any free one) to 65535")
    return value


def positive_float(text: str) -> float:
    """A number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value


#: An age as the command line writes one: a number and its unit, ``90s``, ``15m``, ``2h``, ``7d``.
_AGE: Final = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_AGE_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def age_seconds(text: str) -> float | None:
    """The seconds an age stands for (``90s``, ``15m``, ``2h``, ``7d``, ``1.5h``); None if it is none."""
    found = _AGE.match(text)
    return None if found is None else float(found[1]) * _AGE_UNITS[found[2]]


def age(text: str) -> float:
    """An age, in seconds: ``90s``, ``15m``, ``2h``, ``7d``."""
    seconds = age_seconds(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age (90s, 15m, 2h, 7d)")
    return seconds
