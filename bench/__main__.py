"""Command line: ``python -m bench streams|recovery|writer|graphs|nodes|latency|keyed [options]``.

``streams``   the demo pipeline on LMDB against raw py-lmdb and sqlite3 loops
``recovery``  opening a ledger of a million acknowledged messages vs. a thousand
``writer``    the ledger writer's commit rate solo and beside a CPU-busy loop
``graphs``    DurableGraph's checkpointed steps against plain pydantic-graph, raw commits and peers
``nodes``     durable node commits, a wide graph and a chain, against ordinary mode and raw LMDB
``latency``   send to downstream delivery, paced at 1,000 and 50,000 orders a second and at saturation
``keyed``     per-key totals over 10 to 10^6 keys, split among members, and on PostgreSQL workers

Every run verifies its result; a run that does not verify prints no figure
and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ._baselines import probe_fsync, run_raw_lmdb, run_sqlite
from ._graphs import PEERS, GraphFigure, peer_missing, run_durable, run_peer, run_plain, run_raw_commits
from ._keyed_command import bench_keyed, parse_counts, show_keyed
from ._latency import bench_latency, parse_rates, show_latency
from ._lateness import p99_us
from ._nodes import (
    NodeFigure,
    nodes_peer_missing,
    run_durable_nodes,
    run_langgraph_nodes,
    run_ordinary_nodes,
    run_raw_nodes,
)
from ._recovery import time_recovery
from ._server_cpu import CpuMeter
from ._shape import BenchError, median
from ._streams import WINDOW, run_engine_only, run_memory, run_streamledger
from ._writer import run_writer

__all__ = ["main"]

#: The goals of the issue's "Speed" section.
GOAL_DURABLE_MSGS_PER_S = 30_000
GOAL_RAW_LMDB_RATIO = 1.0
GOAL_SQLITE_RATIO = 5.0
#: The goals of durable graph runs.
GOAL_DURABLE_TO_PLAIN_PLUS_COMMIT = 0.65
GOAL_CONCURRENT_TO_PLAIN = 0.5
GOAL_DURABLE_TO_FASTEST_PEER = 2.0
GOAL_WIDE_DURABLE_NODES_PER_S = 20_000
GOAL_CHAIN_TO_REFERENCE = 0.8
GOAL_NODES_TO_LANGGRAPH = 3.0


def _progress(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _rate(x: float) -> str:
    return f"{x:,.0f}"


def _ratio(x: float) -> str:
    return f"{x:.2f}"


def _shown(out: dict[str, Any], key: str, fmt: Callable[[float], str]) -> str:
    value = out.get(key)
    return "-" if value is None else fmt(value)


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- streams -------------------------------------------------------------------------------


def bench_streams(args: argparse.Namespace) -> dict[str, Any]:
    if args.store == "postgres":
        return bench_streams_postgres(args)
    n: int = args.messages
    workdir: Path | None = args.workdir
    quiet: bool = args.json
    figures: dict[str, list[float]] = {}
    runs: list[dict[str, Any]] = []
    fsyncs: list[float] = []
    lateness: list[float] = []  # the probe's, during the durable graph runs
    memory_lateness: list[float] = []  # the same probe beside the MemoryStore runs: no ledger

    def record(name: str, rate: float, extra: dict[str, Any] | None = None) -> None:
        figures.setdefault(name, []).append(rate)
        runs.append({"figure": name, "msgs_per_s": rate, **(extra or {})})
        _progress(quiet, f"  {name}: {_rate(rate)} msgs/s")

    for k in range(args.repeat):
        _progress(quiet, f"round {k + 1}/{args.repeat}, {n:,} orders")
        fsyncs.append(probe_fsync(workdir=workdir))
        _progress(quiet, f"  disk: {fsyncs[-1]:,.0f} fsyncs/s")
        for sync, suffix in ((True, ""), (False, "_nondurable")):
            run = run_streamledger(
                n, sync=sync, window=args.window, backend=args.backend, workdir=workdir, probe=sync
            )
            record(f"streamledger{suffix}", run.msgs_per_s, {"batches": run.stats()})
            lateness.extend(run.lateness)
        bare = run_streamledger(
            n, sync=True, window=args.window, backend=args.backend, workdir=workdir, graph=False
        )
        record("streamledger_bare", bare.msgs_per_s, {"batches": bare.stats()})
        for sync, suffix in ((True, ""), (False, "_nondurable")):
            raw = run_raw_lmdb(n, sync=sync, batch=args.batch or args.window, workdir=workdir)
            record(f"raw_lmdb{suffix}", raw.msgs_per_s)
        if not args.skip_sqlite:
            for sync, suffix in ((True, ""), (False, "_nondurable")):
                sq = run_sqlite(n, sync=sync, workdir=workdir)
                record(f"sqlite{suffix}", sq.msgs_per_s)
        memory = run_memory(n, window=args.window, backend=args.backend, probe=True)
        record("memory_store", memory.msgs_per_s, {"batches": memory.stats()})
        memory_lateness.extend(memory.lateness)
        engine = run_engine_only(n, window=args.window, backend=args.backend)
        record("engine_only", engine.msgs_per_s)

    med = {name: median(values) for name, values in figures.items()}
    out: dict[str, Any] = {
        "bench": "streams",
        "messages": n,
        "repeat": args.repeat,
        "backend": args.backend,
        "window": args.window,
        "raw_lmdb_batch": args.batch or args.window,
        "verified": True,
        "disk_fsyncs_per_s": median(fsyncs),
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    for name, value in med.items():
        out[f"{name}_msgs_per_s"] = value
    sl, sl_nd = med["streamledger"], med["streamledger_nondurable"]
    out["ratio_streamledger_to_raw_lmdb"] = sl / med["raw_lmdb"]
    out["ratio_streamledger_to_bare_streams"] = sl / med["streamledger_bare"]
    out["graph_cost_us_per_order"] = (1 / sl - 1 / med["streamledger_bare"]) * 1e6
    out["ratio_streamledger_to_raw_lmdb_nondurable"] = sl_nd / med["raw_lmdb_nondurable"]
    out["loop_lateness_p99_us"] = p99_us(lateness)
    out["memory_store_loop_lateness_p99_us"] = p99_us(memory_lateness)
    goals: dict[str, bool] = {
        "durable_at_least_30000_msgs_per_s": sl >= GOAL_DURABLE_MSGS_PER_S,
        f"at_least_{GOAL_RAW_LMDB_RATIO}_of_raw_lmdb": (
            out["ratio_streamledger_to_raw_lmdb"] >= GOAL_RAW_LMDB_RATIO
        ),
    }
    if "sqlite" in med:
        out["ratio_streamledger_to_sqlite"] = sl / med["sqlite"]
        out["ratio_streamledger_to_sqlite_nondurable"] = sl_nd / med["sqlite_nondurable"]
        goals["at_least_5x_sqlite"] = out["ratio_streamledger_to_sqlite"] >= GOAL_SQLITE_RATIO
    for suffix in ("", "_nondurable"):
        stats = [r["batches"] for r in runs if r["figure"] == f"streamledger{suffix}"]
        out[f"streamledger{suffix}_per_order_us"] = {
            part: median([st[f"{part}_us_per_order"] for st in stats])
            for part in ("loop_cpu", "writer_cpu", "wall")
        }
        out[f"streamledger{suffix}_orders_per_txn"] = median([st["orders_per_txn"] for st in stats])
    out["goals_met"] = goals
    out["runs"] = runs
    return out


#: The goals of the PostgreSQL ledger's figures.
GOAL_PG_RAW_RATIO = 0.7
GOAL_PG_PER_MESSAGE_RATIO = 10.0
GOAL_PG_MEMORY_STORE_RATIO = 0.8
GOAL_PG_SKIP_LOCKED_RATIO = 2.0


def bench_streams_postgres(args: argparse.Namespace) -> dict[str, Any]:
    """The pipeline on PostgreSQL beside the same pipeline on MemoryStore, a hand-written psycopg loop,
    a per-message one and a ``SKIP LOCKED`` batch queue, in one run."""
    from contextlib import ExitStack

    from ledger.postgres.server import private_server

    from ._notify import run_notify_delivery
    from ._postgres import (
        PgRun,
        new_database,
        run_demo_workers,
        run_psycopg_per_message,
        run_raw_psycopg,
        run_skip_locked,
        run_streamledger_postgres,
    )
    from ._streams import run_memory

    n: int = args.messages
    quiet: bool = args.json
    figures: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float | None]]] = {}  # per run: client and server CPU seconds
    with ExitStack() as stack:
        if args.url:
            server_url, make_url = args.url, _database_url(args.url)
        else:
            server = stack.enter_context(private_server())
            server_url, make_url = server.url, server.url_for
        conn = stack.enter_context(psycopg_connect(server_url))
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
        meter = CpuMeter(conn)
        for k in range(args.repeat):
            _progress(quiet, f"round {k + 1}/{args.repeat}, {n:,} orders on PostgreSQL")
            runs: tuple[tuple[str, Callable[[str], PgRun]], ...] = (
                (
                    "streamledger",
                    partial(run_streamledger_postgres, n=n, window=args.window, backend=args.backend),
                ),
                ("raw_psycopg", partial(run_raw_psycopg, n=n, batch=args.batch or args.window)),
                ("psycopg_per_message", partial(run_psycopg_per_message, n=min(n, args.per_message))),
                ("skip_locked", partial(run_skip_locked, n=n, batch=args.batch or args.window)),
            )
            for name, run in runs:
                url = new_database(server_url, make_url)
                before = meter.read()
                done = run(url)
                cpu.setdefault(name, []).append(_per_thousand(meter.since(before), done.messages))
                rate = done.msgs_per_s
                figures.setdefault(name, []).append(rate)
                _progress(quiet, f"  {name}: {_rate(rate)} msgs/s")
            rate = run_memory(n, window=args.window, backend=args.backend).msgs_per_s
            figures.setdefault("memory_store", []).append(rate)
            _progress(quiet, f"  memory_store: {_rate(rate)} msgs/s")
            for workers in args.workers:
                rate = run_demo_workers(new_database(server_url, make_url), n, workers).msgs_per_s
                figures.setdefault(f"demo_workers_{workers}", []).append(rate)
                _progress(quiet, f"  demo with {workers} worker process(es): {_rate(rate)} msgs/s")
        notified = run_notify_delivery(
            new_database(server_url, make_url),
            args.notify_samples,
            idle_seconds=args.notify_idle,
            backend=args.backend,
        )
        _progress(quiet, f"  an idle member told of a message: {median(notified.delivery_us):,.0f} us")
    med = {name: median(values) for name, values in figures.items()}
    out: dict[str, Any] = {
        "bench": "streams",
        "store": "postgres",
        "messages": n,
        "per_message_messages": min(n, args.per_message),
        "repeat": args.repeat,
        "backend": args.backend,
        "window": args.window,
        "raw_psycopg_batch": args.batch or args.window,
        "demo_workers": list(args.workers),
        "verified": True,
        "server": settings,
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    for name, value in med.items():
        out[f"{name}_msgs_per_s"] = value
    for name, spent in cpu.items():  # CPU seconds per 1,000 messages, the client's and the server's
        out[f"{name}_client_cpu_s_per_1k_msgs"] = median([client for client, _ in spent])
        servers = [server for _, server in spent if server is not None]
        out[f"{name}_server_cpu_s_per_1k_msgs"] = median(servers) if servers else None
    out["notify_samples"] = args.notify_samples
    out["notify_idle_seconds"] = args.notify_idle
    out["notify_delivery_p50_us"] = median(notified.delivery_us)
    out["notify_append_p50_us"] = median(notified.append_us)
    out["notify_idle_member_txns_per_s"] = notified.idle_txns_per_s
    out["ratio_streamledger_to_raw_psycopg"] = med["streamledger"] / med["raw_psycopg"]
    out["ratio_streamledger_to_psycopg_per_message"] = med["streamledger"] / med["psycopg_per_message"]
    out["ratio_streamledger_to_memory_store"] = med["streamledger"] / med["memory_store"]
    out["ratio_streamledger_to_skip_locked"] = med["streamledger"] / med["skip_locked"]
    out["goals_met"] = {
        "at_least_0_7_of_raw_psycopg": out["ratio_streamledger_to_raw_psycopg"] >= GOAL_PG_RAW_RATIO,
        "at_least_10x_per_message_psycopg": out["ratio_streamledger_to_psycopg_per_message"]
        >= GOAL_PG_PER_MESSAGE_RATIO,
        "at_least_0_8_of_memory_store": out["ratio_streamledger_to_memory_store"]
        >= GOAL_PG_MEMORY_STORE_RATIO,
        "at_least_2x_skip_locked": out["ratio_streamledger_to_skip_locked"] >= GOAL_PG_SKIP_LOCKED_RATIO,
    }
    return out


def _per_thousand(spent: tuple[float, float | None], messages: int) -> tuple[float, float | None]:
    client, server = spent
    return client * 1000 / messages, None if server is None else server * 1000 / messages


def psycopg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _database_url(url: str) -> Callable[[str], str]:
    """For a server's URL: the URL of another database on it (a ``postgresql://`` URL stays one)."""
    import urllib.parse

    import psycopg

    def make(name: str) -> str:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("postgres", "postgresql"):  # worker processes take URLs only
            query = f"?{parts.query}" if parts.query else ""
            return f"{parts.scheme}://{parts.netloc}/{name}{query}"
        params = psycopg.conninfo.conninfo_to_dict(url)
        params["dbname"] = name
        return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})

    return make


