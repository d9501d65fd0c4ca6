"""``python -m ledger demo URL --workers K``: the demo's shards run by worker processes, resumable."""

from __future__ import annotations

from ledger.postgres._demo import _shards

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


def test_workers_on_an_lmdb_path_are_a_usage_error(tmp_path: object) -> None:
    done = cli("demo", str(tmp_path), "--workers", "2")
    assert done.returncode == 2 and "--workers runs the demo on a PostgreSQL URL" in done.stderr
