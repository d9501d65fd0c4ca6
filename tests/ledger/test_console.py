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

import streams._store._marks as marks
from ledger import Ledger, LmdbBackend
from streams import (
    DeadLetter,
    Graph,
    Key,
    KeyedState,
    MessageTx,
    NodeContext,
    Retry,
    Stream,
    handle_messages,
    open_scope,
)

from ..ledger_command import ledger_command
from .conftest import Opener, without_times

ROOT = Path(__file__).resolve().parents[2]
N = Key("n", int)
KEYED = Key("keyed", Stream[int])
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


REJECTS = Key("rejects", Stream[DeadLetter[str]])
ALL_SENT = Key("all_sent", int)
TALLY = Key("tally", int)
DOUBLED = Key("doubled", int)
LABEL = Key("label", str)
SHOWN = Key("shown", str)


def intake(more: anyio.Event | None = None) -> Graph:
    """Notes written in two appends (the second once ``more`` is set), the bad ones dead-lettered,
    the good ones counted, and the count labelled in a Sub of two nodes."""
    summary = Graph("summary", version="1", inputs=[TALLY])

    @summary.node(requires=[TALLY], provides=[DOUBLED])
    async def double(ctx: NodeContext) -> None:
        ctx.set(DOUBLED, ctx[TALLY] * 2)

    @summary.node(requires=[DOUBLED], provides=[LABEL])
    async def label(ctx: NodeContext) -> None:
        ctx.set(LABEL, f"<b>{ctx[DOUBLED]}</b>")

    g = Graph("intake", version="1", inputs=[N], outlets=[REJECTS])

    @g.node(requires=[N], provides=[NOTES, ALL_SENT])
    async def write(ctx: NodeContext) -> None:
        notes = ctx.writer(NOTES)
        for i in range(ctx[N]):
            if i == ctx[N] // 2 and more is not None:
                await notes.flush()  # the first append confirmed, the second later: two marks
                await more.wait()
            await notes.send(f"bad <i>{i}</i>" if i % 2 else f"ok {i}")
        ctx.set(ALL_SENT, ctx[N])

    @g.node(requires=[NOTES, ALL_SENT], provides=[COUNT, REJECTS])
    async def check(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], note: str) -> None:
            if note.startswith("bad"):
                raise ValueError("not a good note")
            tx.set_state(tx.state + 1)
            tx.set(COUNT, tx.state)

        await ctx.handle_messages(NOTES, one, initial_state=0, attempts=1, dead_letter=REJECTS)

    g.sub("summary", summary, inlets={TALLY: COUNT}, outlets={LABEL: SHOWN})
    return g


#: The host's group of the dead letters: nobody in the graph reads them, so they stay kept.
SUPPORT = {REJECTS: ["support"]}


def _target(ledger: Any) -> str:
    backend = ledger.backend
    return str(backend.env.path) if isinstance(backend, LmdbBackend) else str(backend.url)


def _cli(*args: str) -> Any:
    done = ledger_command(*args)
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
    except BaseException as exc:  # what the console said, and how it ended, go with the failure
        code = process.poll()
        process.terminate()
        _, said = process.communicate(timeout=30)
        exc.add_note(f"the console {'ran on' if code is None else f'had exited {code}'}; its stderr: {said}")
        raise
    finally:
        if process.poll() is None:
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
            with console(target, "--lag-age", "1h") as url:  # however slow the machine, its notes are young
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
    assert held_count["lag"] == 3  # two of five confirmed
    assert held_count["age_seconds"] is not None and held_count["age_seconds"] >= 0
    # three waiting, the oldest young: a group at work, not one that needs a look
    assert held_count["health"] == "ok" and held_count["health_reason"].startswith("3 pending, oldest ")
    assert held_count["health_reason"].endswith(" (threshold 1h)")
    assert overview["runs"] == {"running": 1, "interrupted": 0, "completed": 1, "failed": 1, "cancelled": 0}
    assert overview["attention"]["failed_runs"] == 1 and overview["attention"]["lagging"] == 0
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
        assert "s3cret" not in url and url.endswith("/")  # the token is never printed
        base = url.replace("0.0.0.0", "127.0.0.1")
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


