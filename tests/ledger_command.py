"""``python -m ledger`` as the tests run it: a process of its own per command, without the import each time.

A command is a new process, as an operator's is: its own pid (so the ledger's
owner record and a lease's owner are its own), its own stdin, stdout and
stderr, its exit code or the signal that ended it, and the interpreter's exit
(atexit, threads joined) when it is done. What it skips is loading the
libraries: a server process, started on first use and kept for the test
process's life, imports :mod:`ledger` and its commands once and forks a child
per command, which runs ``ledger/__main__.py`` exactly as ``python -m ledger``
does. That import is 0.3 to 0.5 s of every command on the 2-core machine, and
the suite runs several hundred commands.

The server is single-threaded (a fork copies only the forking thread, so a
threaded parent could hand its child a held lock) and has never opened a
ledger, a connection or an event loop; what each child shares with it is
modules already loaded. What an interpreter reads only as it starts
(``PYTHON*`` variables, ``-X`` options) is the server's: a test of those runs
``sys.executable`` itself, as do tests of the interpreter's start (an
interrupt while the command line loads) and of a command left running
(``--follow``, ``--watch``, the console), which are ``subprocess.Popen``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]

_lock = threading.Lock()
_server: subprocess.Popen[bytes] | None = None


def ledger_command(
    *args: str,
    cwd: Path | str = ROOT,
    timeout: float | None = 120,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m ledger ARGS``, run to its end, as :func:`subprocess.run` with ``capture_output`` would.

    stdout and stderr are pipes, as there; the environment is the test's as it
    is now, or ``env`` (what the interpreter reads only as it starts excepted);
    ``timeout`` kills the command and raises
    :class:`subprocess.TimeoutExpired`; ``check`` raises
    :class:`subprocess.CalledProcessError` on a non-zero exit.
    """
    command = [sys.executable, "-m", "ledger", *args]
    request = {
        "args": list(args),
        "cwd": str(Path(cwd).resolve()),
        "env": dict(os.environ if env is None else env),  # the test's environment now, as a child's
        "timeout": timeout,
    }
    with _lock:
        server = _started()
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(request).encode() + b"\n")
        server.stdin.flush()
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("the ledger command server ended")
        reply = json.loads(line)
        stdout, stderr = (_text(server.stdout.read(reply[n])) for n in ("stdout", "stderr"))
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(command, timeout or 0, output=stdout, stderr=stderr)
    done = subprocess.CompletedProcess(command, reply["returncode"], stdout, stderr)
    if check:
        done.check_returncode()
    return done


def _text(data: bytes) -> str:
    """What ``text=True`` makes of a pipe's bytes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _started() -> subprocess.Popen[bytes]:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
        )
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen[bytes]) -> None:
    assert server.stdin is not None
    server.stdin.close()  # the server ends at the end of its requests
    server.wait(timeout=30)


# The server: ``python tests/ledger_command.py``. A request is a JSON line on its stdin; a reply is a
# JSON line on its stdout (exit code, whether the command timed out, the lengths of its stdout and
# stderr), then those bytes.


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    import ledger._cli

    with contextlib.suppress(ImportError):  # the postgres extra: what a URL's command loads
        import ledger.postgres  # noqa: F401

    for line in requests:
        request = json.loads(line)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(err_r)
            _run(request, out_w, err_w)  # never returns: the child ends as ``python -m ledger`` does
        os.close(out_w)
        os.close(err_w)
        reply, out, err = _waited(pid, out_r, err_r, request["timeout"])
        replies.write(json.dumps({**reply, "stdout": len(out), "stderr": len(err)}).encode() + b"\n")
        replies.write(out + err)
        replies.flush()


def _waited(pid: int, out: int, err: int, timeout: float | None) -> tuple[dict[str, Any], bytes, bytes]:
    """Read the command's stdout and stderr to their ends and wait for it, killing it at ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ended = os.pidfd_open(pid)
    read: dict[int, bytearray] = {out: bytearray(), err: bytearray()}
    open_ = [out, err]
    timed_out = False
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select(open_ or [ended], [], [], left)
        if not ready:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        if not open_:
            break
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                read[fd] += chunk
            else:
                open_.remove(fd)
    _, status = os.waitpid(pid, 0)
    for fd in (ended, out, err):
        os.close(fd)
    reply = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
    return reply, bytes(read[out]), bytes(read[err])


def _run(request: dict[str, Any], stdout: int, stderr: int) -> None:
    stdin = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):  # the server's own pipes close in the child
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import runpy

    import ledger

    sys.path[0] = request["cwd"]  # ``-m`` puts the working directory first
    sys.argv = [str(Path(ledger.__file__).with_name("__main__.py")), *request["args"]]
    runpy.run_module("ledger", run_name="__main__", alter_sys=True)
    raise AssertionError("ledger/__main__.py returned without sys.exit")


if __name__ == "__main__":
    sys.path[0] = str(ROOT)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
