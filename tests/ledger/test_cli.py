"""``python -m ledger``: the demo and inspect commands, in process and as a subprocess."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import lmdb
import msgspec
import pytest

import streams
from ledger import (
    CorruptRecordError,
    DemoMismatchError,
    LedgerEnv,
    LedgerLockedError,
    LedgerPathError,
    NotALedgerError,
    SchemaVersionError,
    inspect_ledger,
    open_ledger,
)
from ledger._cli import _ProgressLine, main
from ledger._demo import DemoProgress, run_demo_pipeline
from ledger._format import LedgerMeta
from ledger.lmdb._demo import run_demo
from ledger.lmdb._seal import seal
from streams import Key, MemoryStore, Stream, open_scope

from ..ledger_command import ledger_command

N = 500
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return ledger_command(*args, timeout=timeout)


def inspect(path: Path) -> dict[str, Any]:
    env = LedgerEnv.open(path, create=False)
    try:
        report = inspect_ledger(env)
    finally:
        env.close()
    report.pop("owner")  # this process, which opened it to read it: no part of what it holds
    return report


def streams_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for s in report["streams"]}


def snapshot(path: Path) -> tuple[bytes, dict[str, Any]]:
    """What must not change: the ledger's data file and what inspect reads from it."""
    return (path / "data.mdb").read_bytes(), inspect(path)


