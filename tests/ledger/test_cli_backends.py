"""Every command of ``python -m ledger`` on an LMDB path and on a PostgreSQL URL: the same answers.

The same program fills a ledger of each backend; then each command runs on
both, and what it prints (its JSON, or its line) is compared with the
backend's own words (a path or a URL, a database's or a table's name) left
out. ``worker`` and ``migrate`` exist for PostgreSQL only (an LMDB ledger
has one owning process, and opens every schema it reads): they refuse a
path in one line.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import anyio
import psycopg

from ledger import connect

from .conftest import without_times
from .test_cli import cli
from .test_postgres_cli import fill, shown

STREAM = "shop/intake/orders"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = cli(*args)
    assert done.returncode == 0, (args, done.stderr)
    return done


def viewed(target: str, *extra: str) -> list[Any]:
    lines = run("messages", target, STREAM, *extra).stdout.splitlines()
    return [without_times(json.loads(line)) for line in lines]


def keys(target: str, *extra: str) -> list[Any]:
    return [json.loads(line) for line in run("keys", target, STREAM, "billing", *extra).stdout.splitlines()]


def state(target: str, *extra: str) -> list[Any]:
    lines = run("state", target, STREAM, "billing", *extra, "--json").stdout.splitlines()
    return [json.loads(line) for line in lines]


def groups(target: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = without_times(
        json.loads(run("inspect", target, "--groups", "--json").stdout)
    )
    return rows


def backed_up(target: str, destination: Path) -> str:
    """The backup's line, without where the ledger and its copy are, or the copy's format."""
    line = run("backup", target, str(destination)).stdout.strip()
    line = line.replace(str(destination), "DEST").split(" (")[0]
    return re.sub(r"^ledger .* copied to", "ledger copied to", line)


def both(tmp_path: Path, postgres_url: str) -> tuple[str, str]:
    path = str(tmp_path / "ledger")
    for target in (path, postgres_url):

        def opening(target: str = target) -> Any:
            return connect(target)

        anyio.run(fill, opening)
    return path, postgres_url


def test_every_command_answers_the_same_on_a_path_and_on_a_url(tmp_path: Path, postgres_url: str) -> None:
    path, url = both(tmp_path, postgres_url)
    key = lambda s: (s["scope"], s["node"], s["key"])  # noqa: E731

    def report(target: str) -> dict[str, Any]:
        found: dict[str, Any] = shown(target, "--values")
        found.pop("path")
        found["streams"].sort(key=key)
        filled_at_other_moments: dict[str, Any] = without_times(found)
        return filled_at_other_moments

    # inspect, with and without filters
    assert report(url) == report(path)
    assert without_times(shown(url, "--stream", "shop/*", "--group", "bill*")["streams"]) == without_times(
        shown(path, "--stream", "shop/*", "--group", "bill*")["streams"]
    )
    assert groups(url) == groups(path)
    # view, whole and in part
    assert viewed(url) == viewed(path) == [{"seq": n, "value": n} for n in range(1, 6)]
    assert viewed(url, "--from", "2", "--limit", "2") == viewed(path, "--from", "2", "--limit", "2")
    # keys, whole and by range
    assert keys(url) == keys(path) == [{"key": "even", "value": 2}, {"key": "odd", "value": 3}]
    assert keys(url, "--from", "f") == keys(path, "--from", "f") == [{"key": "odd", "value": 3}]
    assert keys(url, "--to", "odd") == keys(path, "--limit", "1") == [{"key": "even", "value": 2}]
    # state: one key, a prefix, every key
    assert state(url, "odd") == state(path, "odd") == [{"key": "odd", "value": 3, "found": True}]
    assert state(url, "none") == state(path, "none") == [{"key": "none", "value": None, "found": False}]
    assert state(url, "--prefix", "ev") == state(path, "--prefix", "ev") == [{"key": "even", "value": 2}]
    assert state(url, "--prefix", "x") == state(path, "--prefix", "x") == []
    assert state(url) == state(path) == keys(path)
    assert run("state", url, STREAM, "billing", "odd").stdout == '"odd": 3\n'
    assert run("state", path, STREAM, "billing", "none").stdout == '"none": no value\n'
    # check
    checked = {t: json.loads(run("check", t, "--json").stdout) for t in (path, url)}
    assert checked[path]["sound"] and checked[url]["sound"]
    assert checked[path]["problems"] == checked[url]["problems"] == []
    # group move, then group remove: the same line, the same groups after
    for args in (
        ("group", "move", "{}", STREAM, "billing", "--to", "2", "--keep-state"),
        ("group", "move", "{}", STREAM, "audit", "--to", "latest", "--clear-state"),
        ("group", "remove", "{}", STREAM, "billing"),
    ):
        lines = {t: run(*(a.format(t) for a in args)).stdout for t in (path, url)}
        assert lines[path] == lines[url], args
        assert groups(url) == groups(path), args
    assert [g["group"] for g in groups(url) if g["stream"] == STREAM] == ["audit"]
    assert report(url) == report(path)
    # backup: a copy of every record the check counted, sound
    for target, copy in ((path, tmp_path / "copy"), (url, tmp_path / "dump")):
        records = sum(json.loads(run("check", target, "--json").stdout)["records"].values())
        assert backed_up(target, copy) == f"ledger copied to DEST: {records} records, sound", target


def test_group_commands_on_a_url_refuse_what_they_refuse_on_a_path(tmp_path: Path, postgres_url: str) -> None:
    path, url = both(tmp_path, postgres_url)
    for args in (
        ("group", "move", "{}", "shop/intake/nothing", "billing", "--to", "1", "--keep-state"),
        ("group", "move", "{}", STREAM, "billing", "--to", "9", "--keep-state"),
        ("messages", "{}", "shop/intake/nothing"),
        ("messages", "{}", "not-a-reference"),
        ("keys", "{}", "shop/intake/nothing", "billing"),
        ("keys", "{}", STREAM, "nobody"),
        ("state", "{}", "shop/intake/nothing", "billing", "odd"),
        ("state", "{}", STREAM, "nobody", "odd"),
        ("state", "{}", STREAM, "nobody", "--prefix", "o"),
    ):
        done = {t: cli(*(a.format(t) for a in args)) for t in (path, url)}
        assert done[path].returncode == done[url].returncode == 2, (args, done[url].stderr)
        for seen in done.values():
            assert len(seen.stderr.splitlines()) == 1 and "Traceback" not in seen.stderr, seen.stderr
            assert seen.stdout == ""
    both_ways = cli("state", url, STREAM, "billing", "odd", "--prefix", "o")
    assert both_ways.returncode == 2 and "one KEY or the keys under --prefix, not both" in both_ways.stderr
    assert groups(url) == groups(path)  # nothing changed


def test_a_backup_of_a_url_restores_to_the_same_ledger(tmp_path: Path, postgres_url: str) -> None:
    anyio.run(fill, lambda: connect(postgres_url))
    line = run("backup", postgres_url, str(tmp_path / "dump")).stdout
    assert "records, sound" in line and "pg_restore" in line
    assert cli("backup", postgres_url, str(tmp_path / "dump")).returncode == 2  # it exists: refused
    # restored into a database of its own, under the schema of the same name
    schema = re.search(r"search_path%3D(\w+)", postgres_url)
    assert schema is not None
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE restored")
    restored_url = re.sub(r"/\w+\?", "/restored?", postgres_url, count=1)
    with psycopg.connect(restored_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema.group(1)}")
    done = subprocess.run(
        ["pg_restore", "--no-owner", f"--dbname={restored_url}", str(tmp_path / "dump")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    original, copy = shown(postgres_url, "--values"), shown(restored_url, "--values")
    original.pop("path"), copy.pop("path")
    assert without_times(copy) == without_times(original) and copy["streams"]
    assert run("check", restored_url).stdout.strip().endswith("sound")


def test_worker_and_migrate_refuse_a_path_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    for args in (
        ("worker", str(tmp_path / "ledger"), "--graphs", "x:y"),
        ("migrate", str(tmp_path / "ledger")),
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and "takes a postgresql:// URL" in done.stderr, done.stderr
