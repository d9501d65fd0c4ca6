"""Each bench command runs end to end on tiny sizes and reports verified figures.

Speed is never asserted here; the figures only have to exist.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench._latency import STAGES


def run_bench(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["verified"] is True
    return out


def test_streams_bench_reports_every_figure_and_ratio(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_bench(capsys, "streams", "--messages", "300", "--workdir", str(tmp_path))
    for key in (
        "streamledger_msgs_per_s",
        "raw_lmdb_msgs_per_s",
        "sqlite_msgs_per_s",
        "streamledger_nondurable_msgs_per_s",
        "raw_lmdb_nondurable_msgs_per_s",
        "sqlite_nondurable_msgs_per_s",
        "memory_store_msgs_per_s",
        "engine_only_msgs_per_s",
        "disk_fsyncs_per_s",
        "ratio_streamledger_to_raw_lmdb",
        "ratio_streamledger_to_raw_lmdb_nondurable",
        "ratio_streamledger_to_sqlite",
        "ratio_streamledger_to_sqlite_nondurable",
    ):
        assert out[key] > 0, key
    assert out["messages"] == 300
    assert set(out["streamledger_per_order_us"]) == {"loop_cpu", "writer_cpu", "wall"}
    assert set(out["goals_met"]) == {
        "durable_at_least_30000_msgs_per_s",
        "at_least_1.0_of_raw_lmdb",
        "at_least_5x_sqlite",
    }
    assert out["loop_lateness_p99_us"] >= 0  # a probe task beside the durable runs
    assert out["memory_store_loop_lateness_p99_us"] >= 0  # and beside the runs with no ledger


def test_streams_bench_takes_medians_over_repeats(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = run_bench(
        capsys,
        "streams",
        *("--messages", "200", "--repeat", "3", "--skip-sqlite", "--workdir", str(tmp_path)),
    )
    durable = sorted(r["msgs_per_s"] for r in out["runs"] if r["figure"] == "streamledger")
    assert len(durable) == 3
    assert out["streamledger_msgs_per_s"] == durable[1]
    assert "sqlite_msgs_per_s" not in out


def test_streams_bench_runs_on_trio(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = run_bench(
        capsys,
        "streams",
        *("--messages", "200", "--skip-sqlite", "--backend", "trio", "--workdir", str(tmp_path)),
    )
    assert out["backend"] == "trio"


def test_recovery_bench_reports_both_open_times(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = run_bench(
        capsys,
        "recovery",
        *("--acked", "2000", "--small", "100", "--pending", "10", "--repeat", "2"),
        *("--workdir", str(tmp_path)),
    )
    assert (out["large_acked"], out["small_acked"], out["pending"]) == (2000, 100, 10)
    assert out["large_open_s"] > 0 and out["small_open_s"] > 0
    assert out["ratio_large_to_small"] > 0
    assert len(out["large_open_samples_s"]) == 2


@pytest.mark.parametrize("durability", [(), ("--no-sync",)], ids=["durable", "non-durable"])
def test_writer_bench_reports_solo_and_busy_rates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, durability: tuple[str, ...]
) -> None:
    out = run_bench(
        capsys,
        "writer",
        *("--batch", "16", "--batches", "5", "--repeat", "1", "--workdir", str(tmp_path)),
        *durability,
    )
    assert out["sync"] is not bool(durability)
    assert out["solo_msgs_per_s"] > 0 and out["busy_msgs_per_s"] > 0
    assert out["ratio_busy_to_solo"] > 0


def test_text_output_is_a_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["streams", "--messages", "100", "--skip-sqlite", "--workdir", str(tmp_path)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "streamledger / raw_lmdb" in text
    assert "result verified" in text


def test_a_run_that_does_not_verify_reports_no_figure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench._streams

    monkeypatch.setattr(bench._streams, "expected_total", lambda n: -1)
    argv = ["streams", "--messages", "50", "--skip-sqlite", "--json", "--workdir", str(tmp_path)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "verification failed" in captured.err


GRAPHS_TINY = ("graphs", "--steps", "20", "--runs", "3", "--concurrent-steps", "5", "--repeat", "1")


def test_graphs_bench_reports_every_figure_ratio_and_goal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_bench(capsys, *GRAPHS_TINY, "--skip-peers", "--workdir", str(tmp_path))
    for key in (
        "plain_steps_per_s",
        "durable_steps_per_s",
        "plain_concurrent_steps_per_s",
        "durable_concurrent_steps_per_s",
        "raw_lmdb_commits_per_s",
        "plain_plus_commit_steps_per_s",
        "ratio_durable_to_plain_plus_commit",
        "ratio_durable_to_plain",
        "ratio_concurrent_to_plain",
        "adapter_loop_cpu_us_per_step",
    ):
        assert isinstance(out[key], float), key
    assert (out["steps"], out["runs"], out["concurrent_steps"]) == (20, 3, 5)
    assert out["durable_checkpoints_per_run"] == 21  # one per step and one at the end
    assert out["ratio_durable_to_fastest_peer"] is None and out["fastest_peer"] is None
    assert {"loop_cpu", "writer_cpu", "wall", "commit_wait", "writes_per_txn"} <= set(
        out["durable_per_step_us"]
    )
    assert set(out["goals_met"]) == {
        "one_run_at_least_0.65_of_plain_plus_commit",
        "3_concurrent_runs_at_least_0.5_of_plain",
    }


def test_graphs_bench_skips_a_peer_that_is_not_importable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench.__main__

    monkeypatch.setattr(bench.__main__, "peer_missing", lambda name: f"{name} is not importable")
    out = run_bench(capsys, *GRAPHS_TINY, "--workdir", str(tmp_path))
    assert out["peers_skipped"] == {
        "langgraph": "langgraph is not importable",
        "dbos": "dbos is not importable",
    }
    assert "langgraph_steps_per_s" not in out and "dbos_steps_per_s" not in out
    assert "at_least_2x_fastest_peer" not in out["goals_met"]


def test_graphs_bench_reports_no_figure_when_a_checkpoint_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import msgspec

    from ledger.graphs import DurableGraph, GraphRunStatus

    status = DurableGraph.status

    async def one_short(self: DurableGraph[Any, Any, Any, Any], run_id: str) -> GraphRunStatus | None:
        found = await status(self, run_id)
        return None if found is None else msgspec.structs.replace(found, checkpoints=found.checkpoints - 1)

    monkeypatch.setattr(DurableGraph, "status", one_short)
    assert main([*GRAPHS_TINY, "--skip-peers", "--json", "--workdir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "verification failed" in captured.err


NODES_TINY = ("nodes", "--nodes", "20", "--repeat", "1")


def test_nodes_bench_reports_every_figure_and_goal(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_bench(capsys, *NODES_TINY, "--workdir", str(tmp_path))
    for key in (
        "wide_durable_nodes_per_s",
        "wide_ordinary_nodes_per_s",
        "chain_durable_nodes_per_s",
        "chain_ordinary_nodes_per_s",
        "raw_lmdb_commits_per_s",
        "wide_raw_nodes_per_s",
        "chain_durable_to_raw",
        "chain_reference_nodes_per_s",
        "chain_durable_to_reference",
        "loop_lateness_p99_us",
        "wide_durable_loop_lateness_p99_us",
        "chain_durable_loop_lateness_p99_us",
    ):
        assert isinstance(out[key], float), key
    for shape in ("wide", "chain"):  # None when a run of 20 nodes ends before the probe's first wake-up
        assert (
            out[f"{shape}_ordinary_loop_lateness_p99_us"] is None
            or out[f"{shape}_ordinary_loop_lateness_p99_us"] >= 0
        )
    assert out["chain_durable_txns"] >= 20  # a chain cannot batch: at least one commit per node
    reference = 1 / (1 / out["chain_ordinary_nodes_per_s"] + 1 / out["raw_lmdb_commits_per_s"])
    assert out["chain_reference_nodes_per_s"] == pytest.approx(reference)
    assert {
        "wide_at_least_20000_durable_nodes_per_s",
        "chain_at_least_0.8_of_ordinary_plus_one_fsync",
    } <= set(out["goals"])
    if out["peers_skipped"]:
        assert "langgraph_wide_nodes_per_s" not in out and "langgraph_chain_nodes_per_s" not in out
    else:
        assert out["langgraph_wide_nodes_per_s"] > 0 and out["langgraph_chain_nodes_per_s"] > 0
        assert {"wide_at_least_3x_langgraph", "chain_at_least_3x_langgraph"} <= set(out["goals"])


def test_nodes_bench_skips_langgraph_that_is_not_importable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench.__main__

    monkeypatch.setattr(bench.__main__, "nodes_peer_missing", lambda: "langgraph is not importable")
    out = run_bench(capsys, *NODES_TINY, "--workdir", str(tmp_path))
    assert out["peers_skipped"] == {"langgraph": "langgraph is not importable"}
    assert "langgraph_wide_nodes_per_s" not in out
    assert set(out["goals"]) == {
        "wide_at_least_20000_durable_nodes_per_s",
        "chain_at_least_0.8_of_ordinary_plus_one_fsync",
    }


def test_nodes_bench_reports_no_figure_when_a_node_record_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ledger import LmdbNodeHooks

    records = LmdbNodeHooks.node_records

    async def one_short(self: LmdbNodeHooks, scope: str) -> tuple[Any, ...]:
        return (await records(self, scope))[1:]

    monkeypatch.setattr(LmdbNodeHooks, "node_records", one_short)
    assert main([*NODES_TINY, "--json", "--workdir", str(tmp_path)]) == 1
    assert "the ledger holds 19 node records, not 20" in capsys.readouterr().err


LATENCY_TINY = ("latency", "--seconds", "0.05", "--rates", "1000,max", "--saturation-orders", "200")


def test_latency_bench_reports_percentiles_transactions_and_round_trips(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_bench(capsys, *LATENCY_TINY, "--commits", "20", "--skip-postgres", "--workdir", str(tmp_path))
    for name in ("lmdb_1k", "lmdb_max", "lmdb_nondurable_1k", "lmdb_nondurable_max"):
        assert out[f"{name}_txns_crossed_p50"] >= 0
        for figure in ("p50", "p90", "p99", "p999", "txn_p50"):
            assert out[f"{name}_{figure}_us"] > 0, (name, figure)
        assert 0 < out[f"{name}_writer_busy"] <= 1, name
        assert isinstance(out[f"{name}_sustained"], bool)
    assert out["raw_lmdb_commit_p50_us"] > 0
    assert out["ledger_write_p50_us"] > 0
    assert out["loop_lateness_p99_us"] >= 0  # a probe task beside the bare ledger writes
    for figure in ("p50", "p99", "p999"):  # the same probe beside a twin of each paced run
        assert out[f"lmdb_1k_loop_lateness_{figure}_us"] >= 0, figure
        assert out[f"lmdb_1k_beside_probe_{figure}_us"] > 0, figure
    for stage in STAGES:  # where an order's time went: all orders, and the slowest hundredth
        assert out[f"lmdb_1k_stage_{stage}_us"] >= 0, stage
        assert out[f"lmdb_max_slow_stage_{stage}_us"] >= 0, stage
    assert out["lmdb_1k_gc_pause_ms"] >= 0
    assert len(out["runs"]) == len(out["runs_beside_probe"]) == 4
    assert all(run["loop_lateness_us"]["p99"] >= 0 for run in out["runs_beside_probe"])
    assert not any("loop_lateness_us" in run for run in out["runs"])  # nothing beside the timed runs
    assert out["ledger_write_in_raw_commits"] > 0
    assert out["postgres_skipped"] == "--skip-postgres"
    assert "pg_1k_p50_us" not in out
    assert set(out["goals_met"]) == {
        "lmdb_1k_p50_at_most_3_raw_commits",
        "lmdb_1k_p50_at_most_0.6ms",
        "ledger_write_at_most_1.25_raw_commits",
    }


def test_latency_bench_runs_on_postgres(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, postgres_server: Any
) -> None:
    out = run_bench(
        capsys,
        *("latency", "--seconds", "0.05", "--rates", "50000", "--commits", "5"),
        *("--url", postgres_server.url, "--workdir", str(tmp_path)),
    )
    assert out["pg_50k_p99_us"] > 0
    assert out["pg_50k_txn_p50_us"] > 0 and 0 < out["pg_50k_writer_busy"] <= 1  # timed on its writer thread
    assert out["lmdb_50k_p50_us"] > 0
    assert set(out["goals_met"]) == {
        "lmdb_50k_p50_at_most_1ms",
        "lmdb_50k_p99_at_most_2ms",
        "lmdb_50k_p999_at_most_5ms",
        "ledger_write_at_most_1.25_raw_commits",
    }
    assert out["pg_50k_loop_lateness_p99_us"] >= 0  # the probe beside the PostgreSQL run too
    assert out["pg_raw_commit_p50_us"] > 0 and out["pg_write_p99_us"] >= out["pg_write_p50_us"] > 0
    assert out["pg_write_in_raw_commits"] == out["pg_write_p50_us"] / out["pg_raw_commit_p50_us"]


def test_streams_bench_on_postgres_reports_memory_store_and_skip_locked_in_the_same_run(
    capsys: pytest.CaptureFixture[str], postgres_server: Any
) -> None:
    out = run_bench(
        capsys,
        *("streams", "--store", "postgres", "--messages", "300", "--per-message", "20", "--batch", "64"),
        *("--workers", "", "--notify-samples", "5", "--notify-idle", "0.3", "--url", postgres_server.url),
    )
    assert out["notify_samples"] == 5 and out["notify_idle_seconds"] == 0.3
    assert 0 <= out["notify_idle_member_txns_per_s"] * 0.3 <= 2  # a renewal or two in its window, no poll
    # both measured; not ordered: the server notifies the member as the writer's COMMIT lands, so the
    # member may start its handler before the writer has read its own COMMIT's answer
    assert out["notify_append_p50_us"] > 0 and out["notify_delivery_p50_us"] > 0
    for key in (
        "streamledger_msgs_per_s",
        "raw_psycopg_msgs_per_s",
        "psycopg_per_message_msgs_per_s",
        "memory_store_msgs_per_s",
        "skip_locked_msgs_per_s",
        "ratio_streamledger_to_memory_store",
        "ratio_streamledger_to_skip_locked",
    ):
        assert out[key] > 0, key
    for name in ("streamledger", "raw_psycopg", "psycopg_per_message", "skip_locked"):
        assert out[f"{name}_client_cpu_s_per_1k_msgs"] > 0, name
        assert out[f"{name}_server_cpu_s_per_1k_msgs"] >= 0, name  # a server on this machine: read
    assert out["demo_workers"] == []
    assert set(out["goals_met"]) == {
        "at_least_0_7_of_raw_psycopg",
        "at_least_10x_per_message_psycopg",
        "at_least_0_8_of_memory_store",
        "at_least_2x_skip_locked",
    }


def test_latency_text_output_is_a_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = [*LATENCY_TINY, "--commits", "5", "--skip-postgres", "--workdir", str(tmp_path)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "send to audit's delivery" in text and "lateness p99" in text and "beside probe p50" in text
    assert "mean of the slowest 1%" in text and "billing_txn" in text
    assert "raw py-lmdb commit" in text


KEYED_TINY = (
    "keyed", "--messages", "300", "--keys", "10,100", "--expiring-keys", "100", "--explicit-keys", "10",
    "--members", "1,2", "--log-merge", "50",
)  # fmt: skip


def test_keyed_bench_reports_keys_members_and_goals(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_bench(
        capsys, *KEYED_TINY, "--members-keys", "100", "--skip-postgres", "--workdir", str(tmp_path)
    )
    for name in ("keyed_10", "keyed_100", "expiring_100", "explicit_10", "members_1", "members_2"):
        assert out[f"{name}_msgs_per_s"] > 0, name
        # the first order of a group (of each partition) commits the seeded state, untimed
        assert out[f"{name}_messages"] == (298 if name == "members_2" else 299), name
        assert out[f"{name}_cut_short"] is False, name
        assert out[f"{name}_loop_cpu_us_per_msg"] > 0, name
    assert out["keyed_100_state_bytes"] > out["keyed_10_state_bytes"]
    assert out["explicit_keys"] == [10] and "explicit_100_msgs_per_s" not in out
    states = {r["state"] for r in out["runs"] if "state" in r}
    assert states == {"keyed", "expiring", "explicit", "raw py-lmdb", "raw py-lmdb, log"}
    assert out["ratio_expiring_100_to_keyed"] > 0
    assert out["members_mode"] == "a stream of M partitions by customer, one handler each, in one process"
    assert out["raw_keyed_10_msgs_per_s"] > 0 and out["ratio_keyed_100_to_raw"] > 0
    # the most keys run long (ten times the orders), each order an update, beside the raw loop
    assert out["updates"] == 3000 and out["updated_100_messages"] == 2999  # the first, untimed, seeds
    assert out["raw_updated_100_msgs_per_s"] > 0 and out["ratio_updated_100_to_raw"] > 0
    # and a raw loop appending to a log merged into the table, the limit of a log-structured layout
    assert out["log_merge"] == 50 and out["raw_log_updated_100_msgs_per_s"] > 0
    assert out["ratio_raw_log_updated_100_to_raw_updated"] > 0
    assert out["ratio_raw_log_updated_100_to_raw_keyed_10"] > 0
    assert out["ratio_keyed_100_to_10"] > 0 and out["ratio_members_2_to_1"] > 0
    assert out["postgres_skipped"] == "--skip-postgres"
    assert "pg_rollbacks_per_1k_txns" not in out
    assert set(out["goals_met"]) == {
        "keyed_100_at_least_0.8_of_keyed_10",
        "keyed_100_at_least_0.5_of_keyed_10",
        "keyed_10_at_least_0.8_of_raw_keyed_10",
        "keyed_100_at_least_0.8_of_raw_keyed_100",
        "expiring_100_at_least_0.95_of_keyed_100",
        "members_2_at_least_0.9_of_members_1",
    }


def test_keyed_bench_cuts_a_configuration_short_at_its_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["keyed", "--messages", "300", "--keys", "100", "--expiring-keys", "100", "--explicit-keys", "100"]
    argv += ["--members", "2", "--seconds", "0", "--skip-postgres", "--workdir", str(tmp_path)]
    out = run_bench(capsys, *argv)
    for name in ("keyed_100", "expiring_100", "explicit_100", "members_2"):
        assert out[f"{name}_cut_short"] is True, name
        assert 1 <= out[f"{name}_messages"] < 299, name  # the totals verified over the orders handled


def test_keyed_bench_reports_no_figure_when_a_total_is_wrong(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import bench._keyed

    expected = bench._keyed.expected_totals

    def one_off(last: int, keys: int, member: int = 0, members: int = 1) -> dict[str, int]:
        totals = expected(last, keys, member, members)
        totals["c0"] = totals.get("c0", 0) + 1
        return totals

    monkeypatch.setattr(bench._keyed, "expected_totals", one_off)
    argv = [*KEYED_TINY, "--skip-postgres", "--json", "--workdir", str(tmp_path)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "verification failed" in captured.err


@pytest.mark.parametrize("mode", ["members", "runs"])
def test_keyed_bench_runs_on_postgres_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, postgres_server: Any, mode: str
) -> None:
    out = run_bench(
        capsys,
        *KEYED_TINY,
        *("--pg-messages", "200", "--pg-keys", "20", "--pg-shards", "2", "--workers", "1,2"),
        *("--pg-mode", mode, "--url", postgres_server.url, "--workdir", str(tmp_path)),
    )
    assert out["pg_mode"].startswith(
        "W processes, each a member" if mode == "members" else "--pg-shards runs"
    )
    for w in (1, 2):
        assert out[f"pg_workers_{w}_msgs_per_s"] > 0
        assert isinstance(out[f"pg_workers_{w}_cpu_us_per_msg"], float)  # net of start-up: may be noise
        assert out[f"pg_workers_{w}_cpu_us_per_msg_with_startup"] > 0
        assert out[f"pg_workers_{w}_txns"] > 0
        assert out[f"pg_workers_{w}_rollbacks_per_1k_txns"] >= 0
    assert out["pg_worker_startup_cpu_ms"] > 0
    assert out["pg_rollbacks_per_1k_txns"] == out["pg_workers_2_rollbacks_per_1k_txns"]
    assert out["pg_workers_1_server_cpu_us_per_msg"] is None  # a server of --url: its CPU is not read
    assert {
        "pg_workers_2_cpu_per_msg_at_most_1.1_of_1",
        "pg_fewer_than_1_rollback_per_1k_txns",
    } <= set(out["goals_met"])


def test_keyed_text_output_is_a_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["keyed", "--messages", "100", "--keys", "10", "--members", "1", "--seconds", "0"]
    assert main([*argv, "--skip-postgres", "--workdir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "10 keys, one group (cut short at 0 s" in text
    assert "partitions by customer, one handler each" in text
    assert "PostgreSQL skipped: --skip-postgres" in text
