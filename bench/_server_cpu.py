"""CPU seconds of this process and of a PostgreSQL server on this machine, between two readings.

A run's wall time hides where its CPU went when the server shares the
machine's cores: a ledger that costs the server twice the CPU of a
hand-written queue is slower than the ratio of their rates says once the
cores are busy. The server's CPU is read from ``/proc``: the postmaster's
own time and its reaped children's (``cutime``, ``cstime``), plus every live
child's (backends, the WAL writer, the checkpointer). A server on another
machine cannot be read so; its figure is then ``None``.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

__all__ = ["CpuMeter"]

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 onwards), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def _server_seconds(postmaster: int) -> float | None:
    """The postmaster's CPU, its reaped children's and its live children's, read consistently.

    A child reaped while the children are scanned would be in neither sum:
    the reading is taken again until the postmaster's reaped time did not
    move across the scan.
    """
    for _ in range(100):
        own = _stat(postmaster)
        if own is None:
            return None
        # fields 14-17 of stat (utime, stime, cutime, cstime) are 11-14 here; the parent's pid is 1
        reaped = int(own[13]) + int(own[14])
        total = sum(int(own[i]) for i in (11, 12, 13, 14))
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == postmaster:
                total += int(fields[11]) + int(fields[12])
        after = _stat(postmaster)
        if after is None:
            return None
        if int(after[13]) + int(after[14]) == reaped:
            return total / _TICKS
    return None


def _client_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes it waited for
    return usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime


class CpuMeter:
    """Readings of the client's and the server's CPU seconds; :meth:`since` gives what a run spent."""

    def __init__(self, conn: Any) -> None:
        """``conn``: a psycopg connection to the server (its backend's parent is the postmaster)."""
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        fields = _stat(backend)
        self._postmaster = None if fields is None else int(fields[1])

    def read(self) -> tuple[float, float | None]:
        """(client seconds, server seconds or None) now."""
        server = None if self._postmaster is None else _server_seconds(self._postmaster)
        return _client_seconds(), server

    def since(self, before: tuple[float, float | None]) -> tuple[float, float | None]:
        """What was spent since ``before`` (a :meth:`read`): client and server CPU seconds."""
        client, server = self.read()
        spent = None if server is None or before[1] is None else server - before[1]
        return client - before[0], spent