def assert_demo_answer(report: dict[str, Any], n: int, *, generation: int) -> None:
    streams = streams_of(report)
    orders, invoices = streams["orders"], streams["invoices"]
    assert orders["appended"] == n and orders["finished"] and not orders["failed"]
    assert invoices["appended"] == n and invoices["finished"] and not invoices["failed"]
    assert orders["generation"] == invoices["generation"] == generation
    [billing] = orders["groups"]
    [audit] = invoices["groups"]
    assert billing["group"] == "billing" and audit["group"] == "audit"
    assert billing["acked_through"] == audit["acked_through"] == n
    assert billing["pending"] == audit["pending"] == 0
    assert billing["exhausted"] == audit["exhausted"] == 0
    assert billing["state"] == {"total": n * (n + 1) // 2, "count": n}
    assert audit["state"] == {"count": n}


# -- in process -------------------------------------------------------------------------------


async def test_run_demo_gives_the_uninterrupted_answer_and_reports_progress(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    reports: list[DemoProgress] = []
    summary = await run_demo(path, N, progress=reports.append, progress_interval=0.01)
    assert (summary.orders, summary.billing_total, summary.invoices, summary.audit_count) == (
        N,
        N * (N + 1) // 2,
        N,
        N,
    )
    assert summary.handled == N and not summary.resumed and not summary.already_finished
    assert len(reports) >= 2
    assert reports[0].messages == N
    assert (reports[-1].orders, reports[-1].billed, reports[-1].invoices, reports[-1].audited) == (N, N, N, N)
    assert all(a.billed <= b.billed for a, b in itertools.pairwise(reports))
    assert_demo_answer(inspect(path), N, generation=1)


async def test_finished_demo_run_again_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    first = await run_demo(path, N)
    before = snapshot(path)
    again = await run_demo(path, N)
    assert again.already_finished and again.handled == 0
    assert (again.orders, again.billing_total, again.invoices, again.audit_count) == (
        first.orders,
        first.billing_total,
        first.invoices,
        first.audit_count,
    )
    assert snapshot(path) == before
    assert_demo_answer(before[1], N, generation=1)


async def test_cancelled_demo_resumes_to_the_same_answer(tmp_path: Path) -> None:
    """Cancelling run_demo from outside is clean at any moment, and each restart resumes."""
    path = tmp_path / "ledger"
    n = 8000
    last = 0
    # A cancelled handler still confirms the window it finished (up to 1,024 orders) and the
    # cancel lands at a progress report, so each stop leaves well over 2,048 orders to go.
    for stop_at in (1, n // 8, n // 4, n // 2):
        with anyio.CancelScope() as scope:

            def stop(p: DemoProgress, stop_at: int = stop_at) -> None:
                if p.billed >= stop_at:
                    scope.cancel()

            await run_demo(path, n, progress=stop, progress_interval=0.001)
        assert scope.cancelled_caught
        billing = streams_of(inspect(path))["orders"]["groups"][0]
        assert last <= billing["acked_through"] < n
        assert billing["state"] in (
            None,
            {"total": sum(range(billing["acked_through"] + 1)), "count": billing["acked_through"]},
        )
        last = billing["acked_through"]
    summary = await run_demo(path, n)
    assert summary.resumed and 0 < summary.handled < n
    assert (summary.billing_total, summary.invoices, summary.audit_count) == (n * (n + 1) // 2, n, n)
    assert_demo_answer(inspect(path), n, generation=5)


async def test_demo_pipeline_resumes_on_the_memory_store() -> None:
    store = MemoryStore()
    n = 2000
    with anyio.CancelScope() as scope:

        def stop_midway(p: DemoProgress) -> None:
            if p.billed >= n // 2:
                scope.cancel()

        await run_demo_pipeline(store, n, progress=stop_midway, progress_interval=0.001)
    summary = await run_demo_pipeline(store, n)
    assert summary.resumed
    assert (summary.orders, summary.billing_total, summary.invoices, summary.audit_count) == (
        n,
        n * (n + 1) // 2,
        n,
        n,
    )


async def test_demo_past_the_requested_messages_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    with anyio.CancelScope() as scope:

        def stop_after_orders(p: DemoProgress) -> None:
            if p.orders >= 200:
                scope.cancel()

        await run_demo(path, 20_000, progress=stop_after_orders, progress_interval=0.001)
    before = snapshot(path)
    appended = streams_of(before[1])["orders"]["appended"]
    assert 200 <= appended < 20_000
    with pytest.raises(DemoMismatchError, match=f"{appended} orders"):
        await run_demo(path, 100)
    assert snapshot(path) == before


async def test_run_demo_on_a_path_that_is_not_a_ledger_raises_the_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a ledger")
    with pytest.raises(NotALedgerError):
        await run_demo(path, 10)
    assert path.read_text() == "not a ledger"


def test_inspect_in_process_prints_json_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 50)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert_demo_answer(report, 50, generation=1)
    assert main(["inspect", str(path)]) == 0
    table = capsys.readouterr().out
    assert "stream demo/source/orders  generation 1  appended 50  finished" in table
    assert "stream demo/billing/invoices  generation 1  appended 50  finished" in table
    assert '{"total": 1275, "count": 50}' in table
    assert '{"count": 50}' in table


# -- as a subprocess ---------------------------------------------------------------------------


def test_cli_demo_prints_the_summary_then_a_rerun_says_finished_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    n = 2000
    done = cli("demo", str(path), "--messages", str(n))
    assert done.returncode == 0, done.stderr
    [summary] = done.stdout.splitlines()
    assert summary.startswith(
        f"demo finished: {n} orders, billing total {n * (n + 1) // 2}, {n} invoices, audit count {n}; "
    )
    assert "msgs/s" in summary
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines(), "the demo shows progress on stderr"
    assert all(line.startswith("progress: ") for line in done.stderr.splitlines())

    before = snapshot(path)
    assert_demo_answer(before[1], n, generation=1)
    again = cli("demo", str(path), "--messages", str(n))
    assert again.returncode == 0, again.stderr
    assert "already finished; nothing changed" in again.stdout
    assert f"billing total {n * (n + 1) // 2}" in again.stdout
    assert snapshot(path) == before

    shown = cli("inspect", str(path), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"owner": None, **before[1]}  # nobody has it open now
    table = cli("inspect", str(path))
    assert table.returncode == 0
    assert f"appended {n}  finished" in table.stdout
    assert snapshot(path) == before


def test_cli_demo_asking_a_finished_demo_for_another_size_is_a_typed_error_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger"
    done = cli("demo", str(path), "--messages", "1000")
    assert done.returncode == 0, done.stderr
    before = snapshot(path)
    for messages in (2000, 500):
        with pytest.raises(DemoMismatchError) as caught:  # the same error, raised in this process
            anyio.run(run_demo, path, messages)
        assert str(caught.value) == (
            f"ledger {path} holds a finished demo of 1000 orders, not {messages}; "
            f"run it again with --messages 1000 to see its figures, `python -m ledger demo {path} --fresh` "
            "deletes it and starts a new one, or --run-id ID runs another beside it"
        )
        again = cli("demo", str(path), "--messages", str(messages))
        assert again.returncode == 2
        assert again.stdout == ""
        assert again.stderr.splitlines() == [f"error: {caught.value}"]
        assert snapshot(path) == before
    assert_demo_answer(before[1], 1000, generation=1)


def test_cli_demo_runs_on_trio(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    done = cli("demo", str(path), "--messages", "300", "--backend", "trio")
    assert done.returncode == 0, done.stderr
    assert_demo_answer(inspect(path), 300, generation=1)


def expected_error(path: Path, error: type[Exception]) -> str:
    """The message the typed error gives for ``path`` when this process opens it."""
    with pytest.raises(error) as caught:
        LedgerEnv.open(path, create=False)
    return f"error: {caught.value}"


@pytest.mark.parametrize("command", ["demo", "inspect"])
def test_cli_refuses_a_file_that_is_not_a_ledger(tmp_path: Path, command: str) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a ledger")
    done = cli(command, str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [expected_error(path, NotALedgerError)]
    assert path.read_text() == "not a ledger"


@pytest.mark.parametrize("command", ["demo", "inspect"])
def test_cli_refuses_a_directory_of_other_files(tmp_path: Path, command: str) -> None:
    path = tmp_path / "photos"
    path.mkdir()
    (path / "cat.jpg").write_bytes(b"\xff\xd8")
    done = cli(command, str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [expected_error(path, NotALedgerError)]
    assert os.listdir(path) == ["cat.jpg"]


def test_cli_demo_where_no_directory_can_be_made_is_a_one_line_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where a parent directory would go")
    path = tmp_path / "file" / "ledger"
    done = cli("demo", str(path), "-n", "10")
    assert done.returncode == 2
    with pytest.raises(LedgerPathError) as caught:  # the same error, raised in this process
        LedgerEnv.open(path)
    assert done.stderr.splitlines() == [f"error: {caught.value}"]
    assert str(caught.value).startswith(f"cannot create the ledger directory {path}: Not a directory")
    assert (tmp_path / "file").read_text().startswith("a file")


def test_cli_demo_refuses_a_ledger_that_holds_anything_but_the_demo(tmp_path: Path) -> None:
    path = tmp_path / "app"

    async def application() -> None:
        async with open_ledger(path) as ledger, open_scope(ledger.streams, scope="app") as scope:
            stream = await scope.open_stream(Key("payments", Stream[int]), node="intake", groups=("g",))
            await stream.writer().send(1)
            await stream.writer().flush()

    anyio.run(application)
    before = snapshot(path)
    done = cli("demo", str(path), "-n", "10")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: ledger {path} holds more than the demo (stream app/intake/payments); the demo writes "
        "only into a new directory or its own ledger: choose another path"
    ]
    assert snapshot(path) == before  # nothing written


def test_cli_version_prints_the_release() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"streamledger {streams.__version__}"


def test_cli_inspect_does_not_create_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "missing"
    done = cli("inspect", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [expected_error(path, NotALedgerError)]
    assert not path.exists()


HOLDER = """
import sys, anyio
from ledger import open_ledger

async def hold() -> None:
    async with open_ledger(sys.argv[1]):
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)

anyio.run(hold)
"""


def test_cli_demo_refuses_a_ledger_another_process_owns_but_inspect_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 100)
    before = snapshot(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        message = expected_error(path, LedgerLockedError)
        done = cli("demo", str(path), "--messages", "100")
        assert done.returncode == 3, done.stderr
        assert done.stderr.splitlines() == [message]
        assert done.stdout == ""
        # inspecting takes no owner lock: it reads beside the process that owns the ledger
        inspected = cli("inspect", str(path), "--json")
        assert inspected.returncode == 0, inspected.stderr
        assert [s["appended"] for s in json.loads(inspected.stdout)["streams"]] == [100, 100]
    finally:
        holder.communicate(input="", timeout=30)
    assert holder.returncode == 0
    assert snapshot(path) == before


@pytest.mark.parametrize("args", [["demo"], ["demo", "x", "--messages", "0"], ["demo", "x", "-n", "ten"], []])
def test_cli_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("backend", "signum", "code", "said"),
    [
        ("asyncio", signal.SIGINT, 130, "interrupted"),
        ("trio", signal.SIGINT, 130, "interrupted"),
        ("asyncio", signal.SIGTERM, 143, "terminated"),
        ("trio", signal.SIGTERM, 143, "terminated"),
    ],
)
def test_ctrl_c_or_sigterm_stops_the_demo_without_a_traceback_and_it_resumes(
    tmp_path: Path, backend: str, signum: int, code: int, said: str
) -> None:
    path = tmp_path / "ledger"
    n = 100_000  # seconds of work: the interrupt, sent at the first report, always lands mid-run
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "ledger", "demo", str(path), "-n", str(n)),
            *("--progress-interval", "0.05", "--backend", backend),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert run.stderr is not None
    first = run.stderr.readline()  # reported once the streams are open, before the work
    assert first.startswith("progress: "), first
    run.send_signal(signum)
    out, err = run.communicate(timeout=60)
    assert run.returncode == code, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == f"{said}; run the same command again to resume"
    assert out == ""
    partial = streams_of(inspect(path))
    assert partial["orders"]["groups"][0]["acked_through"] < n

    done = cli("demo", str(path), "-n", str(n), "--backend", backend)
    assert done.returncode == 0, done.stderr
    assert "(resumed; " in done.stdout
    assert_demo_answer(inspect(path), n, generation=2)


def test_the_demo_interrupted_cancelled_and_retried_runs_the_retry_to_its_answer(tmp_path: Path) -> None:
    """The flow a cancelled demo's message points at: cancel, retry, run it again; then it is finished."""
    path = tmp_path / "ledger"
    n = 100_000
    run = subprocess.Popen(
        [sys.executable, "-m", "ledger", "demo", str(path), "-n", str(n), "--progress-interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert run.stderr is not None
    assert run.stderr.readline().startswith("progress: ")
    run.send_signal(signal.SIGINT)
    assert run.communicate(timeout=60)[0] == "" and run.returncode == 130
    assert cli("runs", "cancel", str(path), "demo", "--reason", "stop").returncode == 0
    cancelled = cli("demo", str(path), "-n", str(n))
    assert cancelled.returncode == 2 and "Traceback" not in cancelled.stderr
    assert len(cancelled.stderr.splitlines()) == 1 and "start a new run" not in cancelled.stderr
    assert f"runs retry {path} demo" in cancelled.stderr, cancelled.stderr
    assert f"`python -m ledger demo {path} --fresh`" in cancelled.stderr and "--run-id ID" in cancelled.stderr
    assert cli("runs", "retry", str(path), "demo", "--reason", "again").returncode == 0
    done = cli("demo", str(path), "-n", str(n))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    total = n * (n + 1) // 2
    assert f"{n} orders, billing total {total}, {n} invoices, audit count {n}" in done.stdout
    again = cli("demo", str(path), "-n", str(n))
    assert again.returncode == 0 and "already finished; nothing changed" in again.stdout, again.stderr
    shown = json.loads(cli("runs", "show", str(path), "demo", "--json").stdout)
    assert shown["status"] == "completed"
    # then the ways it names: a fresh demo in its place, and another beside it
    fresh = cli("demo", str(path), "-n", "300", "--fresh", "--json")
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout) | {"elapsed": 0} == {
        **dict(orders=300, billing_total=300 * 301 // 2, invoices=300, audit_count=300, handled=300),
        **dict(elapsed=0, already_finished=False, resumed=False),
    }
    beside = cli("demo", str(path), "-n", "200", "--run-id", "other")
    assert beside.returncode == 0 and "200 orders, billing total 20100" in beside.stdout, beside.stderr
    runs = {r["run_id"]: r for r in json.loads(cli("runs", "list", str(path), "--json").stdout)}
    assert sorted(runs) == ["demo", "other"] and {r["status"] for r in runs.values()} == {"completed"}
    report = inspect(path)
    assert {s["scope"] for s in report["streams"]} == {"demo", "other"}  # the retry's streams went
    again = cli("demo", str(path), "-n", "300")
    assert again.returncode == 0 and "already finished; nothing changed: 300 orders" in again.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_rewrites_one_line_on_a_terminal_and_writes_plain_lines_elsewhere() -> None:
    report = DemoProgress(messages=100, orders=50, billed=40, invoices=40, audited=30, elapsed=1.0, rate=40.0)
    terminal = _Terminal()
    line = _ProgressLine(terminal)
    line(report)
    line(report)
    line.end()
    text = terminal.getvalue()
    assert text.count("\r") == 2 and text.count("\n") == 1 and text.endswith("\n")
    # 30 of 100 audited: 7 of 24 cells; 70 left at 40 a second: ETA 0:02
    bar = "[#######-----------------]  30%"
    assert f"{bar}  orders 50/100  billed 40  invoices 40  audited 30  40 msgs/s  ETA 0:02" in text

    plain = io.StringIO()
    line = _ProgressLine(plain)
    line(report)
    line(report)
    line.end()
    assert "\r" not in plain.getvalue()
    assert (
        plain.getvalue().splitlines()
        == ["progress: orders 50/100  billed 40  invoices 40  audited 30  40 msgs/s"] * 2
    )


def test_the_demo_on_a_real_terminal_draws_a_bar_with_rate_and_eta_then_its_summary(tmp_path: Path) -> None:
    controller, terminal = os.openpty()
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ledger",
            "demo",
            str(tmp_path / "ledger"),
            "-n",
            "20000",
            "--progress-interval",
            "0.02",
        ],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        cwd=ROOT,
    )
    os.close(terminal)
    shown = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 60)
        assert ready, "the demo printed nothing for a minute"
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert run.wait(timeout=60) == 0
    text = shown.decode()
    assert re.search(
        r"\r\[[#-]{24}\] +\d+%  orders [\d,]+/20,000 .* msgs/s  ETA (\d+:\d\d|--:--)\x1b\[K", text
    )
    assert "Traceback" not in text
    assert text.rstrip().splitlines()[-1].startswith("demo finished: 20000 orders")


def _rewrite(path: Path, db: str, change: Callable[[bytes, bytes], bytes | None]) -> None:
    """Replace values of one database straight through LMDB, as damage or another build would."""
    env = lmdb.open(str(path), max_dbs=16)
    try:
        handle = env.open_db(db.encode())
        with env.begin(write=True, db=handle) as txn:
            for key, value in list(txn.cursor()):
                new = change(bytes(key), bytes(value))
                if new is not None:
                    txn.put(key, new)
    finally:
        env.close()


@pytest.mark.parametrize("command", ["demo", "inspect"])
def test_cli_refuses_a_ledger_of_another_schema_version(tmp_path: Path, command: str) -> None:
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 20)
    meta = LedgerMeta("streamledger", 99, "msgpack", 1)
    _rewrite(path, "meta", lambda key, value: seal("meta", key, msgspec.msgpack.encode(meta)))
    before = (path / "data.mdb").read_bytes()
    done = cli(command, str(path))
    assert done.returncode == 5
    assert done.stderr.splitlines() == [expected_error(path, SchemaVersionError)]
    assert (path / "data.mdb").read_bytes() == before


@pytest.mark.parametrize("command", ["demo", "inspect"])
def test_cli_refuses_a_ledger_with_a_corrupted_record(tmp_path: Path, command: str) -> None:
    path = tmp_path / "ledger"
    anyio.run(run_demo, path, 20)
    _rewrite(path, "groups", lambda key, value: value[:-1] + bytes([value[-1] ^ 0xFF]))
    before = (path / "data.mdb").read_bytes()
    done = cli(command, str(path))
    assert done.returncode == 4
    [line] = done.stderr.splitlines()
    assert line.startswith("error: record ") and "database 'groups'" in line, line
    with pytest.raises(CorruptRecordError, match="database 'groups'"):
        inspect(path)
    assert (path / "data.mdb").read_bytes() == before
