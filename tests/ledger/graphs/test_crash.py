from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHILD = [sys.executable, "-m", "tests.ledger.graphs.crash_child"]


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's next line of output, waiting on its pipe (not on the clock) up to ``timeout``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            proc.kill()
            raise AssertionError("the child never reported step two")
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("driver", ["run", "iter"])
def test_a_run_killed_after_step_one_resumes_in_a_new_process_without_repeating_it(
    tmp_path: Path, driver: str
) -> None:
    path = str(tmp_path / "ledger")
    proc = subprocess.Popen([*CHILD, path, "crash", driver], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert _read_line(proc, timeout=60) == "two started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    resumed = subprocess.run(
        [*CHILD, path, "resume", driver], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert report["ran"] == ["two", "three"]  # step one did not run again
    assert report["steps"] == ["one", "two", "three"]  # the state step one left was restored
    assert report["output"] == 9
    assert report["resumed_from"] == 1
    if driver == "iter":  # the saved task first, then what running it and the rest produced
        assert report["seen"] == [["two"], ["three"], ["__end__"], "end"]
