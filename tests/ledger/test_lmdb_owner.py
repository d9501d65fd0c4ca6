"""Who owns an LMDB ledger: inspect and a refused open name its process, and a killed one is told apart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from ledger import LedgerLockedError, open_ledger

from ..ledger_command import ledger_command

ROOT = Path(__file__).resolve().parents[2]
OWNER = """
import sys, anyio
from ledger import open_ledger

async def main():
    async with open_ledger(sys.argv[1]):
        print("open", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)

anyio.run(main)
"""


def inspected(path: Path) -> dict[str, object]:
    done = ledger_command("inspect", str(path), "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


def test_the_owner_of_a_ledger_is_named_until_it_closes_and_a_killed_one_is_told_apart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"

    async def touch() -> None:
        async with open_ledger(path):
            pass

    anyio.run(touch)
    assert inspected(path)["owner"] is None  # closed: nobody owns it
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "open\n"
        said = inspected(path)["owner"]
        assert isinstance(said, dict)
        assert (said["pid"], said["host"], said["running"]) == (owner.pid, socket.gethostname(), True)
        with pytest.raises(
            LedgerLockedError, match=rf"owned by process {owner.pid} on {socket.gethostname()}"
        ):
            anyio.run(touch)
        text = ledger_command("inspect", str(path)).stdout
        assert f"owned by process {owner.pid} on {socket.gethostname()} since " in text
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.communicate()
    gone = inspected(path)["owner"]
    assert isinstance(gone, dict) and gone["pid"] == owner.pid and gone["running"] is False  # its file stayed
    anyio.run(touch)  # its lock went with it: another process owns the ledger now, then nobody
    assert inspected(path)["owner"] is None
