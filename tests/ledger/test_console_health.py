"""A consumer group's health in the console: lagging only when its work waits, and why; both backends.

Pending messages are a running group's normal state. The console calls a
group lagging when its oldest unacknowledged message is older than
``--lag-age``, or its lag rose at each of the last :data:`GROWING_READS`
reads; each group's JSON carries the reason, and the overview counts by that
rule. Here the :class:`Watcher` runs in the test's process behind a
:class:`ConsoleServer`, read when the test says with a clock the test sets,
between sessions of the ledger (an LMDB ledger opens once a process): the
ages and the reads are the test's, never the machine's speed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest

from ledger import open_ledger
from ledger._arguments import age
from ledger._connect import tools_for
from ledger.console import ConsoleServer, Watcher, health_of
from ledger.console._model import GROWING_READS, LAG_AGE
from streams import Key, MessageTx, Stream, handle_messages, open_scope

from ..ledger_command import ledger_command
from .conftest import Opener
from .test_console import _target, console, got, request

ORDERS = Key("orders", Stream[int])
#: The stream :func:`append` writes, and its one group.
STREAM, GROUP = "shop/intake/orders", "billing"


async def append(opener: Opener, count: int) -> str:
    """``count`` more orders for group billing, confirmed, in a session of the ledger of its own;
    the ledger's path or URL, as the console takes it."""
    async with opener() as ledger, open_scope(ledger.streams, scope="shop") as scope:
        stream = await scope.open_stream(ORDERS, node="intake", groups=(GROUP,), resumable=True)
        writer = stream.writer()
        for i in range(count):
            writer.send_nowait(i)
        await writer.flush()
        return _target(ledger)


async def handle(opener: Opener, count: int) -> None:
    """Billing handles ``count`` orders, in a session of the ledger of its own."""

    async def one(tx: MessageTx[None], order: int) -> None:
        pass

    async with opener() as ledger, open_scope(ledger.streams, scope="shop") as scope:
        stream = await scope.open_stream(ORDERS, node="intake", groups=(GROUP,), resumable=True)
        await handle_messages(stream.reader(GROUP), one, limit=count)


def oldest_unacked(target: str) -> float:
    """When billing's oldest unacknowledged order was appended, as the ledger holds it (to the second)."""
    report = tools_for(target).inspect(target, False)
    [stream] = report["streams"]
    [group] = stream["groups"]
    at = datetime.datetime.fromisoformat(group["oldest_unacked_at"].replace("Z", "+00:00"))
    return at.timestamp()


class Clock:
    """The watcher's time now, as the test sets it."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def watched(
    target: str, clock: Clock, *, lag_age: float = LAG_AGE
) -> AsyncIterator[tuple[Watcher, str]]:
    """A console of ``target`` in this process on a free port, which reads the ledger only when told:
    its watcher, and its address."""
    watcher = Watcher(target, lag_age=lag_age, clock=clock)
    server = ConsoleServer(watcher, "127.0.0.1", 0, None)
    server.start()
    try:
        yield watcher, server.url
    finally:
        await anyio.to_thread.run_sync(server.close)


async def read(watcher: Watcher, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read the ledger once; the overview the console serves then, and billing's group in it."""
    await anyio.to_thread.run_sync(watcher.read)
    overview = await anyio.to_thread.run_sync(got, url, "/api/overview")
    [stream] = overview["streams"]
    [group] = stream["groups"]
    return overview, group


def judged(group: dict[str, Any]) -> tuple[str, str]:
    return group["health"], group["health_reason"]


async def test_pending_messages_are_lagging_only_once_the_oldest_waits_past_the_lag_age(
    open_any: Opener,
) -> None:
    target = await append(open_any, 3)
    oldest = await anyio.to_thread.run_sync(oldest_unacked, target)
    clock = Clock()
    async with watched(target, clock) as (watcher, url):
        clock.now = oldest + 2
        young_overview, young = await read(watcher, url)
        clock.now = oldest + 45
        old_overview, old = await read(watcher, url)
        stream = await anyio.to_thread.run_sync(got, url, f"/api/streams/{quote(STREAM, safe='')}")
    async with watched(target, clock, lag_age=age("1m")) as (watcher, url):
        _, patient = await read(watcher, url)
    # three waiting for two seconds: a group at work, not a false alarm
    assert judged(young) == ("ok", "3 pending, oldest unacknowledged message 2s old (threshold 30s)")
    assert young["lag"] == 3 and young["age_seconds"] == 2.0
    assert young_overview["attention"]["lagging"] == 0 and young_overview["lag_age"] == 30.0
    # the same three, the oldest waiting 45 seconds: past the threshold, and said so
    assert judged(old) == ("lagging", "oldest unacknowledged message 45s old (threshold 30s)")
    assert old_overview["attention"]["lagging"] == 1
    [shown] = stream["groups"]
    assert judged(shown) == judged(old)  # a stream's page says the same
    # an operator who allows a minute sees it at work
    assert judged(patient) == ("ok", "3 pending, oldest unacknowledged message 45s old (threshold 1m)")


