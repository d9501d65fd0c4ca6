"""``python -m ledger demo URL --workers K``: the demo's shards run by worker processes, resumable."""

from __future__ import annotations

import json

import anyio
import pytest

from ledger import DemoMismatchError
from ledger.postgres._demo import _shards, run_demo_postgres
from ledger.postgres._store import describe_url

from .test_cli import cli


def test_shards_cover_every_order_once() -> None:
    for messages, count in ((10, 3), (2, 4), (1000, 8), (7, 7)):
        ranges = _shards(messages, count)
        covered = [o for first, n in ranges for o in range(first, first + n)]
        assert covered == list(range(1, messages + 1)) and len(ranges) == min(messages, count)


def test_the_demo_on_a_url_with_two_workers_gives_the_uninterrupted_answer_once(postgres_url: str) -> None:
    done = cli("demo", postgres_url, "--messages", "3000", "--workers", "2", timeout=300)
    assert done.returncode == 0, done.stderr
    figures = "3000 orders, billing total 4501500, 3000 invoices, audit count 3000"
    assert done.stdout.startswith(f"demo finished: {figures}; "), done.stdout
    again = cli("demo", postgres_url, "--messages", "3000", "--workers", "3", timeout=300)
    assert again.returncode == 0 and "already finished; nothing changed: " + figures in again.stdout
    assert "options=" not in again.stdout  # the ledger is named by database and host only
    other = cli("demo", postgres_url, "--messages", "10", timeout=300)
    assert other.returncode == 2 and "holds a demo of 3000 orders, not 10" in other.stderr


def test_asking_a_finished_demo_for_another_size_is_a_typed_error_and_changes_nothing(
    postgres_url: str,
) -> None:
    done = cli("demo", postgres_url, "--messages", "1000", timeout=300)
    assert done.returncode == 0, done.stderr
    before = [cli(command, postgres_url, "--json").stdout for command in ("inspect", "check")]
    assert json.loads(before[1])["sound"]
    with pytest.raises(DemoMismatchError) as caught:  # the same error, raised in this process
        anyio.run(run_demo_postgres, postgres_url, 2000)
    assert str(caught.value) == (
        f"{describe_url(postgres_url)} holds a demo of 1000 orders, not 2000; "
        "run it again with --messages 1000, with --fresh to start a new one, or with --run-id ID beside it"
    )
    again = cli("demo", postgres_url, "--messages", "2000", timeout=300)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.splitlines() == [f"error: {caught.value}"]
    assert [cli(command, postgres_url, "--json").stdout for command in ("inspect", "check")] == before


def test_a_fresh_demo_replaces_the_first_and_another_run_id_runs_beside_it(postgres_url: str) -> None:
    assert cli("demo", postgres_url, "--messages", "40", timeout=300).returncode == 0
    fresh = cli("demo", postgres_url, "--messages", "30", "--fresh", "--json", timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout)["billing_total"] == 30 * 31 // 2
    beside = cli("demo", postgres_url, "--messages", "20", "--run-id", "other", "--json", timeout=300)
    assert beside.returncode == 0, beside.stderr
    figures = json.loads(beside.stdout)
    assert (figures["orders"], figures["billing_total"], figures["invoices"]) == (20, 210, 20)
    runs = {r["run_id"] for r in json.loads(cli("runs", "list", postgres_url, "--json").stdout)}
    assert runs == {"demo-shard-000", "demo-shard-001", "other-shard-000", "other-shard-001"}
    again = cli("demo", postgres_url, "--messages", "30", "--json", timeout=300)
    assert json.loads(again.stdout)["already_finished"] is True  # the first, as --fresh left it


def test_workers_on_an_lmdb_path_are_a_usage_error(tmp_path: object) -> None:
    done = cli("demo", str(tmp_path), "--workers", "2")
    assert done.returncode == 2 and "--workers runs the demo on a PostgreSQL URL" in done.stderr