def _cpu_pair(out: dict[str, Any], name: str) -> str:
    client, server = out.get(f"{name}_client_cpu_s_per_1k_msgs"), out.get(f"{name}_server_cpu_s_per_1k_msgs")
    if client is None:
        return "-"
    return f"{client:.4f} / " + ("-" if server is None else f"{server:.4f}")


def show_streams_postgres(out: dict[str, Any]) -> str:
    def get(name: str) -> str:
        return _shown(out, f"{name}_msgs_per_s", _rate)

    rows: list[tuple[str, ...]] = [
        ("msgs/s (orders through the pipeline)", "durable"),
        ("streamledger (bare streams on the PostgreSQL ledger)", get("streamledger")),
        (f"hand-written psycopg loop ({out['raw_psycopg_batch']} orders/txn)", get("raw_psycopg")),
        (f"psycopg, one txn per step ({out['per_message_messages']:,} orders)", get("psycopg_per_message")),
        (f"SKIP LOCKED batch queue ({out['raw_psycopg_batch']} orders/claim)", get("skip_locked")),
        ("the same pipeline on MemoryStore (no I/O)", get("memory_store")),
        *(
            (f"the demo, {k} worker process(es), wall time from start", get(f"demo_workers_{k}"))
            for k in out["demo_workers"]
        ),
        ("streamledger / raw psycopg", _shown(out, "ratio_streamledger_to_raw_psycopg", _ratio)),
        (
            "streamledger / per-message psycopg",
            _shown(out, "ratio_streamledger_to_psycopg_per_message", _ratio),
        ),
        ("streamledger / MemoryStore", _shown(out, "ratio_streamledger_to_memory_store", _ratio)),
        ("streamledger / SKIP LOCKED queue", _shown(out, "ratio_streamledger_to_skip_locked", _ratio)),
        *(
            (f"CPU s per 1,000 msgs, {name}: client / server", _cpu_pair(out, name))
            for name in ("streamledger", "raw_psycopg", "skip_locked")
        ),
        (
            f"an idle member, from a send in another process to its handler (median of "
            f"{out['notify_samples']}), us",
            _shown(out, "notify_delivery_p50_us", _rate),
        ),
        ("  of which the send's commit (the writer's flush), us", _shown(out, "notify_append_p50_us", _rate)),
        ("  the idle member's transactions a second", f"{out['notify_idle_member_txns_per_s']:.2f}"),
    ]
    server = out["server"]
    head = (
        f"streams on PostgreSQL {server['server_version']}: {out['messages']:,} orders, median of "
        f"{out['repeat']}, {out['backend']}, result verified; "
        f"synchronous_commit={server['synchronous_commit']}, "
        f"fsync={server['fsync']}, wal_sync_method={server['wal_sync_method']}; load average "
        f"{out['load_average_1m']:.1f} on {out['cpus']} CPUs"
    )
    goals = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["goals_met"].items())
    return f"{head}\n{_table(rows)}\ngoals: {goals}"


