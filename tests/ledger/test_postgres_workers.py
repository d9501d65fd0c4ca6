"""Workers on one PostgreSQL ledger: each run claimed once, leases that fence, workers killed and paused."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from ledger.postgres import Lease, LeaseLostError, open_postgres, work
from ledger.postgres._leases import FencedConnection, claim_due
from ledger.postgres._streams import PgStreamHooks
from streams import Graph, NodeContext, StreamRef
from streams.store import StreamOpen

from . import pg_fault_child
from .pool_graphs import ANSWER, GRAPHS, HOLD_WHILE, N, answer, summing

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
#: The graphs the workers of these tests can run, as claims name them.
KNOWN = [(graph.name, graph.version) for graph in GRAPHS.values()]


async def submit(url: str, runs: dict[str, int]) -> None:
    async with open_postgres(url) as ledger:
        for run_id, n in runs.items():
            await ledger.submit(summing(), {N: n}, run_id=run_id)


async def answers(url: str) -> dict[str, tuple[str, int | None]]:
    """Each run's status and, once completed, its answer (a completed run resumed runs nothing)."""
    found: dict[str, tuple[str, int | None]] = {}
    async with open_postgres(url) as ledger:
        for record in await ledger.runs():
            value = None
            if record.status == "completed":
                outcome = await ledger.resume(record.run_id, summing())
                assert outcome.already_finished
                value = outcome.result[ANSWER]
            found[record.run_id] = (record.status, value)
    return found


async def test_workers_share_the_due_runs_and_each_run_is_claimed_once(postgres_url: str) -> None:
    runs = {f"r{i}": i for i in range(1, 7)}
    await submit(postgres_url, runs)
    reports: list[tuple[str, str, str]] = []

    async def worker(owner: str) -> None:
        def report(run_id: str, outcome: str) -> None:
            reports.append((owner, run_id, outcome))

        await work(postgres_url, GRAPHS, owner=owner, poll_seconds=0.05, until_idle=True, report=report)

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker, "w1")
        tg.start_soon(worker, "w2")
    claimed = sorted(run_id for _, run_id, outcome in reports if outcome == "claimed")
    assert claimed == sorted(runs)  # each run claimed once, by one worker
    assert {owner for owner, _, _ in reports} == {"w1", "w2"}  # both worked
    assert await answers(postgres_url) == {run_id: ("completed", answer(n)) for run_id, n in runs.items()}


async def test_a_worker_whose_lease_was_taken_over_confirms_nothing(postgres_url: str) -> None:
    await submit(postgres_url, {"z": 3})
    async with open_postgres(postgres_url) as ledger:
        connection = ledger.backend.connection
        zombie = await connection.call(lambda view: claim_due(view.connection, "zombie", 30.0, KNOWN))
        assert zombie == Lease("z", "zombie", 1)
        # the zombie stops renewing; its lease runs out and another worker claims the run
        await connection.call(
            lambda view: view.connection.execute(
                "UPDATE streamledger_leases SET expires_at = now() - interval '1s'"
            )
        )
        taker = await connection.call(lambda view: claim_due(view.connection, "taker", 30.0, KNOWN))
        assert taker == Lease("z", "taker", 2)
        late = PgStreamHooks(FencedConnection(connection, zombie))
        with pytest.raises(LeaseLostError, match="'taker' \\(claim 2\\) holds it now"):
            await late.open(StreamOpen(StreamRef("z", "numbers", "numbers"), "int", 16, ("add",)))
        on_time = PgStreamHooks(FencedConnection(connection, taker))
        opened = await on_time.open(StreamOpen(StreamRef("z", "numbers", "numbers"), "int", 16, ("add",)))
        assert opened.created  # the zombie's refused open left nothing


