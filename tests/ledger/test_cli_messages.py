"""``messages`` from where an operator starts reading, on an LMDB path and a PostgreSQL URL: the last N
(``--tail``), after the last confirmed (``--from latest``, with ``--follow`` only what comes after),
and the messages of one partition key of a partitioned stream (``--key``, ``--key-field``)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ledger import connect
from streams import Key, Stream, open_scope
from streams.store import partition_for

from .test_cli import ROOT, cli

NUMBERS = "s/n/numbers"
ORDERS = "s/n/orders"
CUSTOMERS = ("ann", "bob", "cy", "dee", "eve")


class Order(msgspec.Struct, frozen=True):
    customer: str
    amount: int


async def _fill(target: str) -> None:
    """``numbers``: 1 to 10; ``orders``: 20 orders on 2 partitions by customer, amounts 1 to 20."""
    async with connect(target) as ledger, open_scope(ledger.streams, scope="s") as scope:
        numbers = await scope.open_stream(Key("numbers", Stream[int]), node="n", groups=("g",))
        for i in range(1, 11):
            await numbers.writer().send(i)
        await numbers.writer().finish()
        orders = await scope.open_partitioned(
            Key("orders", Stream[Order]), node="n", partitions=2, partition_key=lambda o: o.customer
        )
        for i in range(1, 21):
            await orders.writer().send(Order(CUSTOMERS[i % len(CUSTOMERS)], i), send_at=i)
        await orders.writer().finish()


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    found = str(tmp_path / "l") if request.param == "lmdb" else str(request.getfixturevalue("postgres_url"))
    anyio.run(_fill, found)
    return found


def values(target: str, stream: str, *flags: str) -> list[Any]:
    done = cli("messages", target, stream, *flags)
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["value"] for line in done.stdout.splitlines()]


def refused(*args: str) -> str:
    """The line saying why ``args`` were refused (after argparse's usage, for a usage error); exit 2."""
    done = cli(*args)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage: "), lines
    return lines[-1]


def test_tail_shows_the_last_confirmed_messages_and_from_latest_none(target: str) -> None:
    assert values(target, NUMBERS, "--tail", "3") == [8, 9, 10]
    assert values(target, NUMBERS, "--tail", "3", "--limit", "2") == [8, 9]
    assert values(target, NUMBERS, "--tail", "50") == list(range(1, 11))
    assert values(target, NUMBERS, "--tail", "0") == []
    assert values(target, NUMBERS, "--from", "latest") == []
    assert values(target, NUMBERS, "--from", "9") == [9, 10]  # a sequence, as before
    assert "'soon' is not a sequence" in refused("messages", target, NUMBERS, "--from", "soon")
    assert "'-1' is not a number of messages" in refused("messages", target, NUMBERS, "--tail", "-1")
    assert "not allowed with argument" in refused("messages", target, NUMBERS, "--from", "2", "--tail", "2")


def test_a_key_reads_its_partition_and_a_key_field_only_its_messages(target: str) -> None:
    amounts = {c: [i for i in range(1, 21) if CUSTOMERS[i % len(CUSTOMERS)] == c] for c in CUSTOMERS}
    for customer in CUSTOMERS:
        mine = [o["amount"] for o in values(target, ORDERS, "--key", customer, "--key-field", "customer")]
        assert mine == amounts[customer], customer
        partition = partition_for(customer, 2)  # as the writer chose
        shared = sorted(c for c in CUSTOMERS if partition_for(c, 2) == partition)
        whole = values(target, ORDERS, "--key", customer)
        assert sorted({o["customer"] for o in whole}) == shared
        assert len(whole) == sum(len(amounts[c]) for c in shared)
    last = values(target, ORDERS, "--key", "ann", "--key-field", "customer", "--tail", "2")
    assert [o["amount"] for o in last] == amounts["ann"][-2:]
    first = values(target, ORDERS, "--key", "ann", "--key-field", "customer", "--limit", "1")
    assert [o["amount"] for o in first] == amounts["ann"][:1]
    assert values(target, ORDERS, "--key", "zed", "--key-field", "customer") == []
    said = cli("messages", target, ORDERS, "--key", "ann").stderr
    assert f'showing {ORDERS}#{partition_for("ann", 2)}, the partition of key "ann"' in said


def test_a_key_on_a_stream_without_partitions_is_one_line(target: str) -> None:
    before = cli("inspect", target, "--json").stdout
    assert refused("messages", target, NUMBERS, "--key", "1").endswith(
        f"stream {NUMBERS} has no partitions: --key reads the partition of a key of a partitioned stream"
    )
    assert "is one partition of a partitioned stream: name the stream itself (s/n/orders)" in refused(
        "messages", target, f"{ORDERS}#0", "--key", "ann"
    )
    assert "holds no stream s/n/nothing" in refused("messages", target, "s/n/nothing", "--key", "1")
    assert "add --key" in refused("messages", target, ORDERS, "--key-field", "customer")
    assert json.loads(cli("inspect", target, "--json").stdout)["streams"] == json.loads(before)["streams"]


#: Put before the command: its first wait (after its first read) says so on stderr and waits for a line.
_WAIT_FOR_A_LINE = (
    "import sys, time; "
    "time.sleep = lambda s: (print('waiting', file=sys.stderr, flush=True), sys.stdin.readline()); "
    "import runpy; runpy.run_module('ledger', run_name='__main__')"
)


def _following(target: str) -> subprocess.Popen[str]:
    """``messages --from latest --follow`` on s/n/live, saying when it first waits (after its first read)."""
    command = ["messages", target, "s/n/live", "--from", "latest", "--follow", "--interval", "0.01"]
    return subprocess.Popen(
        [sys.executable, "-c", _WAIT_FOR_A_LINE, *command],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("backend", ["lmdb", "postgres"])
async def test_follow_from_latest_prints_only_what_is_confirmed_after_it_started(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target = str(tmp_path / "l") if backend == "lmdb" else str(request.getfixturevalue("postgres_url"))
    opened: AbstractAsyncContextManager[Any] = connect(target)
    async with opened as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(Key("live", Stream[int]), node="n", groups=("g",))
        writer = stream.writer()
        for value in (1, 2):
            await writer.send(value)
        await writer.flush()
        follower = _following(target)
        assert follower.stderr is not None and follower.stdin is not None
        said = await anyio.to_thread.run_sync(follower.stderr.readline)
        assert said == "waiting\n"  # it read the stream once (1 and 2 were there) and printed nothing
        await writer.send(3)
        await writer.finish()
        out, err = await anyio.to_thread.run_sync(lambda: follower.communicate("\n"))
    assert follower.returncode == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == [3]
    assert err.splitlines()[-1] == "stream s/n/live finished" and "Traceback" not in err