async def test_the_console_shows_dead_letters_outputs_on_demand_appends_and_filters_runs(
    open_any: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(marks, "MARK_SPACING_MS", 0)  # a mark per append, however close they come
    more = anyio.Event()
    more.set()
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.start(intake(more), {N: 4}, run_id="in-1", host_readers=SUPPORT)
        await ledger.start(noting(), {N: 1}, run_id="other")
        with console(target) as url:
            views = {
                path: await anyio.to_thread.run_sync(got, url, path)
                for path in (
                    "/api/overview",
                    "/api/dead-letters",
                    "/api/dead-letters?messages=1&limit=1",
                    f"/api/dead-letters?source={quote('in-1/write/notes', safe='')}",
                    "/api/dead-letters?source=elsewhere",
                    f"/api/streams/{quote('in-1/write/notes', safe='')}",
                    "/api/runs?graph=int*",
                    "/api/runs?since=2000-01-01T00:00:00Z",
                    "/api/runs?since=2999-01-01T00:00:00Z",
                    "/api/runs?until=2000-01-01",
                    "/api/runs/in-1",
                    "/api/runs/in-1?values=1",
                )
            }
            bad_time = await anyio.to_thread.run_sync(request, url, "/api/runs?since=yesterday")
            refused = {path: await anyio.to_thread.run_sync(request, url, path) for path in BAD_PARAMETERS}
            shown = await anyio.to_thread.run_sync(_cli, "runs", "show", target, "in-1", "--values", "--json")
    overview = views["/api/overview"]
    assert overview["attention"]["dead_lettered"] == 2
    assert overview["dead_letter_streams"] == ["in-1/check/rejects"]
    assert overview["graphs"] == ["intake", "noting"]
    # dead letters: where each came from, without its message unless asked
    letters = views["/api/dead-letters"]
    assert letters["streams"] == ["in-1/check/rejects"]
    where = [(x["source"], x["seq"], x["group"], x["node"], x["attempts"]) for x in letters["letters"]]
    assert sorted(where) == [
        ("in-1/write/notes", 2, "check", "check", 1),
        ("in-1/write/notes", 4, "check", "check", 1),
    ]
    assert all(x["error_type"].endswith("ValueError") and "message" not in x for x in letters["letters"])
    assert all(x["appended_at"] for x in letters["letters"])  # appended by a commit: marked all the same
    [latest] = views["/api/dead-letters?messages=1&limit=1"]["letters"]
    assert (latest["seq"], latest["message"]) == (4, "bad <i>3</i>")
    assert len(views[f"/api/dead-letters?source={quote('in-1/write/notes', safe='')}"]["letters"]) == 2
    assert views["/api/dead-letters?source=elsewhere"]["letters"] == []
    # the stream's append marks: its kept history, one per append here
    notes = views[f"/api/streams/{quote('in-1/write/notes', safe='')}"]
    seqs = [seq for seq, _ in notes["appends"]]
    assert seqs[0] == 1 and len(seqs) >= 2 and seqs == sorted(set(seqs)) and seqs[-1] <= 4
    assert all(isinstance(at, float) for _, at in notes["appends"])
    assert notes["dead_letter_streams"] == ["in-1/check/rejects"] and "messages" not in notes
    # runs by graph and by when they were created
    assert [r["run_id"] for r in views["/api/runs?graph=int*"]] == ["in-1"]
    assert {r["run_id"] for r in views["/api/runs?since=2000-01-01T00:00:00Z"]} == {"in-1", "other"}
    assert views["/api/runs?since=2999-01-01T00:00:00Z"] == [] == views["/api/runs?until=2000-01-01"]
    assert bad_time[0] == 400 and b"ISO 8601" in bad_time[2]
    # every view's every parameter, given what it cannot take (or a name it does not take): 400, and why
    for path, said in BAD_PARAMETERS.items():
        status, headers, body = refused[path]
        assert (status, headers["content-type"]) == (400, "application/json"), (path, body)
        assert said in json.loads(body)["error"], (path, body)
    # outputs only when asked, as runs show --values gives them
    assert all("outputs" not in n for n in views["/api/runs/in-1"]["nodes"])
    with_values = views["/api/runs/in-1?values=1"]
    assert without_times(with_values) == without_times(shown)
    outputs = {n["path"]: n.get("outputs") for n in with_values["nodes"]}
    assert outputs["summary/label"] == {"label": "<b>4</b>"}
    members = {m["name"]: m for m in with_values["topology"]["members"]}
    assert members["summary"]["graph"]["name"] == "summary"  # a Sub, drawn with its own nodes


_NOTES = quote("in-1/write/notes", safe="")
#: Each view of the console's JSON with a parameter it cannot take, and what its 400 says.
BAD_PARAMETERS = {
    "/api/overview?since=1h": "does not take since",
    "/api/events?limit=5": "does not take limit",
    "/api/runs?status=bogus": "status takes one of",
    "/api/runs?since=yesterday": "since",
    "/api/runs?until=soon": "until",
    "/api/runs?stauts=failed": "does not take stauts; it takes status, graph, since, until",
    "/api/runs/in-1?values=yes": "values takes 1 or 0",
    "/api/runs/in-1?value=1": "does not take value",
    "/api/dead-letters?limit=0": "limit takes a number of letters from 1 to 200",
    "/api/dead-letters?limit=abc": "limit takes",
    "/api/dead-letters?messages=true": "messages takes 1 or 0",
    "/api/dead-letters?sources=x": "does not take sources",
    f"/api/streams/{_NOTES}?limit=201": "limit takes a number of messages from 1 to 200",
    f"/api/streams/{_NOTES}?messages=2": "messages takes 1 or 0",
    f"/api/streams/{_NOTES}?group=check": "does not take group",
    f"/api/keys?stream={_NOTES}&group=check&limit=-1": "limit takes a number of keys",
    f"/api/keys?stream={_NOTES}&group=check&cursor=%25%25": "is no cursor",
    f"/api/keys?stream={_NOTES}&group=check&prefix=a&key=b": "not both",
    f"/api/keys?stream={_NOTES}": "keys takes a stream",
    f"/api/keys?stream={_NOTES}&group=check&after=x": "does not take after",
}


#: The keys :func:`keyed_totals` writes; key ``i`` holds ``(i + 1) * 10``.
KEYED_NAMES = ("a1", "a2", "a3", "a4", "a5", "b1", "b2")


async def keyed_totals(ledger: Ledger[Any]) -> None:
    """Group ``totals`` of stream ``shop/intake/keyed`` keeps :data:`KEYED_NAMES` in keyed state."""
    state = KeyedState(str, int)

    async def keep(tx: MessageTx[None], value: int) -> None:
        state.of(tx).put(KEYED_NAMES[value], (value + 1) * 10)

    async with open_scope(ledger.streams, scope="shop") as scope:
        stream = await scope.open_stream(KEYED, node="intake", groups=("totals",), resumable=True)
        for i in range(len(KEYED_NAMES)):
            stream.writer().send_nowait(i)
        await handle_messages(stream.reader("totals"), keep, keyed=state, limit=len(KEYED_NAMES))


async def test_the_console_pages_a_groups_keys_by_prefix_and_reads_one_on_demand(open_any: Opener) -> None:
    names = list(KEYED_NAMES)
    async with open_any() as ledger:
        target = _target(ledger)
        await keyed_totals(ledger)
    base = "/api/keys?stream=shop/intake/keyed&group=totals"
    with console(target) as url:
        pages, cursor = [], ""
        while True:
            page = await anyio.to_thread.run_sync(got, url, f"{base}&prefix=a&limit=2{cursor}")
            pages.append([(e["key"], e["value"]) for e in page["keys"]])
            if page["next"] is None:
                break
            cursor = f"&cursor={page['next']}"
        assert pages == [[("a1", 10), ("a2", 20)], [("a3", 30), ("a4", 40)], [("a5", 50)]]
        every = await anyio.to_thread.run_sync(got, url, base)
        assert [e["key"] for e in every["keys"]] == names and every["next"] is None
        one = await anyio.to_thread.run_sync(got, url, f"{base}&key=b2")
        assert one == {"stream": "shop/intake/keyed", "group": "totals", "key": {"key": "b2", "value": 70},
                       "found": True}  # fmt: skip
        none = await anyio.to_thread.run_sync(got, url, f"{base}&key=c1")
        assert none["found"] is False and none["key"] is None
        for query, status in (
            ("/api/keys?stream=shop/intake/keyed", 400),
            (f"{base}&limit=0", 400),
            (f"{base}&limit=-5", 400),
            (f"{base}&limit=abc", 400),
            (f"{base}&key=a1&prefix=a", 400),
            (f"{base}&cursor=%%%", 400),
            (f"{base}&prefix=b&cursor=c2Ex", 400),  # the cursor of a1, before the prefix b
            ("/api/keys?stream=shop/intake/other&group=totals", 404),
            ("/api/keys?stream=shop/intake/keyed&group=nobody", 404),
        ):
            answer, _, body = await anyio.to_thread.run_sync(request, url, query)
            assert answer == status and "error" in json.loads(body), (query, body)