async def test_a_group_is_lagging_when_its_lag_rises_read_after_read_not_at_one_jump(
    open_any: Opener,
) -> None:
    target = await append(open_any, 1)
    oldest = await anyio.to_thread.run_sync(oldest_unacked, target)
    clock = Clock()
    seen: list[tuple[int, str]] = []
    async with watched(target, clock) as (watcher, url):

        async def step(appended: int = 0, handled: int = 0) -> dict[str, Any]:
            """Append and handle some, then read: two seconds later each time (every age stays young)."""
            if appended:
                await append(open_any, appended)
            if handled:
                await handle(open_any, handled)
            clock.now = oldest + 2 * (len(seen) + 1)
            _, group = await read(watcher, url)
            seen.append((group["lag"], group["health"]))
            return group

        await step()
        for _ in range(GROWING_READS - 1):
            await step(appended=2)
        assert [health for _, health in seen] == ["ok"] * GROWING_READS  # rising, but not for long enough
        growing = await step(appended=2)
        assert judged(growing) == (
            "lagging",
            f"lag grew from 1 to {1 + 2 * GROWING_READS} over the last {GROWING_READS} reads",
        )
        fell = await step(handled=4)  # it catches up a little: no longer growing
        steady = await step()  # nor when it holds still
        jumped = await step(appended=100)  # one step up, however large, is no trend
    assert [lag for lag, _ in seen] == [1, 3, 5, 7, 9, 11, 7, 7, 107]
    assert (fell["health"], steady["health"], jumped["health"]) == ("ok", "ok", "ok")
    assert jumped["health_reason"].startswith("107 pending, oldest unacknowledged message ")


#: How a reason says how long the oldest unacknowledged message waited, against the threshold of 30s.
WAITED = "oldest unacknowledged message {} old (threshold 30s)"
GREW = "lag grew from 1 to 6 over the last 5 reads"


@pytest.mark.parametrize(
    ("group", "age", "lags", "expected"),
    [
        pytest.param({"pending": 0}, None, [], ("ok", "nothing pending"), id="caught-up"),
        pytest.param({"pending": 4}, None, [4], ("ok", "4 pending"), id="no-mark-no-age"),
        pytest.param({"pending": 4}, 30.0, [], ("ok", "4 pending, " + WAITED.format("30s")), id="at-the-age"),
        pytest.param({"pending": 4}, 30.1, [], ("lagging", WAITED.format("30.1s")), id="past-it"),
        pytest.param({"pending": 4}, 5400.0, [], ("lagging", WAITED.format("1h30m")), id="hours"),
        pytest.param(
            {"pending": 6},
            1.0,
            [1, 2, 2, 3, 4, 6],
            ("ok", "6 pending, " + WAITED.format("1s")),
            id="a-flat-step",
        ),
        pytest.param(
            {"pending": 6}, 1.0, [1, 2, 3, 4, 6], ("ok", "6 pending, " + WAITED.format("1s")), id="too-few"
        ),
        pytest.param({"pending": 6}, 1.0, [9, 1, 2, 3, 4, 5, 6], ("lagging", GREW), id="rising"),
        pytest.param(
            {"pending": 6},
            95.0,
            [1, 2, 3, 4, 5, 6],
            ("lagging", f"{WAITED.format('1m35s')}; {GREW}"),
            id="both",
        ),
        pytest.param(
            {"pending": 6, "exhausted": 2},
            95.0,
            [],
            ("exhausted", "2 message(s) used up their attempts, left unacknowledged"),
            id="exhausted",
        ),
        pytest.param(
            {"pending": 6, "stopped": True, "exhausted": 2},
            95.0,
            [1, 2, 3, 4, 5, 6],
            ("stopped", "the group stopped reading this stream"),
            id="stopped",
        ),
    ],
)
def test_health_of_names_the_word_and_its_reason(
    group: dict[str, Any], age: float | None, lags: list[int], expected: tuple[str, str]
) -> None:
    assert GROWING_READS == 5  # the reasons above count five reads
    assert health_of({"stopped": False, "exhausted": 0, **group}, age=age, lags=lags) == expected


def test_the_lag_age_flag_takes_an_age_and_refuses_anything_else(tmp_path: Path) -> None:
    target = anyio.run(append, lambda: open_ledger(tmp_path / "l"), 1)
    for bad in ("abc", "30", "-5s", "5x", "1.s", ""):
        done = ledger_command("console", target, "--port", "0", f"--lag-age={bad}")
        assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, (
            bad,
            done.stderr,
        )
        line = done.stderr.strip().splitlines()[-1]
        assert line.endswith(f"argument --lag-age: {bad!r} is not an age (90s, 15m, 2h, 7d)"), line
    assert [age(text) for text in ("90s", "15m", "2h", "1.5h", "7d", "0s")] == [
        90,
        900,
        7200,
        5400,
        604800,
        0,
    ]
    with console(target) as url:
        assert got(url, "/api/overview")["lag_age"] == 30.0  # the default
    with console(target, "--lag-age", "15m") as url:
        assert got(url, "/api/overview")["lag_age"] == 900.0


async def test_a_view_whose_read_fails_is_a_500_with_the_reason_and_the_console_serves_on(
    open_any: Opener, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read that fails beside the owner (the ledger moved under it, a reader slot short) is
    answered 500 with what failed, never a connection closed without an answer; the next request
    is served."""
    target = await append(open_any, 3)
    async with watched(target, Clock()) as (watcher, url):
        await anyio.to_thread.run_sync(watcher.read)

        def fails(*args: Any, **kwargs: Any) -> Any:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(watcher, "_tools", dataclasses.replace(watcher._tools, messages=fails))
        path = f"/api/streams/{quote(STREAM, safe='')}?messages=1"
        status, headers, body = await anyio.to_thread.run_sync(request, url, path)
        overview = await anyio.to_thread.run_sync(got, url, "/api/overview")
    assert (status, headers["content-type"]) == (500, "application/json")
    assert json.loads(body) == {"error": "OSError: [Errno 5] Input/output error"}
    assert [s["stream"] for s in overview["streams"]] == [STREAM]
    assert "failed: OSError: [Errno 5] Input/output error" in capsys.readouterr().err
