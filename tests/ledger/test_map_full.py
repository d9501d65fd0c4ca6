"""A ledger at its map limit: a write that does not fit fails whole, one line says why, more room resumes.

The demo's working set stays near 300 KiB however many orders it runs (acked
messages are compacted away), so a limit of 256 KiB stops it part way and
one of 2 MiB lets it finish.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger import LedgerEnv, MapFullError, inspect_ledger
from ledger._arguments import size as _size
from ledger.lmdb._demo import run_demo
from streams import StreamsError

from .test_cli import assert_demo_answer, cli, streams_of

N = 20_000
TOO_SMALL = 256 << 10
LARGE_ENOUGH = 2 << 20


def causes(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def read(path: Path) -> dict[str, Any]:
    env = LedgerEnv.open_readonly(path)
    try:
        return inspect_ledger(env)
    finally:
        env.close()


def assert_stopped_part_way_and_consistent(report: dict[str, Any]) -> None:
    """Every message was confirmed whole or not at all: states, invoices and frontiers agree."""
    streams = streams_of(report)
    orders, invoices = streams["orders"], streams["invoices"]
    [billing] = orders["groups"]
    [audit] = invoices["groups"]
    billed = billing["acked_through"]
    assert billed < N and not orders["failed"] and not invoices["failed"]
    assert not (orders["finished"] and invoices["finished"])
    assert billing["state"] == {"total": billed * (billed + 1) // 2, "count": billed}
    assert invoices["appended"] == billed  # one invoice per billed order, in the same transaction
    assert audit["state"] == {"count": audit["acked_through"]}
    assert audit["acked_through"] <= billed <= orders["appended"] <= N


# -- the demo ------------------------------------------------------------------------------------


async def test_the_demo_over_its_map_limit_stops_whole_and_resumes_with_a_larger_limit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"
    with pytest.raises(StreamsError) as stopped:
        await run_demo(path, N, max_map_size=TOO_SMALL)
    [full] = [e for e in causes(stopped.value) if isinstance(e, MapFullError)]
    assert f"map limit of {TOO_SMALL} bytes" in str(full) and "larger max_map_size" in str(full)
    assert_stopped_part_way_and_consistent(read(path))

    summary = await run_demo(path, N, max_map_size=LARGE_ENOUGH)
    assert (summary.orders, summary.billing_total, summary.invoices, summary.audit_count) == (
        N,
        N * (N + 1) // 2,
        N,
        N,
    )
    assert summary.resumed and not summary.already_finished and 0 < summary.handled < N
    assert_demo_answer(read(path), N, generation=2)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_demo_command_over_its_map_limit_says_so_in_one_line_and_the_same_command_resumes(
    tmp_path: Path, backend: str
) -> None:
    path = tmp_path / "ledger"

    def demo(limit: str) -> Any:
        return cli(
            "demo",
            str(path),
            *("--messages", str(N), "--progress-interval", "60", "--backend", backend),
            *("--max-map-size", limit),
        )

    full = demo("256K")
    assert full.returncode == 7 and "Traceback" not in full.stderr
    [error] = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert f"map limit of {TOO_SMALL} bytes" in error and "larger max_map_size" in error, error
    assert "nothing of it was written" in error

    checked = cli("check", str(path))
    assert checked.returncode == 0 and checked.stdout.rstrip().endswith("sound"), checked.stdout
    inspected = cli("inspect", str(path), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert_stopped_part_way_and_consistent(json.loads(inspected.stdout))

    resumed = demo("2M")
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"demo finished: {N} orders, billing total {N * (N + 1) // 2}, {N} invoices, audit count {N};"
        in resumed.stdout
    )
    assert "(resumed;" in resumed.stdout
    assert_demo_answer(read(path), N, generation=2)


# -- opening -------------------------------------------------------------------------------------


def test_a_ledger_whose_creation_does_not_fit_its_limit_is_map_full_and_a_larger_limit_completes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"
    with pytest.raises(MapFullError, match=r"^ledger .* does not fit in its map limit of 4096 bytes"):
        LedgerEnv.open(path, max_map_size=4096)
    env = LedgerEnv.open(path)  # the interrupted creation is completed, not taken for damage
    env.close()
    assert read(path)["streams"] == []

    other = tmp_path / "other"
    refused = cli("demo", str(other), "--messages", "10", "--max-map-size", "4K")
    assert refused.returncode == 7 and "Traceback" not in refused.stderr
    [error] = refused.stderr.splitlines()
    assert re.fullmatch(r"error: ledger .* map limit of 4096 bytes.*larger max_map_size", error), error


def test_the_map_starts_within_its_limit_and_a_small_start_grows_while_the_ledger_is_created(
    tmp_path: Path,
) -> None:
    env = LedgerEnv.open(tmp_path / "capped", max_map_size=1 << 17)  # below the 64 MiB starting map
    try:
        assert env.info()["map_size"] <= 1 << 17
    finally:
        env.close()
    env = LedgerEnv.open(tmp_path / "tiny", map_size=4096)
    try:
        assert env.info()["map_size"] > 4096
    finally:
        env.close()


@pytest.mark.parametrize(("map_size", "max_map_size"), [(64 << 20, 0), (0, 1 << 40), (64 << 20, -1)])
def test_map_sizes_that_are_not_positive_are_refused_before_anything_is_made(
    tmp_path: Path, map_size: int, max_map_size: int
) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        LedgerEnv.open(tmp_path / "ledger", map_size=map_size, max_map_size=max_map_size)
    assert not (tmp_path / "ledger").exists()


@pytest.mark.parametrize("limit", ["0", "lots", "1.5M", "-4K"])
def test_a_bad_max_map_size_option_is_a_usage_error(tmp_path: Path, limit: str) -> None:
    refused = cli("demo", str(tmp_path / "ledger"), "--max-map-size", limit)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--max-map-size" in refused.stderr
    assert not (tmp_path / "ledger").exists()


def test_the_max_map_size_option_takes_binary_units() -> None:
    assert [_size(t) for t in ("65536", "64K", "64k", "64KiB", "1M", "2G", "1T")] == [
        65536,
        65536,
        65536,
        65536,
        1 << 20,
        2 << 30,
        1 << 40,
    ]