def show_streams(out: dict[str, Any]) -> str:
    if out.get("store") == "postgres":
        return show_streams_postgres(out)

    def get(name: str) -> str:
        return _shown(out, f"{name}_msgs_per_s", _rate)

    def ratio(name: str) -> str:
        return _shown(out, name, _ratio)

    rows: list[tuple[str, ...]] = [
        ("msgs/s (orders through the pipeline)", "durable", "non-durable"),
        ("streamledger (the demo's graph on LMDB)", get("streamledger"), get("streamledger_nondurable")),
        ("the same handlers on bare streams (no graph)", get("streamledger_bare"), "-"),
        (
            f"raw py-lmdb loop ({out['raw_lmdb_batch']} orders/txn)",
            get("raw_lmdb"),
            get("raw_lmdb_nondurable"),
        ),
        ("sqlite3 WAL, one txn per step", get("sqlite"), get("sqlite_nondurable")),
        ("streamledger on MemoryStore (no I/O)", "-", get("memory_store")),
        ("engine alone (a store that keeps nothing)", "-", get("engine_only")),
        (
            "streamledger / raw_lmdb",
            ratio("ratio_streamledger_to_raw_lmdb"),
            ratio("ratio_streamledger_to_raw_lmdb_nondurable"),
        ),
        (
            "streamledger / sqlite",
            ratio("ratio_streamledger_to_sqlite"),
            ratio("ratio_streamledger_to_sqlite_nondurable"),
        ),
    ]
    goals = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["goals_met"].items())
    cost = []
    for suffix, label in (("", "durable"), ("_nondurable", "non-durable")):
        c = out[f"streamledger{suffix}_per_order_us"]
        cost.append(
            f"  {label}: loop thread {c['loop_cpu']:.1f} + writer thread {c['writer_cpu']:.1f} CPU "
            f"of {c['wall']:.1f} wall; {out[f'streamledger{suffix}_orders_per_txn']:.0f} orders per LMDB txn"
        )
    head = (
        f"streams: {out['messages']:,} orders, median of {out['repeat']}, {out['backend']}, "
        f"result verified; disk: {out['disk_fsyncs_per_s']:,.0f} fsyncs/s, "
        f"load average {out['load_average_1m']:.1f} on {out['cpus']} CPUs"
    )
    cost.append(
        f"  the graph: {out['graph_cost_us_per_order']:.2f} µs per order over bare streams "
        f"({_ratio(out['ratio_streamledger_to_bare_streams'])} of their rate)"
    )
    cost.append(
        f"  loop lateness p99: {_shown(out, 'loop_lateness_p99_us', _rate)} µs durable, "
        f"{_shown(out, 'memory_store_loop_lateness_p99_us', _rate)} µs on MemoryStore"
    )
    per_order = "\n".join(cost)
    return f"{head}\n{_table(rows)}\nstreamledger µs per order:\n{per_order}\ngoals: {goals}"


