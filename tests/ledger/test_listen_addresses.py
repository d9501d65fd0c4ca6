"""Every network-facing command, and every console parameter, refuses a bad value in one line.

``console`` and ``metrics`` listen on an address: a port out of range or
not a number is a usage error, a port in use, an address that is not this
machine's and a host that does not resolve are :class:`~ledger.ListenAddressError`:
one line on stderr and exit 2, never a traceback. The console's JSON answers
a parameter it cannot take with 400 and the reason.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest

from ..ledger_command import ledger_command
from .test_console import N, console, noting, request

#: Commands that listen, each with what it needs besides its path (off loopback, a console needs a token).
LISTENERS = (("console", "--token", "t"), ("metrics",))


@pytest.fixture(scope="module")
def small_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("listen") / "l"

    async def fill() -> None:
        from ledger import open_ledger

        async with open_ledger(path) as ledger:
            await ledger.start(noting(), {N: 1}, run_id="r")

    anyio.run(fill)
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 another socket listens on for the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def _refused(*args: str) -> str:
    done = ledger_command(*args)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == "", (args, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert lines, args
    return lines[-1]


@pytest.mark.parametrize("command", LISTENERS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--port", "-1"), "is not a port"),
        (("--port", "99999"), "is not a port"),
        (("--port", "http"), "is not a port"),
        (("--host", "not.a.host.invalid"), "does not resolve"),
        (("--host", "192.0.2.1"), "cannot listen on 192.0.2.1"),  # TEST-NET-1: no machine's own
    ],
    ids=["negative-port", "port-past-65535", "port-not-a-number", "unresolvable-host", "foreign-address"],
)
def test_a_bad_address_is_one_line_and_exit_2(
    small_ledger: Path, command: tuple[str, ...], flags: tuple[str, ...], says: str
) -> None:
    line = _refused(*command, str(small_ledger), *flags)
    assert says in line


@pytest.mark.parametrize("command", LISTENERS, ids=lambda c: c[0])
def test_a_port_in_use_is_one_line_and_exit_2(
    small_ledger: Path, command: tuple[str, ...], busy_port: int
) -> None:
    line = _refused(*command, str(small_ledger), "--port", str(busy_port))
    assert line == f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use"


def test_every_console_parameter_with_a_bad_value_is_a_400_with_its_reason(small_ledger: Path) -> None:
    stream = quote("r/note/notes", safe="")
    bad = {
        "/api/runs?status=bogus": "status takes one of",
        "/api/runs?since=yesterday": "ISO 8601",
        "/api/runs?until=soon": "ISO 8601",
        "/api/dead-letters?limit=-5": "limit takes",
        "/api/dead-letters?limit=abc": "limit takes",
        "/api/dead-letters?limit=0": "limit takes",
        "/api/dead-letters?limit=201": "limit takes",
        f"/api/streams/{stream}?messages=1&limit=-5": "limit takes",
        f"/api/streams/{stream}?messages=1&limit=abc": "limit takes",
        "/api/keys?stream=r/note/notes": "keys takes a stream",
        "/api/keys?stream=r/note/notes&group=g&limit=abc": "limit takes",
    }
    with console(str(small_ledger)) as url:
        for path, says in bad.items():
            status, headers, body = request(url, path)
            assert status == 400, (path, body)
            assert headers["content-type"] == "application/json"
            assert says in json.loads(body)["error"], (path, body)
        for path in ("/api/runs?status=running", "/api/dead-letters?limit=200"):  # the edges are taken
            assert request(url, path)[0] == 200, path