def _worker(url: str, owner: str, *, hold: Path | None = None) -> subprocess.Popen[str]:
    env = None if hold is None else {**os.environ, HOLD_WHILE: str(hold)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ledger",
            "worker",
            url,
            "--graphs",
            "tests.ledger.pool_graphs:GRAPHS",
            "--owner",
            owner,
            "--lease",
            "1",
            "--poll",
            "0.05",
            "--until-idle",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _claims(process: subprocess.Popen[str]) -> str:
    """Read ``process``'s lines until it claims a run; that run's id."""
    assert process.stdout is not None
    while line := process.stdout.readline():
        if line.endswith(": claimed\n"):
            return line.removeprefix("run ").removesuffix(": claimed\n")
    raise AssertionError(
        f"the worker exited without claiming a run: {process.stderr.read() if process.stderr else ''}"
    )


def test_workers_killed_and_paused_past_their_lease_leave_every_run_with_its_answer(
    postgres_url: str, tmp_path: Path
) -> None:
    runs = {f"run-{i:02}": 20 + i for i in range(12)}
    anyio.run(submit, postgres_url, runs)
    killed, steady = _worker(postgres_url, "killed"), _worker(postgres_url, "steady")
    hold = tmp_path / "hold"
    hold.touch()  # the paused worker's runs wait at their last node while it exists
    paused = _worker(postgres_url, "paused", hold=hold)
    try:
        _claims(killed)
        killed.send_signal(signal.SIGKILL)  # dies inside a run: its lease runs out, another resumes it
        killed.wait()
        held = _claims(paused)
        paused.send_signal(signal.SIGSTOP)  # a zombie: alive, but silent past its lease
        assert steady.stdout is not None
        while (line := steady.stdout.readline()) and line != f"run {held}: claimed\n":
            pass
        assert line, "the steady worker never took the paused worker's run over"
        paused.send_signal(signal.SIGCONT)
        hold.unlink()  # its lease is lost: what it claims next runs to its end
        out_paused, err_paused = paused.communicate(timeout=120)
        _, err_steady = steady.communicate(timeout=120)
    finally:
        for process in (killed, paused, steady):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.communicate()  # waits, and closes its pipes
    assert paused.returncode == 0 and steady.returncode == 0, (err_paused, err_steady)
    assert f"run {held}: lost" in out_paused  # its late writes were refused: the run is the steady one's
    assert anyio.run(answers, postgres_url) == {
        run_id: ("completed", answer(n)) for run_id, n in runs.items()
    }
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM streamledger_leases").fetchone() == (0,)


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """``process``'s standard output, line by line, as it comes (an empty string once it ended)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _next_line(lines: queue.Queue[str], wanted: str, deadline: float) -> None:
    """Wait for the line ``wanted`` until ``deadline`` (a monotonic time); fail if it did not come."""
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line == wanted:
            return
        assert line, f"the worker ended without printing {wanted!r}"
    raise AssertionError(f"{wanted!r} did not come in time")


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): its state in /proc is T."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("point", ["transaction", "run-commit"])
def test_a_worker_stopped_inside_a_transaction_is_taken_over_within_its_lease_and_the_idle_timeout(
    postgres_url: str, tmp_path: Path, point: str
) -> None:
    """The frozen worker holds its lease row locked inside a transaction: without the session timeouts
    the second worker's claim waits on that lock for as long as the first is stopped.

    Stopped right after its lease check (``transaction``), the server's idle timeout ends its session;
    stopped with every statement sent and its COMMIT not (``run-commit``), after the pipelines that
    leave that timeout disarmed, the claim ends the session itself."""
    from ledger.postgres._store import IDLE_IN_TRANSACTION_SECONDS

    lease = 1.0
    anyio.run(submit, postgres_url, {"frozen": 30})
    options = ["--lease", str(lease), "--poll", "0.05", "--until-idle"]
    frozen = subprocess.Popen(
        pg_fault_child.command(tmp_path, point, "worker", postgres_url, "--owner", "frozen", *options),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    steady: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "paused").exists() and _stopped(frozen.pid)):
            assert frozen.poll() is None and time.monotonic() < deadline, "the worker never stopped"
            time.sleep(0.01)
        stopped_at = time.monotonic()
        steady = _worker(postgres_url, "steady")
        _next_line(
            _lines(steady), "run frozen: claimed\n", stopped_at + lease + IDLE_IN_TRANSACTION_SECONDS + 10
        )
        frozen.send_signal(signal.SIGCONT)
        out_frozen, err_frozen = frozen.communicate(timeout=60)
        steady.wait(timeout=60)
    finally:
        for process in (frozen, steady):
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            if process is not None:
                process.communicate()
    assert frozen.returncode == 0 and steady.returncode == 0, err_frozen
    assert "run frozen: lost" in out_frozen  # resumed, its writes were refused: the run is the steady one's
    assert anyio.run(answers, postgres_url) == {"frozen": ("completed", answer(30))}
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM streamledger_leases").fetchone() == (0,)


async def test_a_run_this_process_runs_itself_is_never_claimed_by_a_worker(postgres_url: str) -> None:
    reports: list[tuple[str, str]] = []

    async def worker() -> None:
        def report(run_id: str, outcome: str) -> None:
            reports.append((run_id, outcome))

        await work(postgres_url, GRAPHS, owner="w", poll_seconds=0.02, until_idle=True, report=report)

    async with open_postgres(postgres_url) as ledger, anyio.create_task_group() as tg:
        # the worker starts once the run is recorded and running: it polls, and never claims it
        outcome = await ledger.run(summing(), {N: 5}, run_id="mine", on_start=lambda _: tg.start_soon(worker))
    assert outcome.result[ANSWER] == answer(5)
    assert reports == []  # the run's lease kept the worker off it


async def test_a_worker_claims_only_runs_of_the_graphs_it_knows(postgres_url: str) -> None:
    other = Graph("other", inputs=[N])

    @other.node(requires=[N], provides=[ANSWER])
    async def never(ctx: NodeContext) -> None:
        ctx.set(ANSWER, 0)

    async with open_postgres(postgres_url) as ledger:
        await ledger.submit(other, {N: 1}, run_id="a-unknown")  # first in claim order
        await ledger.submit(summing(), {N: 2}, run_id="b-known")
        await ledger.submit(summing("2"), {N: 2}, run_id="c-other-version")
    claimed: list[str] = []
    await work(
        postgres_url,
        GRAPHS,
        poll_seconds=0.02,
        until_idle=True,
        report=lambda run_id, outcome: claimed.append(run_id) if outcome == "claimed" else None,
    )
    assert claimed == ["b-known"]  # the others wait for workers that know their graph
    statuses = {r.run_id: r.status for r in await _runs(postgres_url)}
    assert statuses == {"a-unknown": "running", "b-known": "completed", "c-other-version": "running"}


async def _runs(url: str) -> list[Any]:
    async with open_postgres(url) as ledger:
        return await ledger.runs()
