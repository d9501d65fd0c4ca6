"""A program run on a ledger, killed with SIGKILL at random moments until kills land, then finished."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from fuzz.kill import shorter
from ledger.lmdb._check import check_ledger
from ledger.lmdb._env import LedgerEnv
from ledger.testing import LedgerHistory, kill_until_done

ROOT = Path(__file__).resolve().parents[2]


def assert_sound(path: Path) -> None:
    env = LedgerEnv.open_readonly(path, verify=False)
    try:
        report = check_ledger(env)
    finally:
        env.close()
    assert report.sound, report.problems


def killed_until_landed(
    tmp_path: Path,
    command_for: Callable[[Path], list[str]],
    *,
    expected: str,
    env: Mapping[str, str],
    max_delay: float,
    check: Callable[[Path, int], None] | None = None,
    kills: int = 5,
    after_kill: Callable[[Path], None] | None = None,
) -> int:
    """Kill ``command_for(ledger)`` at random moments until ``kills`` kills landed, over fresh ledgers.

    After each round the ledger is sound after every kill, nothing moved
    back, and one more call prints ``expected``; ``check(ledger, landed)``
    looks further, and ``after_kill(ledger)`` after each kill. A round whose
    run finished before its kills starts over on a new ledger, with half the delay
    (:func:`fuzz.kill.shorter`: the kills land on a machine of any speed). Returns the kills
    that landed.
    """
    landed = 0
    for attempt in range(10):
        path = tmp_path / f"ledger-{attempt}"
        history = LedgerHistory(path)
        command = command_for(path)

        def observe(path: Path = path, history: LedgerHistory = history) -> None:
            history.observe()
            if after_kill is not None:
                after_kill(path)

        landed_here = kill_until_done(
            command,
            kills=kills,
            max_delay=max_delay,
            seed=20261130 + attempt,
            after_kill=observe,
            cwd=ROOT,
            env=dict(env),
        )
        history.observe()
        final = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
        assert final.stdout.strip() == expected
        if check is not None:
            check(path, landed_here)
        assert_sound(path)
        landed += landed_here
        if landed >= kills:
            break
        max_delay = shorter(max_delay, landed=landed_here, asked=kills)
    assert landed >= kills
    return landed
