"""A stop that lands where Python drops exceptions (a ``__del__``, a weak reference's callback) is
sent again, so a command told to stop does stop (``ledger/_termination.py``)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from ledger._termination import Terminated, stops_as_interrupts


class _Dropping:
    """Sends ``signum`` to this process from its ``__del__``, where the handler's exception is dropped."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.finished: list[bool] = []

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        for _ in range(10_000):  # the handler runs at one of these steps and raises inside __del__
            pass
        self.finished.append(True)


@pytest.mark.parametrize(
    ("signum", "raised"),
    [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)],
    ids=["term", "int"],
)
def test_a_stop_dropped_in_a_finaliser_is_delivered_again_outside_it(
    signum: int, raised: type[BaseException]
) -> None:
    dropping = _Dropping(signum)
    finished = dropping.finished
    with stops_as_interrupts(), pytest.raises(raised):
        del dropping  # the first delivery is dropped: Python reports it as ignored and goes on
        assert not finished  # __del__ was stopped by it
        threading.Event().wait(30)  # the second lands here, in ordinary code
    assert signal.getsignal(signal.SIGTERM) is not None


def test_other_ignored_exceptions_still_reach_the_previous_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BaseException | None] = []
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: seen.append(unraisable.exc_value))

    class Failing:
        def __del__(self) -> None:
            raise ValueError("in a finaliser")

    with stops_as_interrupts():
        Failing()
    assert [type(e) for e in seen] == [ValueError]
