"""The CLI's views of a ledger: consumer groups, filters, messages, and watching, through subprocesses."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from ledger import open_ledger
from ledger._messages import with_rates
from streams import Key, Stream, open_scope

from .test_cli import cli

ROOT = Path(__file__).resolve().parents[2]


class Order(msgspec.Struct, frozen=True):
    id: int
    note: bytes


ORDERS = Key("orders", Stream[Order])


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger with 5 orders: group 'billing' handled 3 of them, group 'audit' none."""
    path = tmp_path_factory.mktemp("views") / "ledger"

    async def fill() -> None:
        async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="shop") as scope:
            stream = await scope.open_stream(ORDERS, node="intake", groups=("billing", "audit"))
            for i in range(1, 6):
                await stream.writer().send(Order(i, b"\x00\x01"))
            await stream.writer().flush()
            billing = stream.reader("billing")
            for _ in range(3):
                await billing.ack(await billing.receive())

    anyio.run(fill)
    return path


def test_the_groups_view_has_a_row_per_group_with_its_lag(shop: Path) -> None:
    table = cli("inspect", str(shop), "--groups")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = ["GROUP", "STREAM", "ACKED", "APPENDED", "LAG", "AGE", "EXHAUSTED", "DEAD", "STOPPED"]
    assert lines[0].split() == [*header, "LAST-ACTIVITY", "PARTITION", "OWNER"]
    rows = [line.split() for line in lines[1:]]
    assert [row[:5] + row[6:-3] for row in rows] == [
        ["audit", "shop/intake/orders", "0", "5", "5", "0", "0", "no"],
        ["billing", "shop/intake/orders", "3", "5", "2", "0", "0", "no"],
    ]
    assert all(re.fullmatch(r"\d+s", row[5]) for row in rows)  # appended seconds ago, never acked
    assert rows[0][-3] == "-"  # audit never acknowledged anything
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rows[1][-3])
    assert [row[-2:] for row in rows] == [["-", "-"], ["-", "-"]]  # a stream of its own: no partition, owner
    rows = json.loads(cli("inspect", str(shop), "--groups", "--json").stdout)
    assert [(r["group"], r["lag"]) for r in rows] == [("audit", 5), ("billing", 2)]


def test_inspect_filters_streams_and_groups_by_pattern(shop: Path) -> None:
    only_billing = json.loads(cli("inspect", str(shop), "--json", "--group", "bill*").stdout)
    assert [[g["group"] for g in s["groups"]] for s in only_billing["streams"]] == [["billing"]]
    no_stream = json.loads(cli("inspect", str(shop), "--json", "--stream", "*/payments").stdout)
    assert no_stream["streams"] == []
    no_group = json.loads(cli("inspect", str(shop), "--json", "--group", "nobody").stdout)
    assert no_group["streams"] == []  # a stream with no matching group is left out
    both = cli("inspect", str(shop), "--stream", "shop/*/orders", "--group", "audit")
    assert "stream shop/intake/orders" in both.stdout and "billing" not in both.stdout


def test_view_prints_the_kept_messages_as_json_lines(shop: Path) -> None:
    done = cli("messages", str(shop), "shop/intake/orders", "--from", "2", "--limit", "2")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    appended = [line.pop("appended_at") for line in lines]  # one flush: one batch, one time
    assert appended[0] == appended[1] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", appended[0])
    assert lines == [
        {"seq": 2, "value": {"id": 2, "note": "AAE="}},
        {"seq": 3, "value": {"id": 3, "note": "AAE="}},
    ]
    assert done.stderr == ""
    unknown = cli("messages", str(shop), "shop/intake/refunds")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [f"error: the ledger at {shop} holds no stream shop/intake/refunds"]


def _interruptible() -> None:
    """Ctrl-C's default for the command, as a terminal gives it: a suite started in the background
    (``pytest &``) ignores SIGINT, and an ignored signal stays ignored in the processes it starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_watch_shows_the_view_again_until_ctrl_c_which_ends_it_cleanly(shop: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-m", "ledger", "inspect", str(shop), "--groups", "--watch", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=_interruptible,
    )
    assert run.stdout is not None
    headers = 0
    while headers < 2:  # the view, shown twice
        line = run.stdout.readline()
        assert line, "the watch ended by itself"
        headers += line.startswith("GROUP ")
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 0 and "Traceback" not in err


def test_a_watch_of_the_groups_adds_their_rates_from_its_second_view(shop: Path) -> None:
    done = cli("inspect", str(shop), "--groups", "--watch", "0.01", "--count", "2")
    assert done.returncode == 0, done.stderr
    views = [
        view.splitlines()
        for view in re.split(r"^every 0\.01 s, Ctrl-C to stop: .*\n", done.stdout, flags=re.M)[1:]
    ]
    assert len(views) == 2  # --count 2: two views, then it ends by itself
    for view in views:
        assert view[0].split()[3:8] == ["APPENDED", "LAG", "AGE", "APPENDED/S", "HANDLED/S"]
    first, second = ([row.split()[6:8] for row in view[1:]] for view in views)
    assert first == [["-", "-"], ["-", "-"]]  # one view: nothing to count a rate from
    assert second == [["0.0", "0.0"], ["0.0", "0.0"]]  # nothing appended or handled in between
    watched = cli("inspect", str(shop), "--groups", "--json", "--watch", "0.01", "--count", "2")
    rows = [json.loads(line) for line in watched.stdout.splitlines() if line.startswith("[")]
    assert [[(r["appended_per_s"], r["handled_per_s"]) for r in view] for view in rows] == [
        [(None, None), (None, None)],
        [(0.0, 0.0), (0.0, 0.0)],
    ]
    alone = cli("inspect", str(shop), "--groups", "--count", "2")
    assert alone.returncode == 2 and "--count counts the views of --watch" in alone.stderr


def test_rates_are_counted_per_second_between_two_views() -> None:
    def row(group: str, stream: str, acked: int, appended: int) -> dict[str, object]:
        return {"group": group, "stream": stream, "acked_through": acked, "appended": appended}

    before = [row("billing", "s/n/orders", 10, 100), row("audit", "s/n/orders", 50, 100)]
    now = [
        row("billing", "s/n/orders", 30, 140),  # 20 handled, 40 appended, in 2 s
        row("audit", "s/n/orders", 20, 140),  # moved back: no rate to show
        row("new", "s/n/refunds", 5, 5),  # not in the view before
    ]
    rated = with_rates(now, before, 2.0)
    assert [(r["appended_per_s"], r["handled_per_s"]) for r in rated] == [
        (20.0, 10.0),
        (20.0, None),
        (None, None),
    ]
    assert all(r["appended_per_s"] is None for r in with_rates(now, None, 0.0))
