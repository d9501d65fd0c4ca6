"""The console's reads of an LMDB ledger take turns: a process opens one ledger once at a time, and
the watcher's thread and the requests' threads all read it (``ledger/console/_model.py``)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from ledger import LedgerEnv
from ledger._connect import tools_for
from ledger.console import Watcher, _model
from streams import StreamRef


def test_a_request_read_while_the_watcher_reads_waits_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = str(tmp_path / "l")
    LedgerEnv.open(target).close()
    real = tools_for(target)
    inside, release = threading.Event(), threading.Event()

    def held_inspect(where: str, values: bool) -> dict[str, Any]:
        env = LedgerEnv.open_readonly(where)  # the ledger open, as any read holds it
        try:
            inside.set()
            release.wait()
            return {"streams": [], "runs": [], "graph_runs": []}
        finally:
            env.close()

    monkeypatch.setattr(_model, "tools_for", lambda t: dataclasses.replace(real, inspect=held_inspect))
    watcher = Watcher(target)
    outcomes: list[object] = []

    def keys() -> None:
        try:
            outcomes.append(watcher._tools.keys(target, StreamRef("s", "n", "k"), "g", b"", None, 1))
        except Exception as exc:
            outcomes.append(exc)

    reading = threading.Thread(target=watcher._tools.inspect, args=(target, False))
    reading.start()
    inside.wait()
    asking = threading.Thread(target=keys)
    asking.start()
    release.set()
    reading.join()
    asking.join()
    [outcome] = outcomes
    assert not isinstance(outcome, Exception) or "already open" not in str(outcome), outcome
