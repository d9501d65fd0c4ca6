"""The implementation of :mod:`ledger.testing`, which documents and exports it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._errors import UnfinishedLedgerError
from .lmdb._check import check_ledger
from .lmdb._env import LedgerEnv
from .lmdb._inspect import inspect_ledger

__all__ = ["HistoryViolation", "LedgerHistory", "kill_until_done"]


#: How check_ledger names a database missing because the ledger's creation was cut short.
_INTERRUPTED_CREATION = "the ledger's creation was interrupted"


class HistoryViolation(AssertionError):
    """The ledger after a kill is damaged, or went back on what it had confirmed."""


def kill_until_done(
    command: Sequence[str],
    *,
    kills: int,
    after_kill: Callable[[], None] | None = None,
    max_delay: float = 1.0,
    seed: int | None = None,
    timeout: float = 600.0,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Kill ``command`` with SIGKILL at random moments ``kills`` times, then let it finish.

    Each run is killed after a random delay of up to ``max_delay`` seconds
    (waiting on the process, which may finish first); ``after_kill`` runs
    after each kill. The last run must exit 0 within ``timeout`` seconds.
    ``cwd`` and ``env`` are the command's working directory and environment.
    Returns how many kills landed.
    """
    rng = random.Random(seed)
    landed = 0
    for _ in range(kills):
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            process.wait(timeout=rng.uniform(0, max_delay))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            landed += 1
            if after_kill is not None:
                after_kill()
        else:
            _finished(process, command)
            return landed
        finally:
            if process.stderr is not None:
                process.stderr.close()
    final = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if final.returncode != 0:
        raise HistoryViolation(
            f"{command[0]} … exited {final.returncode} after {landed} kills: {final.stderr[-500:]}"
        )
    return landed


def _finished(process: subprocess.Popen[str], command: Sequence[str]) -> None:
    if process.returncode != 0:
        error = process.stderr.read() if process.stderr is not None else ""
        raise HistoryViolation(f"{command[0]} … exited {process.returncode} on its own: {error[-500:]}")


class LedgerHistory:
    """What a ledger confirmed, observed after every kill: it must be sound and never move back."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.observations = 0
        self._streams: dict[tuple[str, str, str], dict[str, Any]] = {}

    def observe(self) -> None:
        """Read the ledger now (nothing may be running on it) and compare it with what was seen before."""
        if not (self.path / "data.mdb").exists():
            return  # killed before the ledger was created
        try:
            env = LedgerEnv.open_readonly(self.path, verify=False)  # check says what is damaged
        except UnfinishedLedgerError:
            if not self._streams and not self.observations:
                return  # killed while the ledger was created, before its first commit: nothing confirmed
            raise HistoryViolation(f"ledger {self.path} held records, and now holds no ledger") from None
        try:
            report = check_ledger(env)
            if not report.sound:
                if not self._streams and all(_INTERRUPTED_CREATION in p for p in report.problems):
                    return  # killed while the ledger was being created: nothing confirmed yet
                raise HistoryViolation(f"ledger {self.path} is damaged: {'; '.join(report.problems[:5])}")
            streams = inspect_ledger(env)["streams"]
        finally:
            env.close()
        self.observations += 1
        for stream in streams:
            name = (stream["scope"], stream["node"], stream["key"])
            before = self._streams.get(name)
            if before is not None:
                self._compare(name, before, stream)
            self._streams[name] = stream

    def _compare(self, name: tuple[str, str, str], before: dict[str, Any], now: dict[str, Any]) -> None:
        where = "/".join(name)
        for field in ("appended", "generation"):
            if now[field] < before[field]:
                raise HistoryViolation(
                    f"stream {where}: {field} went back from {before[field]} to {now[field]}"
                )
        for terminal in ("finished", "failed"):
            if before[terminal] and not now[terminal]:
                raise HistoryViolation(f"stream {where} was {terminal} and is not any more")
        groups = {g["group"]: g for g in now["groups"]}
        for group in before["groups"]:
            current = groups.get(group["group"])
            if current is None:
                raise HistoryViolation(f"stream {where}: group {group['group']!r} disappeared")
            if current["acked_through"] < group["acked_through"]:
                raise HistoryViolation(
                    f"stream {where}, group {group['group']!r}: the frontier went back from "
                    f"{group['acked_through']} to {current['acked_through']}"
                )
            if (
                current["exhausted"] < group["exhausted"]
                and current["acked_through"] == group["acked_through"]
            ):
                raise HistoryViolation(
                    f"stream {where}, group {group['group']!r}: an exhausted budget was refilled"
                )
