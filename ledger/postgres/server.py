"""A private PostgreSQL server in a temporary directory, for tests, benchmarks and trying the store out.

It runs the machine's own PostgreSQL binaries (``pg_ctl`` on the PATH, or
Debian's ``/usr/lib/postgresql/<version>/bin``) on a Unix socket in its own
directory, with no TCP port, and removes everything when it stops.
``initdb`` refuses to run as root: as root the server runs as the
``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .._errors import ServerUnavailableError

__all__ = ["PrivateServer", "ServerUnavailableError", "find_binaries", "private_server"]


def find_binaries() -> Path | None:
    """The directory holding ``pg_ctl`` and ``initdb``: the PATH's, else the newest Debian one."""
    on_path = shutil.which("pg_ctl")
    if on_path is not None:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


class PrivateServer:
    """A running private server; :attr:`url` reaches its ``postgres`` database."""

    def __init__(self, root: Path, binaries: Path, user: str | None, *, fsync: bool = True) -> None:
        self.root = root
        self.binaries = binaries
        self.user = user  # run the server as this user (when we are root)
        #: Whether the server flushes its WAL to disk at each commit. Off, a commit still writes its WAL
        #: before it returns (``synchronous_commit`` stays on), so it survives any process's crash, the
        #: server's too, but not the machine's: for a suite that kills processes, never for figures.
        self.fsync = fsync
        self.data = root / "data"
        self.socket_dir = root / "socket"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """A URL of ``database`` on this server (libpq's form: the socket directory as host)."""
        return f"postgresql:///{database}?host={self.socket_dir}&user=postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.binaries / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise ServerUnavailableError(
                f"{args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        return done

    def start(self) -> None:
        self.socket_dir.mkdir()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            for path in (self.root, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.resume()

    def resume(self) -> None:
        """Start the server again after :meth:`stop`, on its data as the stop left it (crash recovery)."""
        options = " ".join(
            (
                "-c listen_addresses=''",
                f"-c unix_socket_directories='{self.socket_dir}'",
                "-c max_connections=200",
                "-c synchronous_commit=on",
                f"-c fsync={'on' if self.fsync else 'off'}",
            )
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``: as a crash, its sessions cut off)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")


@contextmanager
def private_server(*, fsync: bool = True) -> Iterator[PrivateServer]:
    """Start a private server in a new temporary directory; stop it and remove the directory after.

    ``fsync=False`` (:attr:`PrivateServer.fsync`) for a test suite: commits survive a killed process,
    not a lost machine.
    """
    binaries = find_binaries()
    if binaries is None:
        raise ServerUnavailableError(
            "no PostgreSQL binaries: install the postgresql package (pg_ctl and initdb)"
        )
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="streamledger-pg-"))
    os.chmod(root, 0o755)
    server = PrivateServer(root, binaries, user, fsync=fsync)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
