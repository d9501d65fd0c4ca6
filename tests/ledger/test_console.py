"""``python -m ledger console``: its JSON against ``inspect --json``, its token, read-only; both backends."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
import pytest

from ledger import LmdbBackend
from streams import Graph, Key, MessageTx, NodeContext, Retry, Stream

from .conftest import Opener, without_times

ROOT = Path(__file__).resolve().parents[2]
N = Key("n", int)
NOTES = Key("notes", Stream[str])
COUNT = Key("count", int)
SENT = Key("sent", int)


def noting(*, fail: bool = False, hold: anyio.Event | None = None) -> Graph:
    """A writer of N notes, and a counter that starts once they are all confirmed; ``hold`` stops
    the counter after two notes (confirmed), leaving three to go."""
    g = Graph("noting", version="1", inputs=[N])

    @g.node(requires=[N], provides=[NOTES, SENT])
    async def write(ctx: NodeContext) -> None:
        for i in range(ctx[N]):
            await ctx.writer(NOTES).send(f"<b>note {i}</b><script>alert(1)</script>")
        ctx.set(SENT, ctx[N])

    @g.node(requires=[NOTES, SENT], provides=[COUNT], aspects=[Retry(2)])
    async def count(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], note: str) -> None:
            tx.set_state(tx.state + 1)
            tx.set(COUNT, tx.state)

        await ctx.handle_messages(NOTES, one, initial_state=0, limit=2 if hold is not None else None)
        if hold is not None:
            hold.set()
            await anyio.sleep_forever()
        if fail:
            raise LookupError("the <i>catalogue</i> is down")

    return g


def _target(ledger: Any) -> str:
    backend = ledger.backend
    return str(backend.env.path) if isinstance(backend, LmdbBackend) else str(backend.url)


def _cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "ledger", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@contextmanager
def console(target: str, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A console of ``target`` in a process of its own; its address (with its token, if any)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ledger", "console", target, "--port", "0", "--interval", "0.2", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving the console of "), process.stderr.read() if process.stderr else ""
        yield line.split(" at ", 1)[1].split(" (Ctrl-C", 1)[0]
    finally:
        process.terminate()
        process.communicate(timeout=30)


def request(
    url: str, path: str, *, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        connection.request(method, path, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def got(url: str, path: str) -> Any:
    status, headers, body = request(url, path)
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    return json.loads(body)


async def test_the_consoles_json_is_what_inspect_and_runs_report(open_any: Opener) -> None:
    held = anyio.Event()
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.start(noting(), {N: 3}, run_id="done")
        with pytest.raises(LookupError):
            await ledger.start(noting(fail=True), {N: 2}, run_id="broken")
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ledger.start(noting(hold=held), {N: 5}, run_id="held"))
            await held.wait()
            with console(target) as url:
                overview = await anyio.to_thread.run_sync(got, url, "/api/overview")
                report = await anyio.to_thread.run_sync(_cli, "inspect", target, "--json")
                listed = await anyio.to_thread.run_sync(got, url, "/api/runs")
                failed = await anyio.to_thread.run_sync(got, url, "/api/runs?status=failed")
                shown = await anyio.to_thread.run_sync(got, url, "/api/runs/broken")
                stream = await anyio.to_thread.run_sync(
                    got, url, f"/api/streams/{quote('held/write/notes', safe='')}"
                )
                messages = await anyio.to_thread.run_sync(
                    got, url, f"/api/streams/{quote('held/write/notes', safe='')}?messages=1&limit=2"
                )
                missing = await anyio.to_thread.run_sync(request, url, "/api/runs/nope")
                runs_list = await anyio.to_thread.run_sync(_cli, "runs", "list", target, "--json")
                runs_show = await anyio.to_thread.run_sync(_cli, "runs", "show", target, "broken", "--json")
            tg.cancel_scope.cancel()
    by_name = {f"{s['scope']}/{s['node']}/{s['key']}": s for s in report["streams"]}
    assert {s["stream"] for s in overview["streams"]} == set(by_name)
    for s in overview["streams"]:
        inspected = {g["group"]: g for g in by_name[s["stream"]]["groups"]}
        assert {g["group"]: g["lag"] for g in s["groups"]} == {k: g["pending"] for k, g in inspected.items()}
    [held_count] = next(s for s in overview["streams"] if s["stream"] == "held/write/notes")["groups"]
    assert held_count["health"] == "lagging" and held_count["lag"] == 3  # two of five confirmed
    assert held_count["age_seconds"] is not None and held_count["age_seconds"] >= 0
    assert overview["runs"] == {"running": 1, "completed": 1, "failed": 1, "cancelled": 0}
    assert overview["attention"]["failed_runs"] == 1 and overview["attention"]["lagging"] >= 1
    # the runs, as runs list and runs show give them (read at other moments: times aside)
    assert without_times(listed) == without_times(runs_list)
    assert [r["run_id"] for r in failed] == ["broken"]
    assert without_times(shown) == without_times(runs_show)
    assert shown["topology"]["members"][0]["name"] == "count" and shown["status"] == "failed"
    [failure, *_] = [f for n in shown["nodes"] for f in n["failed"]]
    assert failure["message"] == "the <i>catalogue</i> is down"  # as data: the page sets it as text
    assert "messages" not in stream and stream["history"]["count"]  # contents only when asked
    assert [m["seq"] for m in messages["messages"]] == [4, 5]
    assert messages["messages"][0]["value"] == "<b>note 3</b><script>alert(1)</script>"
    assert missing[0] == 404


def test_a_console_off_loopback_needs_a_token_that_every_request_carries(tmp_path: Path) -> None:
    async def fill() -> None:
        from ledger import open_ledger

        async with open_ledger(tmp_path / "l") as ledger:
            await ledger.start(noting(), {N: 1}, run_id="r")

    anyio.run(fill)
    target = str(tmp_path / "l")
    refused = subprocess.run(
        [sys.executable, "-m", "ledger", "console", target, "--host", "0.0.0.0", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "STREAMLEDGER_CONSOLE_TOKEN"},
    )
    assert refused.returncode == 2 and "needs a token" in refused.stderr, refused.stderr
    with console(
        target, "--host", "0.0.0.0", env={**os.environ, "STREAMLEDGER_CONSOLE_TOKEN": "s3cret"}
    ) as url:
        assert url.endswith("/?token=s3cret")
        base = url.split("?", 1)[0].replace("0.0.0.0", "127.0.0.1")
        for path in ("/", "/console.js", "/api/overview", "/api/runs", "/api/events"):
            status, _, _ = request(base, path)
            assert status == 401, path
        assert request(base, "/api/overview", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert request(base, "/api/overview", headers={"Authorization": "Bearer s3cret"})[0] == 200
        status, headers, page = request(base, "/?token=s3cret")
        assert status == 200 and b"console.js" in page
        cookie = headers["set-cookie"]
        assert cookie.startswith("streamledger_console=s3cret;") and "HttpOnly" in cookie
        assert request(base, "/api/runs", headers={"Cookie": "streamledger_console=s3cret"})[0] == 200
        for method in ("POST", "PUT", "DELETE", "PATCH"):  # read-only, even with the token
            assert (
                request(base, "/api/runs", method=method, headers={"Authorization": "Bearer s3cret"})[0]
                == 405
            )


def test_the_pages_ship_in_the_package_load_only_from_the_console_and_never_parse_ledger_text(
    tmp_path: Path,
) -> None:
    async def fill() -> None:
        from ledger import open_ledger

        async with open_ledger(tmp_path / "l") as ledger:
            await ledger.start(noting(), {N: 1}, run_id="r")

    anyio.run(fill)
    with console(str(tmp_path / "l")) as url:
        status, headers, page = request(url, "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in headers["content-security-policy"]
        assert b"http" not in page  # nothing fetched from anywhere else
        status, headers, script = request(url, "/console.js")
        assert status == 200 and "javascript" in headers["content-type"]
        assert b"innerHTML" not in script and b"insertAdjacentHTML" not in script and b"eval(" not in script
        # one event per read of the ledger: pages update on them
        parts = urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        connection.request("GET", "/api/events")
        events = connection.getresponse()
        assert events.getheader("Content-Type") == "text/event-stream"
        lines = [events.fp.readline() for _ in range(2)]
        connection.close()
        assert lines[0] == b"event: read\n" and lines[1].startswith(b"data: ")
