"""The console in a real headless Chromium, beside a running program: lag that falls, a run that
fails; a Sub drawn with its nodes, outputs and dead letters when asked, runs filtered; a group
lagging, and why."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest

import streams._store._marks as marks
from streams import Graph, Key, MessageTx, NodeContext, Stream

from ..browser import chromium, chromium_path
from .conftest import Opener
from .test_console import KEYED_NAMES, ROOT, SUPPORT, _target, console, intake, keyed_totals, noting
from .test_console_health import STREAM, Clock, append, oldest_unacked, watched

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed")

N = Key("n", int)
NOTES = Key("notes", Stream[str])
SENT = Key("sent", int)
COUNT = Key("count", int)
#: The overview's count of lagging groups.
LAGGING = "document.querySelector('[data-attention=lagging] b').textContent"
#: Where the screenshots docs/operating.md shows are written, with STREAMLEDGER_DOC_SCREENSHOTS=1.
SHOTS_FOR_DOCS = Path(__file__).resolve().parents[2] / "docs" / "images"


def checkout(release: anyio.Event, *, fail: bool) -> Graph:
    """Notes all written, then counted two at first and the rest once ``release`` is set."""
    g = Graph("checkout", version="1", inputs=[N])

    @g.node(requires=[N], provides=[NOTES, SENT])
    async def write(ctx: NodeContext) -> None:
        for i in range(ctx[N]):
            await ctx.writer(NOTES).send(f"<b>note {i}</b><script>document.title='owned'</script>")
        ctx.set(SENT, ctx[N])

    @g.node(requires=[NOTES, SENT], provides=[COUNT])
    async def count(ctx: NodeContext) -> None:
        async def one(tx: MessageTx[int], note: str) -> None:
            tx.set_state(tx.state + 1)
            tx.set(COUNT, tx.state)

        first = await ctx.handle_messages(NOTES, one, initial_state=0, limit=2)
        await release.wait()
        await ctx.handle_messages(NOTES, one, initial_state=first.state)
        if fail:
            raise LookupError("the <i>till</i> is offline")

    return g


async def test_the_console_shows_lag_falling_and_a_run_failing_live_in_a_browser(
    open_any: Opener, tmp_path: Path
) -> None:
    paid, broke = anyio.Event(), anyio.Event()
    async with open_any() as ledger, anyio.create_task_group() as tg:
        target = _target(ledger)

        async def run(graph: Graph, run_id: str) -> None:
            with contextlib.suppress(LookupError):  # the failure the page must show
                await ledger.start(graph, {N: 6}, run_id=run_id)

        tg.start_soon(run, checkout(paid, fail=False), "order-1")
        tg.start_soon(run, checkout(broke, fail=True), "order-2")
        # however slow the machine, the notes are young: lag that falls is a group at work
        with console(target, "--lag-age", "1h") as url, chromium(tmp_path / "profile") as page:

            async def on(method: Any, *args: Any) -> Any:
                return await anyio.to_thread.run_sync(method, *args)

            await on(page.open, url)
            # the overview: the two runs' groups are behind by four notes each, handling them: nothing
            # needs a look
            counts = (
                "[...document.querySelectorAll('main table tr')]"
                ".filter(r => r.cells.length === 9 && r.cells[1].textContent === 'count')"
            )
            at_work = (
                f"{counts}.length === 2 && {counts}.every(r => r.cells[3].textContent === '4'"
                " && r.querySelector('[data-status]').dataset.status === 'ok'"
                " && r.querySelector('.reason').textContent.startsWith('4 pending, oldest unacknowledged'))"
            )
            await on(page.until, f"{at_work} && {LAGGING} === '0'")
            await on(page.screenshot, tmp_path / "overview.png")
            # a stream's lag plot, while its group catches up: it moves without a reload
            notes = quote("order-1/write/notes", safe="")
            await on(page.value, f"location.hash = '#/stream/{notes}'")
            plot = "document.querySelector('.lag-plot')"
            await on(page.until, f"{plot} && {plot}.dataset.lastLag === '4' && {plot}.dataset.samples >= 2")
            paid.set()
            # (an early sample may have seen all six behind, before the first two were counted)
            await on(page.until, f"{plot}.dataset.lastLag === '0' && Number({plot}.dataset.maxLag) >= 4")
            assert (
                await on(
                    page.value, f"{plot}.querySelector('polyline').getAttribute('points').split(' ').length"
                )
                >= 3
            )
            await on(page.screenshot, tmp_path / "stream.png")
            # messages, only when asked (order-1's may be compacted: order-2 keeps its four unhandled):
            # markup in them is text, never run
            await on(page.value, f"location.hash = '#/stream/{quote('order-2/write/notes', safe='')}'")
            await on(page.until, "document.querySelector('h1').textContent === 'Stream order-2/write/notes'")
            await on(page.value, "document.getElementById('show-messages').click()")
            await on(
                page.until, "document.querySelectorAll('pre.message').length >= 4"
            )  # kept: 3 to 6 at least
            shown = await on(page.value, "document.querySelector('pre.message').textContent")
            assert "<script>document.title='owned'</script>" in shown
            assert await on(page.value, "document.querySelectorAll('#page script, #page b').length") == 0
            assert await on(page.value, "document.title") == "streamledger console"
            # a run's graph and timeline; it fails while the page is open
            await on(page.value, "location.hash = '#/run/order-2'")
            await on(page.until, "document.querySelectorAll('[data-node]').length === 2")
            await on(page.until, "document.querySelector('[data-node=write]').dataset.status === 'completed'")
            assert (
                await on(page.value, "document.querySelector('h1 [data-status]').dataset.status") == "running"
            )
            broke.set()
            await on(page.until, "document.querySelector('h1 [data-status]').dataset.status === 'failed'")
            await on(page.until, "document.querySelector('[data-node=count]').dataset.status === 'failed'")
            assert await on(page.value, "document.querySelectorAll('[data-bar]').length") >= 2
            failures = await on(page.value, "document.querySelector('main table').innerText")
            assert "LookupError" in failures and "the <i>till</i> is offline" in failures
            await on(page.screenshot, tmp_path / "run.png")
        tg.cancel_scope.cancel()
    _keep_shots(tmp_path, target, ("overview.png", "stream.png", "run.png"))


async def test_a_read_that_comes_while_the_page_draws_is_drawn_after_it(
    open_any: Opener, tmp_path: Path
) -> None:
    """The page's fetches answer late: a read's event arrives while it draws the read before."""
    target = await append(open_any, 3)
    oldest = await anyio.to_thread.run_sync(oldest_unacked, target)
    clock = Clock()
    async with watched(target, clock) as (watcher, url):
        with chromium(tmp_path / "profile") as page:

            async def on(method: Any, *args: Any) -> Any:
                return await anyio.to_thread.run_sync(method, *args)

            async def read_at(seconds: float) -> None:
                clock.now = oldest + seconds
                await on(watcher.read)

            await read_at(2)
            await on(page.open, url)
            await on(page.until, f"{LAGGING} === '0'")
            # from now on each answer reaches the page's code 3 s after the server gave it
            await on(
                page.value,
                "(() => { const real = window.fetch; window.answered = 0;"
                " window.fetch = (...args) => real(...args).then((answer) => { window.answered += 1;"
                " return new Promise((resolve) => setTimeout(() => resolve(answer), 3000)); });"
                " return true; })()",
            )
            await read_at(3)  # the page draws it: its overview is answered, still on its way
            await on(
                page.value,
                "new Promise((resolve) => { const check = setInterval(() => {"
                " if (window.answered > 0) { clearInterval(check); resolve(true); } }, 5); })",
            )
            await read_at(45)  # its event comes while the page draws the read before
            await on(page.until, f"{LAGGING} === '1'")


async def test_the_console_shows_a_group_lagging_and_why_in_a_browser(
    open_any: Opener, tmp_path: Path
) -> None:
    target = await append(open_any, 3)
    oldest = await anyio.to_thread.run_sync(oldest_unacked, target)
    clock = Clock()
    async with watched(target, clock) as (watcher, url):
        with chromium(tmp_path / "profile") as page:

            async def on(method: Any, *args: Any) -> Any:
                return await anyio.to_thread.run_sync(method, *args)

            async def read_at(seconds: float) -> None:
                """The console reads the ledger with the oldest order ``seconds`` old; the page follows."""
                clock.now = oldest + seconds
                await on(watcher.read)

            billing = "document.querySelector('.health[data-group=billing]')"
            shown = (
                f"{billing} && [{billing}.querySelector('[data-status]').dataset.status,"
                f" {billing}.querySelector('.reason').textContent]"
            )
            await read_at(2)
            await on(page.open, url)
            # three orders waiting two seconds: at work, and it says so
            await on(page.until, f"{billing} !== null && {LAGGING} === '0'")
            assert await on(page.value, shown) == [
                "ok",
                "3 pending, oldest unacknowledged message 2s old (threshold 30s)",
            ]
            rule = "document.getElementById('lag-rule').textContent"
            assert await on(page.value, rule) == (
                "a group is lagging when its oldest unacknowledged message is older than 30s, or its lag "
                "rose at each of the last 5 reads"
            )
            # the oldest waits 45 seconds: the page, never reloaded, counts it and says why
            await read_at(45)
            await on(page.until, f"{LAGGING} === '1'")
            assert await on(page.value, shown) == [
                "lagging",
                "oldest unacknowledged message 45s old (threshold 30s)",
            ]
            assert await on(page.value, "document.querySelector('[data-attention=lagging]').className") == (
                "card error"
            )
            await on(page.screenshot, tmp_path / "health.png")
            # the stream's page says the same beside its group's name
            await on(page.value, f"location.hash = '#/stream/{quote(STREAM, safe='')}'")
            await on(
                page.until, f"document.querySelector('h1').textContent === 'Stream {STREAM}' && {billing}"
            )
            assert await on(page.value, "document.querySelector('h2 .health') !== null")
            assert await on(page.value, shown) == [
                "lagging",
                "oldest unacknowledged message 45s old (threshold 30s)",
            ]
    _keep_shots(tmp_path, target, ("health.png",))


def _keep_shots(tmp_path: Path, target: str, names: tuple[str, ...]) -> None:
    """Check the screenshots are pictures; with STREAMLEDGER_DOC_SCREENSHOTS=1, copy them for the docs."""
    for name in names:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    if os.environ.get("STREAMLEDGER_DOC_SCREENSHOTS") == "1" and "postgres" not in target:
        SHOTS_FOR_DOCS.mkdir(exist_ok=True)  # the pictures of docs/operating.md, made here
        for name in names:
            shutil.copy(tmp_path / name, SHOTS_FOR_DOCS / f"console-{name}")


async def test_the_console_draws_subs_and_shows_outputs_dead_letters_and_filtered_runs_in_a_browser(
    open_any: Opener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(marks, "MARK_SPACING_MS", 0)  # a mark per append: the history has two
    more = anyio.Event()
    more.set()
    rows = "document.querySelectorAll('main table tbody tr').length"
    async with open_any() as ledger:
        target = _target(ledger)
        await ledger.start(intake(more), {N: 4}, run_id="in-1", host_readers=SUPPORT)
        await ledger.start(noting(), {N: 1}, run_id="other")
        with console(target) as url, chromium(tmp_path / "profile") as page:

            async def on(method: Any, *args: Any) -> Any:
                return await anyio.to_thread.run_sync(method, *args)

            async def on_demand(link: str, count: str, text: str, markup: str) -> None:
                """What a page shows only when asked: nothing before its link is followed, then text."""
                shown = "document.querySelectorAll('pre.message').length"
                assert await on(page.value, shown) == 0
                await on(page.value, f"document.getElementById('{link}').click()")
                await on(page.until, f"{shown} {count}")
                assert text in await on(page.value, "document.getElementById('page').innerText")
                assert await on(page.value, f"document.querySelectorAll('{markup}').length") == 0

            await on(page.open, f"{url}#/run/in-1")
            # the Sub drawn as a box holding its two nodes, each with its status
            await on(page.until, "document.querySelectorAll('[data-node]').length === 4")
            for node in ("write", "check", "summary/double", "summary/label"):
                status = f"document.querySelector('[data-node=\"{node}\"]').dataset.status"
                assert await on(page.value, status) == "completed", node
            assert await on(page.value, "document.querySelector('[data-sub=summary]').dataset.status") == (
                "completed"
            )
            # outputs only when asked, and markup in them is text
            await on_demand("show-outputs", ">= 4", "<b>4</b>", "#page b, #page i")
            await on(page.screenshot, tmp_path / "run-sub.png")
            # dead letters: where they came from, their messages only when asked
            await on(page.value, "location.hash = '#/dead-letters'")
            heading = "document.querySelector('h1').textContent"
            await on(page.until, f"{heading} === 'Dead letters' && {rows} === 2")
            await on_demand("show-letters", "=== 2", "bad <i>3</i>", "#page i")
            await on(page.screenshot, tmp_path / "dead-letters.png")
            # runs, by graph and by when they were created
            await on(page.value, "location.hash = '#/runs'")
            await on(page.until, f"document.querySelector('h1').textContent === 'Runs' && {rows} === 2")
            await on(page.value, "document.querySelector('[data-filter=\"graph=intake\"]').click()")
            await on(page.until, f"{rows} === 1")
            await on(page.value, "document.querySelector('[data-filter=\"within=3600\"]').click()")
            await on(page.until, "location.hash.includes('within=3600')")
            await on(page.until, f"{rows} === 1 && location.hash.includes('graph=intake')")
            # a stream's kept history of appends, from its marks
            await on(page.value, f"location.hash = '#/stream/{quote('in-1/write/notes', safe='')}'")
            plot = "document.querySelector('.appends-plot')"
            await on(page.until, f"{plot} && Number({plot}.dataset.marks) >= 2")
            assert await on(page.value, f"{plot}.querySelectorAll('polyline.appended').length") == 1
            assert await on(page.value, "document.querySelector('a.dead-letters').textContent") == (
                "2 dead-lettered"
            )
    _keep_shots(tmp_path, target, ("run-sub.png", "dead-letters.png"))


async def test_the_console_beside_the_demo_shows_its_run_complete_live(
    open_any: Opener, tmp_path: Path
) -> None:
    async with open_any() as ledger:  # an empty ledger for the console to open before the demo starts
        target = _target(ledger)
    with console(target) as url, chromium(tmp_path / "profile") as page:

        async def on(method: Any, *args: Any) -> Any:
            return await anyio.to_thread.run_sync(method, *args)

        await on(page.open, url)
        runs = "document.querySelector('a[href=\"#/runs?status={}\"] b').textContent"
        assert await on(page.value, runs.format("completed")) == "0"
        demo = await anyio.run_process(
            [sys.executable, "-m", "ledger", "demo", target, "--messages", "2000"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            check=False,
        )
        assert demo.returncode == 0, demo.stderr.decode()
        # the page, never reloaded, follows the runs to their end (one, or one a shard on
        # PostgreSQL): all handled, nothing behind
        done = f"{runs.format('running')} === '0' && Number({runs.format('completed')}) >= 1"
        cells = "[...document.querySelectorAll('main table td [data-status]')]"
        healthy = f"{cells}.every(s => s.dataset.status === 'ok')"
        await on(page.until, f"{done} && {healthy} && {LAGGING} === '0'")
        assert await on(page.value, f"{cells}.length") >= 2  # billing's and audit's, of every shard
        rows = "[...document.querySelectorAll('main table tr')]"
        orders = (
            f"{rows}.filter(r => r.innerText.includes('/source/orders') && r.cells.length === 6)"
            ".map(r => Number(r.cells[2].innerText))"
        )
        assert sum(await on(page.value, orders)) == 2000  # the streams table's appended column
        # a run of it, with its three nodes completed
        await on(page.value, "location.hash = '#/runs?status=completed'")
        first = "document.querySelector('main table tbody a')"
        await on(page.until, f"document.querySelector('h1').textContent === 'Runs' && {first}")
        await on(page.value, f"{first}.click()")
        completed = "document.querySelectorAll('[data-node][data-status=completed]').length"
        await on(page.until, f"{completed} === 3")


async def test_the_console_pages_a_groups_keyed_state_by_prefix_and_shows_one_key_in_a_browser(
    open_any: Opener, tmp_path: Path
) -> None:
    rows = "document.querySelectorAll('main table tbody tr')"
    first_keys = f"Array.from({rows}).map((r) => r.cells[0].textContent).join(' ')"
    async with open_any() as ledger:
        target = _target(ledger)
        await keyed_totals(ledger)
        with console(target) as url, chromium(tmp_path / "profile") as page:

            async def on(method: Any, *args: Any) -> Any:
                return await anyio.to_thread.run_sync(method, *args)

            keyed = quote("shop/intake/keyed", safe="")
            # from the stream's page to its group's keys, every one of them
            await on(page.open, f"{url}#/stream/{keyed}")
            await on(page.until, "document.querySelector('[data-keys=totals]') !== null")
            await on(page.value, "document.querySelector('[data-keys=totals]').click()")
            await on(page.until, "document.querySelector('h1').textContent === 'Keyed state of totals'")
            await on(page.until, f"{first_keys} === {' '.join(KEYED_NAMES)!r}")
            # by prefix, two at a time, page after page
            await on(page.value, f"location.hash = '#/keys/{keyed}/totals?prefix=a&limit=2'")
            pages = []
            for expected in ("a1 a2", "a3 a4", "a5"):
                await on(page.until, f"{first_keys} === {expected!r}")
                pages.append(await on(page.value, f"{rows}[0].cells[1].textContent"))
                if expected == "a1 a2":
                    await on(page.screenshot, tmp_path / "keys.png")
                if expected != "a5":
                    await on(page.value, "document.getElementById('keys-next').click()")
            assert pages == ["10", "30", "50"]
            assert await on(page.value, "document.getElementById('keys-next')") is None
            # one key, asked for in the form; one that is not there
            for key, shown in (("b2", "70"), ("c1", None)):
                # typed and sent in one step, as a person does: a console read that lands between
                # two steps draws the form again, empty, and the submit would send the prefix
                await on(
                    page.value,
                    "(() => { const k = document.getElementById('keys-key'); k.focus();"
                    f" k.value = {key!r}; k.form.requestSubmit(); return true; }})()",
                )
                await on(page.until, f"location.hash.endsWith('key={key}')")
                if shown is None:
                    await on(page.until, "document.getElementById('no-key') !== null")
                else:
                    await on(page.until, f"{first_keys} === {key!r}")
                    assert await on(page.value, "document.querySelector('pre.value').textContent") == shown
    _keep_shots(tmp_path, target, ("keys.png",))
