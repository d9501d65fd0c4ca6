"""Who owns an LMDB ledger: ``owner.json`` beside its data, written by the process that opened it.

The owner lock (a ``flock`` on the directory) says that some process owns
the ledger, not which; so the owner also writes its host, process id and
since when into ``owner.json`` (atomically: a new file renamed over the old)
once it holds the lock, and removes it when it closes the ledger. A process
killed keeps its file: a reader on the same host sees that the process is
gone and says so; on another host it cannot tell, and says what the file
says. Readers never touch the lock (a probe could make an owner's own open
fail), and the file decides nothing: it is what an operator is told.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Final

__all__ = ["OWNER_FILE", "clear_owner", "read_owner", "write_owner"]

OWNER_FILE: Final = "owner.json"


def write_owner(path: Path) -> None:
    """Say that this process owns the ledger at ``path`` (it holds the owner lock)."""
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    fresh = path / f".{OWNER_FILE}.{os.getpid()}"
    try:
        fresh.write_text(json.dumps(mine))
        os.replace(fresh, path / OWNER_FILE)
    except OSError:  # saying who owns it is a courtesy: a ledger opens without it
        fresh.unlink(missing_ok=True)


def clear_owner(path: Path) -> None:
    """This process no longer owns the ledger at ``path``: remove its file, if it is still its own."""
    try:
        said = json.loads((path / OWNER_FILE).read_text())
        if said.get("pid") == os.getpid() and said.get("host") == socket.gethostname():
            (path / OWNER_FILE).unlink()
    except (OSError, ValueError):
        pass


def read_owner(path: Path) -> dict[str, Any] | None:
    """The ledger's owner as its file says: host, pid, since (UTC), and whether it still runs.

    ``running`` is False for a process of this host that is gone (killed: its
    file stayed), None when it cannot be told (another host). None when no
    process said it owns the ledger.
    """
    try:
        said = json.loads((path / OWNER_FILE).read_text())
        host, pid, since = str(said["host"]), int(said["pid"]), float(said["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    running: bool | None = None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
            running = True
        except ProcessLookupError:
            running = False
        except PermissionError:  # another user's process: it exists
            running = True
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    return {"host": host, "pid": pid, "since": moment, "running": running}