# -- recovery ------------------------------------------------------------------------------


def bench_recovery(args: argparse.Namespace) -> dict[str, Any]:
    quiet: bool = args.json
    runs = {}
    for label, acked in (("large", args.acked), ("small", args.small)):
        _progress(quiet, f"building {label}: {acked:,} acknowledged + {args.pending:,} pending")
        run = time_recovery(
            acked=acked,
            pending=args.pending,
            repeat=args.repeat,
            backend=args.backend,
            workdir=args.workdir,
        )
        _progress(quiet, f"  built in {run.build_seconds:.1f} s; open {run.median_seconds * 1000:.2f} ms")
        runs[label] = run
    large, small = runs["large"], runs["small"]
    return {
        "bench": "recovery",
        "pending": args.pending,
        "repeat": args.repeat,
        "backend": args.backend,
        "verified": True,
        "large_acked": large.acked,
        "small_acked": small.acked,
        "large_open_s": large.median_seconds,
        "small_open_s": small.median_seconds,
        "ratio_large_to_small": large.median_seconds / small.median_seconds,
        "large_open_samples_s": large.open_seconds,
        "small_open_samples_s": small.open_seconds,
        "large_build_s": large.build_seconds,
        "small_build_s": small.build_seconds,
        "large_data_bytes": large.data_bytes,
        "small_data_bytes": small.data_bytes,
    }


