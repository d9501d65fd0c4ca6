from __future__ import annotations

import pytest

from fuzz.__main__ import main


def test_fuzz_runs_the_suite_machines_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--minutes", "0.001", "--examples", "2", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "round 1: lmdb_asyncio, " in out
    assert "no counterexample" in out


def test_the_long_bit_flip_run_reports_its_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    from fuzz.bitflips import main as bitflips

    assert bitflips(["--flips", "40", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("bitflips: 40 flips: ")


def test_the_key_flip_sweep_reports_its_outcomes_per_ledger(capsys: pytest.CaptureFixture[str]) -> None:
    from fuzz.keyflips import main as keyflips

    assert keyflips(["--sample", "2"]) == 0
    out = capsys.readouterr().out
    assert "keyflips: killed demo: " in out and "keyflips: graph run: " in out


def test_the_kill_loop_reports_its_kills(capsys: pytest.CaptureFixture[str]) -> None:
    from fuzz.kill import main as kill

    assert kill(["--minutes", "0.001", "--kills", "3", "--messages", "3000"]) == 0
    assert "every answer exact" in capsys.readouterr().out


def test_fuzz_runs_only_the_machines_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--minutes", "0.001", "--examples", "2", "--steps", "5", "--only", "nodes"]) == 0
    assert "round 1: nodes_lmdb_asyncio, " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--only", "no-such-machine"])
