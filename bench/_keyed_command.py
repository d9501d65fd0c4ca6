"""The command ``python -m bench keyed``: per-key totals over many keys, members, and PostgreSQL workers.

Three sets of figures, each configuration on a fresh store, medians of
``--repeat`` rounds:

* ``keyed_<K>``: one group keeping a total per customer in keyed state,
  over K customers (``--keys``), on a durable LMDB ledger
  (:mod:`bench._keyed`); ``explicit_<K>``, the baseline, the same with every
  total in one explicit state (``--explicit-keys``); ``expiring_<K>``, the
  same keyed state with a ttl (``--expiring-keys``, by default the most of
  ``--keys``): what expiry costs where it removes nothing;
* ``raw_keyed_<K>``: the store's limit, a plain py-lmdb loop making the
  same reads and writes (:mod:`bench._keyed_raw`), in the same run;
* ``updated_<K>``: the most of ``--keys`` with ``--updates`` orders (by
  default ten times ``--messages``: 200,000), every one an update of a
  customer the group holds, beside ``raw_updated_<K>``, the raw loop doing
  the same: the keyed state as it runs for long, not only as it fills; and
  ``raw_log_updated_<K>``, the raw loop appending each transaction's totals
  to a log merged into the table every ``--log-merge`` keys: the limit of a
  log-structured layout on the same store;
* ``members_<M>``: the same over ``--members-keys`` customers, in keyed
  state, on a stream of M partitions by customer handled by M handlers at
  once in one process (:mod:`bench._keyed_members`, ``--members``);
* ``pg_workers_<W>``: the workload on the PostgreSQL ledger, handled by W
  worker processes on one server (``--skip-postgres`` leaves it out): by
  default W group members sharing a stream of ``--pg-shards`` partitions
  (:mod:`bench._keyed_pg_members`); with ``--pg-mode runs``, the way
  there was before members, ``--pg-shards`` runs claimed by W run workers
  (:mod:`bench._keyed_postgres`).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._keyed import KeyedRun, keys_label, run_keyed
from ._keyed_members import run_members
from ._keyed_raw import RawKeyedRun, run_raw_keyed
from ._latency import postgres_target

__all__ = ["MEMBERS_MODE", "bench_keyed", "parse_counts", "show_keyed"]

#: What ``members_<M>`` measures today.
MEMBERS_MODE: Final = "a stream of M partitions by customer, one handler each, in one process"
#: What ``pg_workers_<W>`` measures, by ``--pg-mode``.
PG_MODES: Final = {
    "members": "W processes, each a member of one group on a stream of --pg-shards partitions "
    "(ledger.postgres.consume), keyed state",
    "runs": "--pg-shards runs claimed by W run workers (python -m ledger worker), explicit state",
}
#: The goals of the issue "Keyed state and partitioned streams".
GOAL_MOST_KEYS_TO_FEWEST = 0.8
GOAL_MEMBERS_TO_ONE = 0.9
#: The issue "Keyed state a million keys wide": expiry costs at most 5% of the rate without it,
#: the most keys run at half the rate of the fewest, and every key count at 0.8 of the raw loop.
GOAL_EXPIRING_TO_KEYED = 0.95
GOAL_MOST_KEYS_TO_FEWEST_WIDE = 0.5
GOAL_KEYED_TO_RAW = 0.8
GOAL_PG_CPU_TO_ONE_WORKER = 1.1
GOAL_PG_ROLLBACKS_PER_1K = 1.0


def parse_counts(text: str) -> list[int]:
    """``10,10000,1000000`` as counts; ``_`` may group digits (``1_000_000``)."""
    counts = [int(part.strip().replace("_", "")) for part in text.split(",")]
    if not counts or any(c < 1 for c in counts):
        raise ValueError(f"counts must be positive: {text!r}")
    return counts


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _lmdb_figures(prefix: str, runs: Sequence[KeyedRun]) -> dict[str, Any]:
    return {
        f"{prefix}_msgs_per_s": _median([r.msgs_per_s for r in runs]),
        f"{prefix}_messages": _median([r.messages for r in runs]),
        f"{prefix}_seconds": _median([r.seconds for r in runs]),
        f"{prefix}_cut_short": any(r.cut_short for r in runs),
        f"{prefix}_loop_cpu_us_per_msg": _median([r.loop_cpu / r.messages * 1e6 for r in runs]),
        f"{prefix}_state_bytes": runs[0].state_bytes,
    }


def bench_keyed(args: Any, progress: Callable[[str], None]) -> dict[str, Any]:
    """Every configuration, ``args.repeat`` rounds; the medians, ratios and goals."""
    n: int = args.messages
    keyed: dict[int, list[KeyedRun]] = {}
    explicit: dict[int, list[KeyedRun]] = {}
    expiring: dict[int, list[KeyedRun]] = {}
    expiring_keys: list[int] = args.expiring_keys or [max(args.keys)]
    raw: dict[int, list[RawKeyedRun]] = {}
    updates: int = args.updates if args.updates is not None else 10 * n
    updated: list[KeyedRun] = []
    raw_updated: list[RawKeyedRun] = []
    raw_log_updated: list[RawKeyedRun] = []
    members: dict[int, list[KeyedRun]] = {}
    pg_rounds: dict[int, list[dict[str, Any]]] = {}
    startups: list[float] = []
    pg, pg_skipped, stack = postgres_target(args, progress)
    settings: dict[str, str] = {}
    try:
        if pg is not None:
            import psycopg

            with psycopg.connect(pg.server_url, autocommit=True) as conn:
                for name in ("server_version", "synchronous_commit", "default_transaction_isolation"):
                    row = conn.execute(f"SHOW {name}").fetchone()
                    settings[name] = str(row[0]) if row is not None else "?"
        for k in range(args.repeat):
            progress(f"round {k + 1}/{args.repeat}: {n:,} orders, at most {args.seconds:g} s a configuration")
            for keys in args.keys:
                # with a ttl right beside the same keys without, which goes first alternating by round
                states = ["keyed", "expiring"] if keys in expiring_keys else ["keyed"]
                for state in states[:: -1 if k % 2 else 1]:
                    run = run_keyed(
                        n, keys=keys, state=state, seconds=args.seconds, window=args.window,
                        backend=args.backend, workdir=args.workdir,
                    )  # fmt: skip
                    (keyed if state == "keyed" else expiring).setdefault(keys, []).append(run)
                    progress(f"  {keys:,} keys{' with a ttl' if state == 'expiring' else ''}: {_said(run)}")
                baseline = run_raw_keyed(n, keys=keys, batch=args.window, workdir=args.workdir)
                raw.setdefault(keys, []).append(baseline)
                progress(f"  {keys:,} keys, raw py-lmdb: {baseline.msgs_per_s:,.0f} msgs/s")
            if updates:  # the most keys, many orders: each an update of a key the group holds
                widest = max(args.keys)
                run = run_keyed(
                    updates, keys=widest, seconds=args.seconds, window=args.window, backend=args.backend,
                    workdir=args.workdir,
                )  # fmt: skip
                updated.append(run)
                progress(f"  {widest:,} keys, {updates:,} orders: {_said(run)}")
                baseline = run_raw_keyed(updates, keys=widest, batch=args.window, workdir=args.workdir)
                raw_updated.append(baseline)
                progress(
                    f"  {widest:,} keys, {updates:,} orders, raw py-lmdb: {baseline.msgs_per_s:,.0f} msgs/s"
                )
                if args.log_merge:
                    baseline = run_raw_keyed(
                        updates, keys=widest, batch=args.window, log_merge=args.log_merge,
                        workdir=args.workdir,
                    )  # fmt: skip
                    raw_log_updated.append(baseline)
                    progress(
                        f"  {widest:,} keys, {updates:,} orders, raw py-lmdb with a log merged every "
                        f"{args.log_merge:,} keys: {baseline.msgs_per_s:,.0f} msgs/s"
                    )
            for keys in [e for e in expiring_keys if e not in args.keys]:  # the others ran beside keyed
                run = run_keyed(
                    n, keys=keys, state="expiring", seconds=args.seconds, window=args.window,
                    backend=args.backend, workdir=args.workdir,
                )  # fmt: skip
                expiring.setdefault(keys, []).append(run)
                progress(f"  {keys:,} keys with a ttl: {_said(run)}")
            for keys in args.explicit_keys:
                run = run_keyed(
                    n, keys=keys, state="explicit", seconds=args.seconds, window=args.window,
                    backend=args.backend, workdir=args.workdir,
                )  # fmt: skip
                explicit.setdefault(keys, []).append(run)
                progress(f"  {keys:,} keys in one explicit state: {_said(run)}")
            for m in args.members:
                run = run_members(
                    n, keys=args.members_keys, members=m, seconds=args.seconds, window=args.window,
                    backend=args.backend, workdir=args.workdir,
                )  # fmt: skip
                members.setdefault(m, []).append(run)
                progress(f"  {m} member(s) over {args.members_keys:,} keys: {_said(run)}")
            if pg is not None:
                from ._keyed_pg_members import member_startup_cpu, run_keyed_members
                from ._keyed_postgres import run_keyed_workers, worker_startup_cpu
                from ._postgres import new_database

                members_mode = args.pg_mode == "members"
                fresh = new_database(pg.server_url, pg.make_url)
                startup = (
                    member_startup_cpu(fresh, partitions=args.pg_shards)
                    if members_mode
                    else worker_startup_cpu(fresh)
                )
                startups.append(startup)
                progress(f"  PostgreSQL: one idle worker's start-up and exit {startup * 1000:,.0f} ms CPU")
                for w in args.workers:
                    run_pg = run_keyed_members if members_mode else run_keyed_workers
                    options = {"partitions" if members_mode else "shards": args.pg_shards}
                    pg_run = run_pg(
                        pg.server_url,
                        new_database(pg.server_url, pg.make_url),
                        n=args.pg_messages,
                        keys=args.pg_keys,
                        workers=w,
                        data=pg.data,
                        **options,
                    )
                    figure = {
                        "workers": w,
                        "messages": pg_run.messages,
                        "seconds": pg_run.seconds,
                        "msgs_per_s": pg_run.msgs_per_s,
                        "cpu_us_per_msg": (pg_run.worker_cpu - w * startup) / pg_run.messages * 1e6,
                        "cpu_us_per_msg_with_startup": pg_run.worker_cpu / pg_run.messages * 1e6,
                        "server_cpu_us_per_msg": None
                        if pg_run.server_cpu is None
                        else pg_run.server_cpu / pg_run.messages * 1e6,
                        "txns": pg_run.commits + pg_run.rollbacks,
                        "rollbacks": pg_run.rollbacks,
                        "rollbacks_per_1k_txns": pg_run.rollbacks_per_1k_txns,
                    }
                    pg_rounds.setdefault(w, []).append(figure)
                    progress(
                        f"  PostgreSQL, {w} worker(s): {figure['msgs_per_s']:,.0f} msgs/s, "
                        f"{figure['cpu_us_per_msg']:,.1f} µs worker CPU a message, "
                        f"{pg_run.rollbacks} rollbacks in {figure['txns']:,} txns"
                    )
    finally:
        stack.close()

    goals: dict[str, bool] = {}
    out: dict[str, Any] = {
        "bench": "keyed",
        "messages": n,
        "timed_messages": n - 1,
        "keys": list(args.keys),
        "explicit_keys": list(args.explicit_keys),
        "expiring_keys": expiring_keys,
        "updates": updates,
        "seconds_budget": args.seconds,
        "members": list(args.members),
        "members_keys": args.members_keys,
        "members_mode": MEMBERS_MODE,
        "state": "keyed state: KeyedState(str, int, prefetch=customer), a total per customer, "
        "seeded with every customer at 0; explicit_<K>: one dict[str, int] of every total as the "
        "group's explicit state",
        "repeat": args.repeat,
        "backend": args.backend,
        "window": args.window,
        "store": "lmdb, durable",
        "verified": True,
        "postgres_skipped": pg_skipped,
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    for keys, runs in keyed.items():
        out.update(_lmdb_figures(f"keyed_{keys_label(keys)}", runs))
    for keys, runs in explicit.items():
        out.update(_lmdb_figures(f"explicit_{keys_label(keys)}", runs))
    for keys, runs in expiring.items():
        label = keys_label(keys)
        out.update(_lmdb_figures(f"expiring_{label}", runs))
        if keys in keyed:
            ratio = out[f"expiring_{label}_msgs_per_s"] / out[f"keyed_{label}_msgs_per_s"]
            out[f"ratio_expiring_{label}_to_keyed"] = ratio
            goals[f"expiring_{label}_at_least_{GOAL_EXPIRING_TO_KEYED}_of_keyed_{label}"] = (
                ratio >= GOAL_EXPIRING_TO_KEYED
            )
    for keys, baselines in raw.items():
        label = keys_label(keys)
        out[f"raw_keyed_{label}_msgs_per_s"] = _median([b.msgs_per_s for b in baselines])
        out[f"ratio_keyed_{label}_to_raw"] = (
            out[f"keyed_{label}_msgs_per_s"] / out[f"raw_keyed_{label}_msgs_per_s"]
        )
        goals[f"keyed_{label}_at_least_{GOAL_KEYED_TO_RAW}_of_raw_keyed_{label}"] = (
            out[f"ratio_keyed_{label}_to_raw"] >= GOAL_KEYED_TO_RAW
        )
    if updated:
        label = keys_label(max(args.keys))
        out.update(_lmdb_figures(f"updated_{label}", updated))
        out[f"raw_updated_{label}_msgs_per_s"] = _median([b.msgs_per_s for b in raw_updated])
        out[f"ratio_updated_{label}_to_raw"] = (
            out[f"updated_{label}_msgs_per_s"] / out[f"raw_updated_{label}_msgs_per_s"]
        )
    if raw_log_updated:
        label = keys_label(max(args.keys))
        out["log_merge"] = args.log_merge
        out[f"raw_log_updated_{label}_msgs_per_s"] = _median([b.msgs_per_s for b in raw_log_updated])
        out[f"ratio_raw_log_updated_{label}_to_raw_updated"] = (
            out[f"raw_log_updated_{label}_msgs_per_s"] / out[f"raw_updated_{label}_msgs_per_s"]
        )
        # a log-structured layout's limit against the table's over the fewest keys (the 0.5 goal)
        out[f"ratio_raw_log_updated_{label}_to_raw_keyed_{keys_label(min(args.keys))}"] = (
            out[f"raw_log_updated_{label}_msgs_per_s"]
            / out[f"raw_keyed_{keys_label(min(args.keys))}_msgs_per_s"]
        )
    for m, runs in members.items():
        out.update(_lmdb_figures(f"members_{m}", runs))
    fewest, most = min(args.keys), max(args.keys)
    if most != fewest:
        few, many = keys_label(fewest), keys_label(most)
        ratio = out[f"keyed_{many}_msgs_per_s"] / out[f"keyed_{few}_msgs_per_s"]
        out[f"ratio_keyed_{many}_to_{few}"] = ratio
        for goal in (GOAL_MOST_KEYS_TO_FEWEST, GOAL_MOST_KEYS_TO_FEWEST_WIDE):
            goals[f"keyed_{many}_at_least_{goal}_of_keyed_{few}"] = ratio >= goal
        # the same ratio for the store alone: what the disk and LMDB's pages allow
        out[f"ratio_raw_keyed_{many}_to_{few}"] = (
            out[f"raw_keyed_{many}_msgs_per_s"] / out[f"raw_keyed_{few}_msgs_per_s"]
        )
    widest = max(args.members)
    if 1 in members and widest > 1:
        ratio = out[f"members_{widest}_msgs_per_s"] / out["members_1_msgs_per_s"]
        out[f"ratio_members_{widest}_to_1"] = ratio
        goals[f"members_{widest}_at_least_{GOAL_MEMBERS_TO_ONE}_of_members_1"] = ratio >= GOAL_MEMBERS_TO_ONE
    if pg_rounds:
        out.update(_pg_figures(args, pg_rounds, startups, settings, goals))
    out["goals_met"] = goals
    out["runs"] = [
        *(r.summary() for runs in keyed.values() for r in runs),
        *(r.summary() for runs in explicit.values() for r in runs),
        *(r.summary() for runs in expiring.values() for r in runs),
        *(r.summary() for r in updated),
        *(
            {"keys": b.keys, "state": "raw py-lmdb", "messages": b.messages, "msgs_per_s": b.msgs_per_s}
            for baselines in [*raw.values(), raw_updated]
            for b in baselines
        ),
        *(
            {"keys": b.keys, "state": "raw py-lmdb, log", "messages": b.messages, "msgs_per_s": b.msgs_per_s}
            for b in raw_log_updated
        ),
        *({**r.summary(), "members_mode": MEMBERS_MODE} for runs in members.values() for r in runs),
        *(fig for figs in pg_rounds.values() for fig in figs),
    ]
    return out


def _pg_figures(
    args: Any,
    rounds: dict[int, list[dict[str, Any]]],
    startups: list[float],
    settings: dict[str, str],
    goals: dict[str, bool],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "pg_messages": args.pg_messages,
        "pg_keys": args.pg_keys,
        "pg_shards": args.pg_shards,
        "pg_workers": list(args.workers),
        "pg_mode": PG_MODES[args.pg_mode],
        "pg_server": settings,
        "pg_worker_startup_cpu_ms": _median(startups) * 1000,
        "pg_rollbacks_counted": "xact_rollback / (xact_commit + xact_rollback) of the bench database "
        "in pg_stat_database, across the workers' run",
    }
    for w, figs in rounds.items():
        for name in ("msgs_per_s", "seconds", "cpu_us_per_msg", "cpu_us_per_msg_with_startup", "txns"):
            out[f"pg_workers_{w}_{name}"] = _median([f[name] for f in figs])
        out[f"pg_workers_{w}_rollbacks_per_1k_txns"] = _median([f["rollbacks_per_1k_txns"] for f in figs])
        server = [f["server_cpu_us_per_msg"] for f in figs if f["server_cpu_us_per_msg"] is not None]
        out[f"pg_workers_{w}_server_cpu_us_per_msg"] = _median(server) if server else None
    most = max(rounds)
    out["pg_rollbacks_per_1k_txns"] = out[f"pg_workers_{most}_rollbacks_per_1k_txns"]
    if 1 in rounds and most > 1:
        ratio = out[f"pg_workers_{most}_cpu_us_per_msg"] / out["pg_workers_1_cpu_us_per_msg"]
        out[f"ratio_pg_workers_{most}_to_1_cpu_per_msg"] = ratio
        goals[f"pg_workers_{most}_cpu_per_msg_at_most_{GOAL_PG_CPU_TO_ONE_WORKER}_of_1"] = (
            ratio <= GOAL_PG_CPU_TO_ONE_WORKER
        )
    goals[f"pg_fewer_than_{GOAL_PG_ROLLBACKS_PER_1K:g}_rollback_per_1k_txns"] = (
        out["pg_rollbacks_per_1k_txns"] < GOAL_PG_ROLLBACKS_PER_1K
    )
    return out


def _said(run: KeyedRun) -> str:
    cut = f" (cut short: {run.messages:,} orders)" if run.cut_short else ""
    return (
        f"{run.msgs_per_s:,.0f} msgs/s, {run.loop_cpu / run.messages * 1e6:,.1f} µs loop CPU a message{cut}"
    )


def _cell(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _raw_row(out: dict[str, Any], keys: int) -> tuple[str, ...]:
    return (
        f"{keys:,} keys, raw py-lmdb loop",
        _cell(out[f"raw_keyed_{keys_label(keys)}_msgs_per_s"]),
        "-",
        "-",
    )


def _lmdb_row(out: dict[str, Any], prefix: str, label: str) -> tuple[str, ...]:
    cut = (
        f" (cut short at {out['seconds_budget']:g} s: {out[f'{prefix}_messages']:,.0f} orders)"
        if out[f"{prefix}_cut_short"]
        else ""
    )
    return (
        f"{label}{cut}",
        _cell(out[f"{prefix}_msgs_per_s"]),
        _cell(out[f"{prefix}_loop_cpu_us_per_msg"], "{:,.1f}"),
        _cell(out[f"{prefix}_state_bytes"]),
    )


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)])
        for row in rows
    ]


def show_keyed(out: dict[str, Any]) -> str:
    """The figures as tables: keys, members, PostgreSQL workers; then the goals."""
    rows: list[tuple[str, ...]] = [
        ("per-key totals on LMDB (durable)", "msgs/s", "loop CPU µs/msg", "state bytes")
    ]
    rows += [_lmdb_row(out, f"keyed_{keys_label(k)}", f"{k:,} keys, one group") for k in out["keys"]]
    rows += [_raw_row(out, k) for k in out["keys"]]
    if out["updates"]:
        widest = max(out["keys"])
        label = keys_label(widest)
        rows.append(
            _lmdb_row(out, f"updated_{label}", f"{widest:,} keys, {out['updates']:,} orders, one group")
        )
        rows.append(
            (f"{widest:,} keys, {out['updates']:,} orders, raw py-lmdb loop",
             _cell(out[f"raw_updated_{label}_msgs_per_s"]), "-", "-")
        )  # fmt: skip
        if f"raw_log_updated_{label}_msgs_per_s" in out:
            rows.append(
                (f"{widest:,} keys, {out['updates']:,} orders, raw py-lmdb, log merged every "
                 f"{out['log_merge']:,} keys", _cell(out[f"raw_log_updated_{label}_msgs_per_s"]), "-", "-")
            )  # fmt: skip
    rows += [
        _lmdb_row(out, f"expiring_{keys_label(k)}", f"{k:,} keys with a ttl, one group")
        for k in out["expiring_keys"]
    ]
    rows += [
        _lmdb_row(out, f"explicit_{keys_label(k)}", f"{k:,} keys in one explicit state")
        for k in out["explicit_keys"]
    ]
    rows += [
        _lmdb_row(out, f"members_{m}", f"{m} member(s) over {out['members_keys']:,} keys")
        for m in out["members"]
    ]
    lines = [
        f"keyed: {out['messages']:,} orders ({out['timed_messages']:,} timed), at most "
        f"{out['seconds_budget']:g} s a configuration, median of {out['repeat']}, {out['backend']}, "
        f"result verified; load average {out['load_average_1m']:.1f} on {out['cpus']} CPUs",
        f"state: {out['state']}; members: {out['members_mode']}",
        *_table(rows),
    ]
    if out.get("pg_workers"):
        server = out["pg_server"]
        isolation = server.get("default_transaction_isolation", "?")
        lines.append(
            f"PostgreSQL {server.get('server_version', '?')} ({isolation} by default; the ledger's calls "
            f"are serializable): {out['pg_messages']:,} orders over "
            f"{out['pg_keys']:,} keys in {out['pg_shards']} runs; one idle worker's start-up and exit "
            f"{out['pg_worker_startup_cpu_ms']:,.0f} ms CPU"
        )
        pg_rows: list[tuple[str, ...]] = [
            (
                "worker processes",
                "msgs/s",
                "worker CPU µs/msg",
                "with start-up",
                "server CPU µs/msg",
                "txns",
                "rollbacks/1k txns",
            )
        ]
        for w in out["pg_workers"]:
            p = f"pg_workers_{w}"
            pg_rows.append(
                (
                    str(w),
                    _cell(out[f"{p}_msgs_per_s"]),
                    _cell(out[f"{p}_cpu_us_per_msg"], "{:,.1f}"),
                    _cell(out[f"{p}_cpu_us_per_msg_with_startup"], "{:,.1f}"),
                    _cell(out[f"{p}_server_cpu_us_per_msg"], "{:,.1f}"),
                    _cell(out[f"{p}_txns"]),
                    _cell(out[f"{p}_rollbacks_per_1k_txns"], "{:,.2f}"),
                )
            )
        lines += _table(pg_rows)
    elif out.get("postgres_skipped"):
        lines.append(f"PostgreSQL skipped: {out['postgres_skipped']}")
    goals = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in out["goals_met"].items())
    lines.append(f"goals: {goals}")
    return "\n".join(lines)
