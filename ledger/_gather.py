"""When a group committer hands over its next batch: the policy both ledgers' committers follow.

A group commit gathers every write submitted while a transaction is in flight
into the next one. The writes that matter most for latency are the ones a
landing itself sets off: a confirmation pipeline whose batch just landed cuts
its next one (:data:`streams._pipeline.SETTLE_STEPS` steps later, so that the
readers of what it published stage their work first), and a handler woken by
the messages just published commits them. Those writes come a few steps of
the event loop after the landing. A committer that handed the next batch over
at once would send them a transaction later, to wait for all of it first:
in the demo's pipeline at 50,000 orders a second an order then crossed 6.5
transactions from its send to audit's delivery, against the 2.5 it needs
(the one in flight when it was sent, its append's, billing's commit).

So after a landing a committer lets :data:`GATHER_STEPS` steps of the loop
pass before it hands over the next batch. A write submitted while no batch is
in flight and none just landed leaves at the end of its own step, with the
others of that step. The LMDB committer (:mod:`ledger.lmdb._commit`) counts
the steps with loop callbacks; on PostgreSQL (``PgConnection.call``) the
caller that leads the next batch waits them out with checkpoints, one for
its own step (before, it took its batch at once and the calls of the same
step waited for a whole transaction). In either,
every write still leaves in the first transaction that begins after it, and
nothing is confirmed or published before its transaction commits.
"""

from __future__ import annotations

from typing import Final

__all__ = ["GATHER_STEPS"]

#: Steps of the event loop a committer lets pass after a landing before it hands over the next
#: batch: the committers the landing woke resume in the first and cut two steps later
#: (``streams._pipeline.SETTLE_STEPS``); a step with nothing to run costs microseconds.
GATHER_STEPS: Final = 3
