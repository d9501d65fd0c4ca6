"""``--json`` on the commands that print a line for people: ``demo``, ``backup``, ``group move|remove``,
``metrics --once``, ``migrate`` and ``worker``, each parsed, on an LMDB path and a PostgreSQL URL where the
command takes both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from ledger import connect
from ledger._demo import MESSAGES
from ledger.postgres import open_postgres
from ledger.postgres._demo import FIRST, GRAPHS
from streams import Key, Stream, open_scope

from .test_cli import cli

STREAM = "s/n/numbers"


async def _fill(target: str) -> None:
    """``numbers``: 10 messages, group ``a`` acknowledged through 6, group ``b`` through none."""
    async with connect(target) as ledger, open_scope(ledger.streams, scope="s") as scope:
        stream = await scope.open_stream(Key("numbers", Stream[int]), node="n", groups=("a", "b"))
        for i in range(1, 11):
            await stream.writer().send(i)
        await stream.writer().finish()
        reader = stream.reader("a")
        for seq in range(1, 7):
            await reader.receive()
            await reader.ack(seq)


@pytest.fixture(params=["lmdb", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    found = str(tmp_path / "l") if request.param == "lmdb" else str(request.getfixturevalue("postgres_url"))
    anyio.run(_fill, found)
    return found


def printed(*args: str) -> list[Any]:
    """What ``args`` printed: a JSON value a line."""
    done = cli(*args)
    assert done.returncode == 0, (args, done.stderr)
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_group_changes_and_their_dry_runs_print_one_json_object(target: str) -> None:
    [would] = printed(
        "group", "move", target, STREAM, "a", "--to", "2", "--keep-state", "--dry-run", "--json"
    )
    assert would == {
        "action": "move",
        "stream": STREAM,
        "group": "a",
        "dry_run": True,
        "streams": [
            {
                "stream": STREAM,
                "acked_through": 6,
                "appended": 10,
                "exhausted": 0,
                "failing": 0,
                "next": 2,
                "handled_again": 5,
                "skipped": 0,
                "state": "kept",
            }
        ],
    }
    [moved] = printed("group", "move", target, STREAM, "a", "--to", "latest", "--clear-state", "--json")
    assert moved["dry_run"] is False and moved["streams"] == [
        {"stream": STREAM, "next": 11, "state": "cleared"}
    ]
    [gone] = printed("group", "remove", target, STREAM, "b", "--dry-run", "--json")
    assert gone["streams"][0]["acked_through"] == 0 and gone["action"] == "remove"
    [removed] = printed("group", "remove", target, STREAM, "b", "--json")
    assert removed == {
        "action": "remove",
        "stream": STREAM,
        "group": "b",
        "dry_run": False,
        "streams": [{"stream": STREAM}],
    }


def test_a_backup_prints_one_json_object(target: str, tmp_path: Path) -> None:
    destination = tmp_path / "copy"
    [copied] = printed("backup", target, str(destination), "--json")
    assert copied["destination"] == str(destination) and copied["sound"] and copied["problems"] == []
    records = sum(json.loads(cli("check", target, "--json").stdout)["records"].values())
    assert copied["records"] == records
    assert (copied["note"] is None) == (not target.startswith("postgresql://"))


def test_metrics_once_prints_the_reading_as_one_json_object(target: str) -> None:
    [reading] = printed("metrics", target, "--once", "--json")
    assert reading["up"] is True and reading["error"] is None
    lag = {
        point["attributes"]["messaging.consumer.group.name"]: point["value"]
        for point in reading["metrics"]["streamledger_ledger_consumer_lag"]
    }
    assert lag == {"a": 4, "b": 10}
    exposed = cli("metrics", target, "--once").stdout
    assert all(name in exposed for name in reading["metrics"])  # the names Prometheus sees


@pytest.mark.parametrize("backend", ["lmdb", "postgres"])
def test_the_demo_prints_its_figures_as_one_json_object(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = str(tmp_path / "l") if backend == "lmdb" else str(request.getfixturevalue("postgres_url"))
    [done] = printed("demo", where, "-n", "20", "--json")
    assert (done["orders"], done["billing_total"], done["invoices"], done["audit_count"]) == (20, 210, 20, 20)
    assert done["already_finished"] is False
    [again] = printed("demo", where, "-n", "20", "--json")
    assert again["already_finished"] is True and again["billing_total"] == 210


def test_migrate_and_a_worker_print_json(postgres_url: str) -> None:
    [made] = printed("migrate", postgres_url, "--json")
    assert made["from"] == 0 and made["to"] > 0 and made["changed"] is True
    [same] = printed("migrate", postgres_url, "--json")
    assert same == {**made, "from": made["to"], "changed": False}

    async def submit() -> None:
        async with open_postgres(postgres_url) as ledger:
            await ledger.submit(GRAPHS["demo-shard"], {MESSAGES: 5, FIRST: 1}, run_id="shard")

    anyio.run(submit)
    lines = printed(
        *("worker", postgres_url, "--graphs", "ledger.postgres._demo:GRAPHS"),
        *("--poll", "0.05", "--until-idle", "--json"),
    )
    assert [(line.get("run"), line.get("outcome")) for line in lines[:-1]] == [
        ("shard", "claimed"),
        ("shard", "completed"),
    ]
    assert all(line["at"].endswith("Z") for line in lines[:-1])
    assert lines[-1] == {"ended": 1}