def show_recovery(out: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [
        ("ledger", "acknowledged", "pending", "open+tail (median)", "data.mdb"),
    ]
    for label in ("large", "small"):
        rows.append(
            (
                label,
                f"{out[f'{label}_acked']:,}",
                f"{out['pending']:,}",
                f"{out[f'{label}_open_s'] * 1000:.2f} ms",
                f"{out[f'{label}_data_bytes'] / 1024:,.0f} KiB",
            )
        )
    head = f"recovery: open_ledger + open_stream + read the tail, median of {out['repeat']}"
    return f"{head}\n{_table(rows)}\nlarge / small: {_ratio(out['ratio_large_to_small'])}"


# -- writer --------------------------------------------------------------------------------


def bench_writer(args: argparse.Namespace) -> dict[str, Any]:
    quiet: bool = args.json
    rates: dict[str, list[float]] = {}
    batch_rates: dict[str, list[float]] = {}
    interval = 0.0
    for k in range(args.repeat):
        run = run_writer(
            batch=args.batch,
            batches=args.batches,
            seconds=args.seconds,
            slice_ms=args.slice_ms,
            switch_interval=args.switch_interval,
            sync=not args.no_sync,
            backend=args.backend,
            workdir=args.workdir,
        )
        interval = run.switch_interval
        for phase in run.phases:
            rates.setdefault(phase.name, []).append(phase.msgs_per_s)
            batch_rates.setdefault(phase.name, []).append(phase.batches_per_s)
            _progress(
                quiet,
                f"round {k + 1}: {phase.name}: {_rate(phase.msgs_per_s)} msgs/s "
                f"({phase.batches} batches in {phase.seconds:.2f} s)",
            )
    solo, busy = median(rates["solo"]), median(rates["busy_loop"])
    return {
        "bench": "writer",
        "batch": args.batch,
        "repeat": args.repeat,
        "backend": args.backend,
        "slice_ms": args.slice_ms,
        "switch_interval_s": interval,
        "sync": not args.no_sync,
        "verified": True,
        "solo_msgs_per_s": solo,
        "busy_msgs_per_s": busy,
        "solo_batches_per_s": median(batch_rates["solo"]),
        "busy_batches_per_s": median(batch_rates["busy_loop"]),
        "ratio_busy_to_solo": busy / solo,
    }


def show_writer(out: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [
        ("ledger.streams.commit", "msgs/s", "batches/s"),
        ("solo", _rate(out["solo_msgs_per_s"]), f"{out['solo_batches_per_s']:,.1f}"),
        (
            f"beside a busy loop ({out['slice_ms']:g} ms slices, 0.5 ms idle)",
            _rate(out["busy_msgs_per_s"]),
            f"{out['busy_batches_per_s']:,.1f}",
        ),
    ]
    head = (
        f"writer: batches of {out['batch']} message commits (ack + state + 1 invoice), "
        f"{'durable' if out['sync'] else 'non-durable'}, "
        f"switch interval {out['switch_interval_s'] * 1000:g} ms, median of {out['repeat']}"
    )
    return f"{head}\n{_table(rows)}\nbusy / solo: {_ratio(out['ratio_busy_to_solo'])}"


# -- graphs --------------------------------------------------------------------------------


def bench_graphs(args: argparse.Namespace) -> dict[str, Any]:
    n: int = args.steps
    runs: int = args.runs
    n_each: int = args.concurrent_steps
    workdir: Path | None = args.workdir
    quiet: bool = args.json
    figures: dict[str, list[GraphFigure]] = {}
    fsyncs: list[float] = []
    skipped: dict[str, str] = {}
    peers: list[str] = []
    if not args.skip_peers:
        for name in PEERS:
            reason = peer_missing(name)
            if reason is None:
                peers.append(name)
            else:
                skipped[name] = reason
                _progress(quiet, f"peer {name} skipped: {reason}")

    def record(fig: GraphFigure) -> None:
        figures.setdefault(fig.name, []).append(fig)
        unit = "commits/s" if fig.name == "raw_lmdb" else "steps/s"
        _progress(quiet, f"  {fig.name}: {_rate(fig.steps_per_s)} {unit}")

    for k in range(args.repeat):
        _progress(quiet, f"round {k + 1}/{args.repeat}: {n:,} steps; {runs} concurrent runs of {n_each:,}")
        fsyncs.append(probe_fsync(workdir=workdir))
        _progress(quiet, f"  disk: {fsyncs[-1]:,.0f} fsyncs/s")
        record(run_plain(n, backend=args.backend))
        record(run_durable(n, backend=args.backend, workdir=workdir))
        record(run_plain(n_each, runs=runs, backend=args.backend))
        record(run_durable(n_each, runs=runs, backend=args.backend, workdir=workdir))
        record(run_raw_commits(n, workdir=workdir))
        for name in peers:
            record(run_peer(name, n, workdir=workdir))

    def rate(name: str) -> float:
        return median([fig.steps_per_s for fig in figures[name]])

    def per_step(name: str) -> dict[str, float]:
        costs = [fig.per_step_us() for fig in figures[name]]
        return {part: median([c[part] for c in costs]) for part in costs[0]}

    plain, durable, raw = rate("plain"), rate("durable"), rate("raw_lmdb")
    plain_c, durable_c = rate("plain_concurrent"), rate("durable_concurrent")
    reference = 1 / (1 / plain + 1 / raw)
    out: dict[str, Any] = {
        "bench": "graphs",
        "steps": n,
        "runs": runs,
        "concurrent_steps": n_each,
        "repeat": args.repeat,
        "backend": args.backend,
        "verified": True,
        "disk_fsyncs_per_s": median(fsyncs),
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "plain_steps_per_s": plain,
        "durable_steps_per_s": durable,
        "plain_concurrent_steps_per_s": plain_c,
        "durable_concurrent_steps_per_s": durable_c,
        "raw_lmdb_commits_per_s": raw,
        "raw_lmdb_record_bytes": figures["raw_lmdb"][0].record_bytes,
        "plain_plus_commit_steps_per_s": reference,
        "durable_checkpoints_per_run": figures["durable"][0].checkpoints,
    }
    rates = {name: rate(name) for name in peers}
    for name, value in rates.items():
        out[f"{name}_steps_per_s"] = value
        out[f"{name}_checkpoints"] = figures[name][0].checkpoints
    fastest = max(rates, key=rates.__getitem__) if rates else None
    out["fastest_peer"] = fastest
    out["peers_skipped"] = skipped
    out["ratio_durable_to_plain"] = durable / plain
    out["ratio_durable_to_plain_plus_commit"] = durable / reference
    out["ratio_concurrent_to_plain"] = durable_c / plain_c
    out["ratio_durable_to_fastest_peer"] = durable / rates[fastest] if fastest else None
    for name in ("plain", "durable", "plain_concurrent", "durable_concurrent"):
        out[f"{name}_per_step_us"] = per_step(name)
    out["adapter_loop_cpu_us_per_step"] = (
        out["durable_per_step_us"]["loop_cpu"] - out["plain_per_step_us"]["loop_cpu"]
    )
    goals: dict[str, bool] = {
        f"one_run_at_least_{GOAL_DURABLE_TO_PLAIN_PLUS_COMMIT}_of_plain_plus_commit": (
            out["ratio_durable_to_plain_plus_commit"] >= GOAL_DURABLE_TO_PLAIN_PLUS_COMMIT
        ),
        f"{runs}_concurrent_runs_at_least_0.5_of_plain": (
            out["ratio_concurrent_to_plain"] >= GOAL_CONCURRENT_TO_PLAIN
        ),
    }
    if fastest is not None:
        peer_ratio = out["ratio_durable_to_fastest_peer"]
        goals["at_least_2x_fastest_peer"] = peer_ratio >= GOAL_DURABLE_TO_FASTEST_PEER
    out["goals_met"] = goals
    out["rounds"] = [
        {"figure": fig.name, "steps_per_s": fig.steps_per_s, "per_step_us": fig.per_step_us()}
        for figs in figures.values()
        for fig in figs
    ]
    return out


def show_graphs(out: dict[str, Any]) -> str:
    def get(name: str) -> str:
        return _shown(out, f"{name}_steps_per_s", _rate)

    def ratio(name: str) -> str:
        return _shown(out, name, _ratio)

    rows: list[tuple[str, ...]] = [
        ("steps/s", "one run", f"{out['runs']} runs"),
        ("plain pydantic-graph", get("plain"), get("plain_concurrent")),
        ("DurableGraph on LMDB (durable)", get("durable"), get("durable_concurrent")),
        (
            f"raw py-lmdb, one durable commit ({out['raw_lmdb_record_bytes']} B) per step",
            _rate(out["raw_lmdb_commits_per_s"]),
            "-",
        ),
        ("plain step + one raw commit", _rate(out["plain_plus_commit_steps_per_s"]), "-"),
        ("LangGraph + SqliteSaver (durability=sync)", get("langgraph"), "-"),
        ("DBOS on SQLite", get("dbos"), "-"),
        ("durable / (plain step + raw commit)", ratio("ratio_durable_to_plain_plus_commit"), "-"),
        ("durable / plain", ratio("ratio_durable_to_plain"), ratio("ratio_concurrent_to_plain")),
        ("durable / fastest peer", ratio("ratio_durable_to_fastest_peer"), "-"),
    ]
    cost = []
    for name in ("plain", "durable", "plain_concurrent", "durable_concurrent"):
        c = out[f"{name}_per_step_us"]
        parts = [f"loop thread {c['loop_cpu']:.0f} CPU"]
        if "writer_cpu" in c:
            parts.append(f"writer thread {c['writer_cpu']:.0f} CPU")
        parts.append(f"{c['wall']:.0f} wall")
        if "commit_wait" in c:
            parts.append(f"commit wait {c['commit_wait']:.0f} per write")
        if "writes_per_txn" in c:
            parts.append(f"{c['writes_per_txn']:.1f} writes per LMDB txn")
        cost.append(f"  {name}: {', '.join(parts)}")
    goals = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["goals_met"].items())
    skipped = "".join(f"\npeer {name} skipped: {why}" for name, why in out["peers_skipped"].items())
    head = (
        f"graphs: {out['steps']:,} steps; {out['runs']} concurrent runs of {out['concurrent_steps']:,}; "
        f"median of {out['repeat']}, {out['backend']}, result verified "
        f"({out['durable_checkpoints_per_run']} checkpoints per durable run); "
        f"disk: {out['disk_fsyncs_per_s']:,.0f} fsyncs/s, load average {out['load_average_1m']:.1f} "
        f"on {out['cpus']} CPUs"
    )
    per_step = "\n".join(cost)
    return (
        f"{head}\n{_table(rows)}\nµs per step:\n{per_step}\n"
        f"adapter loop CPU: {out['adapter_loop_cpu_us_per_step']:.0f} µs per step\ngoals: {goals}{skipped}"
    )


# -- the command line ----------------------------------------------------------------------


# -- nodes ---------------------------------------------------------------------------------


def bench_nodes(args: argparse.Namespace) -> dict[str, Any]:
    n: int = args.nodes
    workdir: Path | None = args.workdir
    quiet: bool = args.json
    figures: dict[str, list[NodeFigure]] = {}
    skipped: str | None = "--skip-peers" if args.skip_peers else nodes_peer_missing()
    if skipped is not None and not args.skip_peers:
        _progress(quiet, f"peer langgraph skipped: {skipped}")
    for round_ in range(args.repeat):
        _progress(quiet, f"round {round_ + 1}/{args.repeat}: {n} nodes, wide and chain")
        for shape in ("wide", "chain"):
            ordinary = run_ordinary_nodes(shape, n)
            durable = run_durable_nodes(shape, n, workdir=workdir)
            # what the loop's other tasks see with no ledger at all: a run of its own, probed
            figures.setdefault(f"{shape}_ordinary_probed", []).append(
                run_ordinary_nodes(shape, n, probe=True)
            )
            batch = 1 if shape == "chain" else max(1, round(n / max(durable.txns, 1)))
            raw = run_raw_nodes(n, batch, workdir=workdir)
            named = [(f"{shape}_ordinary", ordinary), (f"{shape}_durable", durable), (f"{shape}_raw", raw)]
            if skipped is None:
                named.append((f"langgraph_{shape}", run_langgraph_nodes(shape, n, workdir=workdir)))
            for name, fig in named:
                figures.setdefault(name, []).append(fig)
                _progress(quiet, f"  {name}: {fig.nodes_per_s:,.0f} nodes/s ({fig.txns} txns)")
    out: dict[str, Any] = {"bench": "nodes", "nodes": n, "repeat": args.repeat, "verified": True}
    for name, figs in figures.items():
        if name.endswith("_probed"):
            continue
        out[f"{name}_nodes_per_s"] = median([f.nodes_per_s for f in figs])
        out[f"{name}_txns"] = median([float(f.txns) for f in figs])
    out["raw_lmdb_commits_per_s"] = out["chain_raw_nodes_per_s"]  # one fsynced transaction per node
    out["chain_durable_to_raw"] = out["chain_durable_nodes_per_s"] / out["raw_lmdb_commits_per_s"]
    out["wide_durable_to_raw"] = out["wide_durable_nodes_per_s"] / out["wide_raw_nodes_per_s"]
    # A chain node can at best cost its ordinary run plus one raw fsynced commit of its records.
    out["chain_reference_nodes_per_s"] = 1 / (
        1 / out["chain_ordinary_nodes_per_s"] + 1 / out["raw_lmdb_commits_per_s"]
    )
    out["chain_durable_to_reference"] = out["chain_durable_nodes_per_s"] / out["chain_reference_nodes_per_s"]
    out["peers_skipped"] = {} if skipped is None else {"langgraph": skipped}
    lateness: list[float] = []
    for shape in ("wide", "chain"):
        samples = [s for fig in figures[f"{shape}_durable"] for s in fig.lateness]
        out[f"{shape}_durable_loop_lateness_p99_us"] = p99_us(samples)
        lateness.extend(samples)
        probed = [s for fig in figures[f"{shape}_ordinary_probed"] for s in fig.lateness]
        out[f"{shape}_ordinary_loop_lateness_p99_us"] = p99_us(probed)
    out["loop_lateness_p99_us"] = p99_us(lateness)
    goals: dict[str, bool] = {
        f"wide_at_least_{GOAL_WIDE_DURABLE_NODES_PER_S}_durable_nodes_per_s": (
            out["wide_durable_nodes_per_s"] >= GOAL_WIDE_DURABLE_NODES_PER_S
        ),
        f"chain_at_least_{GOAL_CHAIN_TO_REFERENCE}_of_ordinary_plus_one_fsync": (
            out["chain_durable_to_reference"] >= GOAL_CHAIN_TO_REFERENCE
        ),
    }
    if skipped is None:
        for shape in ("wide", "chain"):
            ratio = out[f"{shape}_durable_nodes_per_s"] / out[f"langgraph_{shape}_nodes_per_s"]
            out[f"ratio_{shape}_durable_to_langgraph"] = ratio
            goal = f"{shape}_at_least_{GOAL_NODES_TO_LANGGRAPH:g}x_langgraph"
            goals[goal] = ratio >= GOAL_NODES_TO_LANGGRAPH
    out["goals"] = goals
    return out


def show_nodes(out: dict[str, Any]) -> str:
    def rate(name: str) -> str:
        return _shown(out, f"{name}_nodes_per_s", _rate)

    def us(name: str) -> str:
        return _shown(out, name, _rate)

    rows: list[tuple[str, ...]] = [
        ("nodes/s", "wide", "chain"),
        ("ordinary mode (in memory)", rate("wide_ordinary"), rate("chain_ordinary")),
        ("checkpoint mode on LMDB (durable)", rate("wide_durable"), rate("chain_durable")),
        ("raw py-lmdb, the same records and batches", rate("wide_raw"), rate("chain_raw")),
        ("ordinary + one raw fsynced commit per node", "-", _rate(out["chain_reference_nodes_per_s"])),
        ("LangGraph + SqliteSaver (durability=sync)", rate("langgraph_wide"), rate("langgraph_chain")),
        ("LMDB transactions (durable)", _rate(out["wide_durable_txns"]), _rate(out["chain_durable_txns"])),
        ("durable / raw", _ratio(out["wide_durable_to_raw"]), _ratio(out["chain_durable_to_raw"])),
        ("durable / (ordinary + raw commit)", "-", _ratio(out["chain_durable_to_reference"])),
        (
            "durable / LangGraph",
            _shown(out, "ratio_wide_durable_to_langgraph", _ratio),
            _shown(out, "ratio_chain_durable_to_langgraph", _ratio),
        ),
        (
            "loop lateness p99 µs (durable)",
            us("wide_durable_loop_lateness_p99_us"),
            us("chain_durable_loop_lateness_p99_us"),
        ),
        (
            "loop lateness p99 µs (ordinary, no ledger)",
            us("wide_ordinary_loop_lateness_p99_us"),
            us("chain_ordinary_loop_lateness_p99_us"),
        ),
    ]
    goals = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["goals"].items())
    skipped = "".join(f"\npeer {name} skipped: {why}" for name, why in out["peers_skipped"].items())
    return (
        f"nodes: {out['nodes']} per graph, median of {out['repeat']}\n{_table(rows)}\ngoals: {goals}{skipped}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, repeat: int) -> None:
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--repeat", type=int, default=repeat, help="runs to take the median of")
        p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
        p.add_argument("--workdir", type=Path, default=None, help="where temporary ledgers go")

    p = sub.add_parser("streams", help="the demo pipeline vs. raw py-lmdb and sqlite3")
    p.add_argument("--messages", type=int, default=100_000, help="orders through the pipeline")
    p.add_argument("--window", type=int, default=WINDOW, help="handle_messages window")
    p.add_argument(
        "--batch", type=int, default=0, help="orders per raw py-lmdb transaction (default: the window)"
    )
    p.add_argument("--skip-sqlite", action="store_true", help="leave out the (slow) sqlite3 loops")
    p.add_argument(
        "--store", choices=("lmdb", "postgres"), default="lmdb", help="the ledger to measure (default lmdb)"
    )
    p.add_argument(
        "--url",
        default=None,
        help="with --store postgres: a server to use (its databases are made per run); default a private one",
    )
    p.add_argument(
        "--per-message", type=int, default=2_000, help="orders through the per-message psycopg loop (slow)"
    )
    p.add_argument(
        "--workers",
        type=lambda text: [int(k) for k in text.split(",") if k],
        default=[1, 2, 4],
        metavar="K,K,...",
        help="with --store postgres: run the demo with these numbers of worker processes (default 1,2,4;"
        " empty: none)",
    )
    p.add_argument(
        "--notify-samples",
        type=int,
        default=40,
        help="with --store postgres: messages from another process to an idle member (default 40)",
    )
    p.add_argument(
        "--notify-idle",
        type=float,
        default=3.0,
        metavar="S",
        help="with --store postgres: seconds the idle member's transactions are counted (default 3)",
    )
    common(p, 1)

    p = sub.add_parser("recovery", help="open time with 1,000,000 vs 1,000 acknowledged messages")
    p.add_argument("--acked", type=int, default=1_000_000, help="acknowledged messages (large ledger)")
    p.add_argument("--small", type=int, default=1_000, help="acknowledged messages (small ledger)")
    p.add_argument("--pending", type=int, default=100, help="unacknowledged messages in both")
    common(p, 7)

    p = sub.add_parser("writer", help="ledger commit rate solo vs. beside a CPU-busy loop")
    p.add_argument("--batch", type=int, default=WINDOW, help="message commits per commit call")
    p.add_argument("--batches", type=int, default=100, help="commit calls per phase (at most)")
    p.add_argument("--seconds", type=float, default=5.0, help="time limit per phase")
    p.add_argument("--slice-ms", type=float, default=2.0, help="busy task's work between yields")
    p.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval for the busy phase"
    )
    p.add_argument("--no-sync", action="store_true", help="a non-durable ledger (no fsync per batch)")
    common(p, 3)

    p = sub.add_parser("graphs", help="DurableGraph vs. plain pydantic-graph, raw LMDB commits and peers")
    p.add_argument("--steps", type=int, default=1_000, help="steps of the single runs (and the peers')")
    p.add_argument("--runs", type=int, default=100, help="concurrent runs")
    p.add_argument("--concurrent-steps", type=int, default=100, help="steps of each concurrent run")
    p.add_argument("--skip-peers", action="store_true", help="leave out LangGraph and DBOS")
    common(p, 3)

    p = sub.add_parser("latency", help="send-to-delivery latency at paced rates, LMDB and PostgreSQL")
    p.add_argument(
        "--rates",
        type=parse_rates,
        default=parse_rates("1000,50000,max"),
        metavar="R,R,...",
        help="orders a second of the paced source; max: as fast as it sends (default 1000,50000,max)",
    )
    p.add_argument("--seconds", type=float, default=2.0, help="length of each paced run")
    p.add_argument("--saturation-orders", type=int, default=100_000, help="orders of the saturation runs")
    p.add_argument("--commits", type=int, default=500, help="raw commits and bare ledger writes timed")
    p.add_argument("--skip-postgres", action="store_true", help="leave out the PostgreSQL ledger")
    p.add_argument("--url", default=None, help="a PostgreSQL server to use (default: a private one)")
    common(p, 1)

    p = sub.add_parser("nodes", help="durable node commits (wide graph, chain) vs ordinary mode and raw LMDB")
    p.add_argument("--nodes", type=int, default=1_000, help="nodes of each graph")
    p.add_argument("--skip-peers", action="store_true", help="leave out LangGraph")
    common(p, 3)

    p = sub.add_parser(
        "keyed", help="per-key totals over many keys, split among members, and PostgreSQL workers"
    )
    p.add_argument("--messages", type=int, default=20_000, help="orders of each LMDB configuration")
    p.add_argument(
        "--keys",
        type=parse_counts,
        metavar="K,K,...",
        default=[10, 10_000, 1_000_000],
        help="customers of the keyed-state figures (default 10,10000,1000000)",
    )
    p.add_argument(
        "--explicit-keys",
        type=parse_counts,
        metavar="K,K,...",
        default=[10, 10_000],
        help="customers of the baseline kept in one explicit state (default 10,10000)",
    )
    p.add_argument(
        "--expiring-keys",
        type=parse_counts,
        metavar="K,K,...",
        default=None,
        help="customers of the keyed state with a ttl, beside the same without (default the most of --keys)",
    )
    p.add_argument(
        "--updates",
        type=int,
        default=None,
        metavar="N",
        help="orders of the most --keys run long, each an update of a key held (default 10 times "
        "--messages; 0 leaves it out)",
    )
    p.add_argument(
        "--log-merge",
        type=int,
        default=50_000,
        metavar="N",
        help="keys the raw loop's log holds before it merges them into the table, in the --updates run "
        "(default 50,000; 0 leaves the log loop out)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="time budget of each configuration's timed part; a slower one is cut short (default 10)",
    )
    p.add_argument(
        "--members",
        type=parse_counts,
        metavar="K,K,...",
        default=[1, 2, 4],
        help="members sharing the work (default 1,2,4)",
    )
    p.add_argument(
        "--members-keys", type=int, default=10, help="customers of the members figures (default 10)"
    )
    p.add_argument("--window", type=int, default=WINDOW, help="handle_messages window")
    p.add_argument("--skip-postgres", action="store_true", help="leave out the PostgreSQL workers")
    p.add_argument("--url", default=None, help="a PostgreSQL server to use (default: a private one)")
    p.add_argument(
        "--pg-messages",
        type=int,
        default=200_000,
        help="orders of each PostgreSQL configuration (default 200000)",
    )
    p.add_argument("--pg-keys", type=int, default=10, help="customers of the PostgreSQL figures (default 10)")
    p.add_argument(
        "--pg-shards", type=int, default=8, help="partitions (or runs) the PostgreSQL workload is split into"
    )
    p.add_argument(
        "--pg-mode",
        choices=("members", "runs"),
        default="members",
        help="PostgreSQL workers as group members on a partitioned stream (default), or as run workers",
    )
    p.add_argument(
        "--workers",
        type=parse_counts,
        metavar="K,K,...",
        default=[1, 2, 4],
        help="worker processes on PostgreSQL (default 1,2,4)",
    )
    common(p, 1)
    return parser


Bench = Callable[[argparse.Namespace], dict[str, Any]]
Show = Callable[[dict[str, Any]], str]

_COMMANDS: dict[str, tuple[Bench, Show]] = {
    "streams": (bench_streams, show_streams),
    "recovery": (bench_recovery, show_recovery),
    "writer": (bench_writer, show_writer),
    "graphs": (bench_graphs, show_graphs),
    "nodes": (bench_nodes, show_nodes),
    "latency": (lambda args: bench_latency(args, partial(_progress, args.json)), show_latency),
    "keyed": (lambda args: bench_keyed(args, partial(_progress, args.json)), show_keyed),
}


def _bench_error(exc: BaseException) -> BenchError | None:
    """The :class:`BenchError` behind ``exc`` (task groups wrap what their bodies raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, BenchError) else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.repeat < 1:
        print("bench: --repeat must be at least 1", file=sys.stderr)
        return 2
    run, show = _COMMANDS[args.command]
    try:
        out = run(args)
    except (BenchError, BaseExceptionGroup) as exc:
        error = _bench_error(exc)
        if error is None:
            raise
        print(f"bench: verification failed, no figures reported: {error}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2) if args.json else show(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
