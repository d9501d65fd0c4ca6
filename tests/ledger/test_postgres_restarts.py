"""The server stopped (``pg_ctl stop -m immediate``) under workers and programs, then restarted or left down.

These tests own a private server of their own (the session's is shared by
every other test). Restarted, the workers and programs reconnect and every
run ends with its answer: nothing confirmed was lost, nothing applied twice.
Left down, each gives up after its reconnect time with one typed line on
stderr and exit code 1, never a traceback. ``python -m fuzz --only restarts``
runs the randomized variant longer.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from ledger import LedgerUnreachableError
from ledger.postgres import open_postgres
from ledger.postgres._inspect import check_postgres
from ledger.postgres.server import PrivateServer, ServerUnavailableError, private_server
from streams import StreamRef

from . import pg_fault_child
from .pool_graphs import answer
from .test_postgres_workers import answers, submit

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
_REF = StreamRef("s", "src", "numbers")
_schemas = itertools.count()


@pytest.fixture(scope="module")
def own_server() -> Iterator[PrivateServer]:
    try:
        with private_server() as server:
            yield server
    except ServerUnavailableError as exc:
        pytest.fail(f"the PostgreSQL ledger's tests need a server: {exc}", pytrace=False)


def test_a_private_server_flushes_its_wal_by_default_and_the_suites_only_writes_it(
    own_server: PrivateServer, postgres_server: PrivateServer
) -> None:
    """The default server is durable as a deployment is; the suite's survives every process crash
    (its commits wait for the WAL's write) but skips the flush, which only a lost machine needs."""

    def settings(server: PrivateServer) -> tuple[str, str]:
        with psycopg.connect(server.url, autocommit=True) as conn:
            [(fsync,)] = conn.execute("SHOW fsync").fetchall()
            [(synchronous,)] = conn.execute("SHOW synchronous_commit").fetchall()
        return str(fsync), str(synchronous)

    new_url(own_server)  # up, if a test before left it down
    assert (own_server.fsync, settings(own_server)) == (True, ("on", "on"))
    assert (postgres_server.fsync, settings(postgres_server)) == (False, ("off", "on"))


def new_url(server: PrivateServer) -> str:
    """A URL of a new, empty ledger on ``server``: a schema of its own."""
    if not (server.data / "postmaster.pid").exists():  # a test before left it down
        server.resume()
    schema = f"r{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{server.url}&options=-csearch_path%3D{schema}"


@pytest.fixture
def url(own_server: PrivateServer) -> str:
    return new_url(own_server)


def wait_for_the_pause(directory: Path, child: subprocess.Popen[str]) -> None:
    """Wait until ``child`` paused at its point (it wrote ``paused``); fail if it ended before."""
    wait_until(lambda: (directory / "paused").exists() or child.poll() is not None, "the pause")
    assert (directory / "paused").exists(), f"the child ended without pausing: {child.communicate()}"


def wait_until(condition: Callable[[], bool], what: str, *, seconds: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail once ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {seconds} s"
        time.sleep(0.01)


#: The workers' options: short leases and polls, so a run left by one is taken over soon.
WORKER: list[str] = ["--graphs", "tests.ledger.pool_graphs:GRAPHS", "--lease", "2", "--poll", "0.05"]


def worker(url: str, *, reconnect: float = 30.0) -> subprocess.Popen[str]:
    """A worker that runs until nothing is running, waiting ``reconnect`` seconds for a server away."""
    return spawn(
        [
            sys.executable,
            "-m",
            "ledger",
            "worker",
            url,
            *WORKER,
            "--until-idle",
            "--reconnect",
            str(reconnect),
        ]
    )


def spawn(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(*processes: subprocess.Popen[str], timeout: float = 90) -> list[tuple[int, str, str]]:
    """Wait for each process; (exit code, stdout, stderr) of each. One that hangs is killed and fails."""
    ended = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout)
            ended.append((process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return ended


def restart(server: PrivateServer, *, down_for: float = 0.0) -> None:
    server.stop()
    if down_for:
        time.sleep(down_for)  # the server is away this long: the time the workers must wait out
    server.resume()


def exact(url: str, runs: dict[str, int]) -> None:
    """Every run ended with its answer (a message applied twice or lost changes it), no lease is left,
    and the ledger checks sound."""
    assert anyio.run(answers, url) == {run_id: ("completed", answer(n)) for run_id, n in runs.items()}
    assert check_postgres(url).problems == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM streamledger_leases").fetchone() == (0,)


def clean(ended: list[tuple[int, str, str]]) -> None:
    for code, _, err in ended:
        assert code == 0 and "Traceback" not in err, err


def test_a_server_stopped_while_a_program_makes_its_schema_is_waited_for(
    own_server: PrivateServer, url: str, tmp_path: Path
) -> None:
    program = spawn(pg_fault_child.command(tmp_path, "schema", "program", url, "25"))
    wait_for_the_pause(tmp_path, program)
    restart(own_server)  # the tables made in the open transaction are gone with it
    (tmp_path / "go").touch()
    [(code, out, err)] = finish(program)
    assert code == 0 and "Traceback" not in err, err
    assert out == f"answer {answer(25)}\n"
    exact(url, {"program": 25})


@pytest.mark.parametrize("mode", ["worker", "program"])
def test_a_server_stopped_inside_a_call_that_wrote_is_waited_for_and_the_run_ends_exact(
    own_server: PrivateServer, url: str, tmp_path: Path, mode: str
) -> None:
    runs = {"a": 40, "b": 7} if mode == "worker" else {}
    anyio.run(submit, url, runs)
    rest = ["--lease", "2", "--poll", "0.05", "--until-idle"] if mode == "worker" else ["40"]
    child = spawn(pg_fault_child.command(tmp_path, "write", mode, url, *rest))
    wait_for_the_pause(tmp_path, child)
    restart(own_server, down_for=0.3)
    (tmp_path / "go").touch()
    clean(finish(child))
    exact(url, runs or {"program": 40})


def test_a_server_stopped_at_random_moments_of_a_run_loses_nothing(
    own_server: PrivateServer, url: str
) -> None:
    seed = random.randrange(2**32)
    restarts(own_server, url, random.Random(seed), runs=6, stops=2)


def restarts(server: PrivateServer, url: str, rng: random.Random, *, runs: int, stops: int) -> None:
    """Two workers on ``runs`` runs; the server stopped ``stops`` times at random moments, and restarted."""
    wanted = {f"run-{i:02}": rng.randrange(5, 60) for i in range(runs)}
    anyio.run(submit, url, wanted)
    workers = [worker(url), worker(url)]
    landed = 0
    try:
        for _ in range(stops):
            time.sleep(rng.uniform(0.05, 0.8))  # a random moment of the run: the point of the test
            if all(w.poll() is not None for w in workers):
                break
            restart(server, down_for=rng.uniform(0.0, 0.5))
            landed += 1
    finally:
        ended = finish(*workers)
    assert landed, "the workers were done before the server was stopped: nothing was tested"
    clean(ended)
    exact(url, wanted)


def test_a_server_left_down_ends_workers_with_one_typed_line_and_a_restart_resumes_them(
    own_server: PrivateServer, url: str, tmp_path: Path
) -> None:
    runs = {"down": 200}
    anyio.run(submit, url, runs)
    paused = spawn(
        pg_fault_child.command(tmp_path, "write", "worker", url, "--lease", "2", "--reconnect", "1")
    )
    wait_for_the_pause(tmp_path, paused)
    idle = worker(url, reconnect=1)  # waits in its claim loop
    own_server.stop()
    (tmp_path / "go").touch()
    began = time.monotonic()
    ended = finish(paused, idle, timeout=30)
    assert time.monotonic() - began < 20  # each gave up after its reconnect time, not at its lease's
    for code, _, err in ended:
        assert code == 1, err
        assert len(err.splitlines()) == 1 and err.startswith("error: "), err
        assert "cannot be reached" in err and "Traceback" not in err
        waited = re.search(r"gave up after (\d+) attempt\(s\) in (\d+\.\d) s", err)
        assert waited and int(waited[1]) > 1 and 1.0 <= float(waited[2]) < 10, err  # it tried, for its time
    own_server.resume()
    clean(finish(worker(url)))  # the run's lease runs out, and a worker resumes it
    exact(url, runs)


async def test_a_program_whose_server_is_left_down_gets_a_typed_error(
    own_server: PrivateServer, url: str
) -> None:
    async with open_postgres(url, reconnect_seconds=0.5) as ledger:
        await ledger.streams.describe(_REF)
        await anyio.to_thread.run_sync(own_server.stop)
        with pytest.raises(LedgerUnreachableError, match="gave up after"):
            await ledger.streams.describe(_REF)
        with pytest.raises(LedgerUnreachableError):  # once given up, a call tries once, and says so again
            await ledger.streams.describe(_REF)
        await anyio.to_thread.run_sync(own_server.resume)
        assert await ledger.streams.describe(_REF) is None  # and reconnects once the server is back


def test_the_long_restart_run_reports_its_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    from fuzz.restarts import main

    assert main(["--seed", "7", "--runs", "2", "--stops", "1"]) == 0
    assert "round 1 (seed 7): " in capsys.readouterr().out
