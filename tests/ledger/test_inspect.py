from __future__ import annotations

import base64
import json
import os
import re
import socket
from pathlib import Path

import msgspec
import pytest

from ledger import CorruptRecordError, inspect_ledger, open_ledger
from streams import StreamRef
from streams.store import AppendBatch, MessageCommit, MessageFail, MessageRef, StreamFinish, StreamOpen

ORDERS = StreamRef("run", "source", "orders")
INVOICES = StreamRef("run", "billing", "invoices")


class Totals(msgspec.Struct):
    total: int
    count: int
    digest: bytes


async def test_an_empty_ledger_has_no_streams_and_no_graph_runs(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "running": True}
        report = inspect_ledger(ledger.backend.env)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", report["owner"].pop("since"))
        assert report == {
            "path": str(tmp_path / "l"),
            "owner": owner,
            "streams": [],
            "runs": [],
            "graph_runs": [],
        }


async def test_inspect_reports_streams_groups_and_plain_json_state(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        hooks = ledger.streams
        orders = await hooks.open(StreamOpen(ORDERS, "Order", 64, ("billing", "audit")))
        invoices = await hooks.open(StreamOpen(INVOICES, "Invoice", 16, ("audit",)))
        await hooks.append(AppendBatch(ORDERS, 1, 1, tuple(b"%d" % i for i in range(1, 11))))
        await hooks.append(AppendBatch(INVOICES, 1, 1, (b"i",)))
        state = msgspec.msgpack.encode(Totals(total=6, count=3, digest=b"\x00\xff"))
        await hooks.commit(
            [
                MessageCommit(MessageRef(ORDERS, "billing", 1, 1)),
                MessageCommit(MessageRef(ORDERS, "billing", 1, 2)),
                MessageCommit(MessageRef(ORDERS, "billing", 1, 5), state=state),
            ]
        )
        await hooks.fail_message(MessageFail(MessageRef(ORDERS, "audit", 1, 3), "auditor", 1, 0))
        await hooks.commit([MessageCommit(MessageRef(INVOICES, "audit", 1, 1))])
        await hooks.finish(StreamFinish(INVOICES, invoices.generation))
        report = inspect_ledger(ledger.backend.env)
    assert orders.generation == 1
    assert json.loads(json.dumps(report)) == report
    assert report["path"] == str(tmp_path / "l")
    for stream in report["streams"]:
        for group in stream["groups"]:  # each acknowledged or failed something just now
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", group.pop("active_at"))
            oldest = group.pop("oldest_unacked_at")
            if group["pending"]:  # one append each stream: its oldest unacknowledged message's time
                assert oldest == stream["last_appended_at"]
            else:
                assert oldest is None
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stream.pop("last_appended_at"))
    assert report["streams"] == [
        {
            "key": "orders",
            "scope": "run",
            "node": "source",
            "type": "Order",
            "generation": 1,
            "appended": 10,
            "finished": False,
            "failed": False,
            "capacity": 64,
            "compacted_through": 0,
            "retain": 0,
            "partitions": 0,
            "groups": [
                {
                    "group": "audit",
                    "acked_through": 0,
                    "pending": 10,
                    "exhausted": 1,
                    "dead_lettered": 0,
                    "stopped": False,
                    "state": None,
                    "owner": None,  # a member's lease on a partition (PostgreSQL): none here
                },
                {
                    "group": "billing",
                    "acked_through": 2,
                    "pending": 7,
                    "exhausted": 0,
                    "dead_lettered": 0,
                    "stopped": False,
                    "state": {
                        "total": 6,
                        "count": 3,
                        "digest": base64.b64encode(b"\x00\xff").decode(),
                    },
                    "owner": None,
                },
            ],
        },
        {
            "key": "invoices",
            "scope": "run",
            "node": "billing",
            "type": "Invoice",
            "generation": 1,
            "appended": 1,
            "finished": True,
            "failed": False,
            "capacity": 16,
            "compacted_through": 1,  # finished and acknowledged by every group
            "retain": 0,
            "partitions": 0,
            "groups": [
                {
                    "group": "audit",
                    "acked_through": 1,
                    "pending": 0,
                    "exhausted": 0,
                    "dead_lettered": 0,
                    "stopped": False,
                    "state": None,
                    "owner": None,
                }
            ],
        },
    ]


async def test_inspect_writes_nothing(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await ledger.streams.open(StreamOpen(ORDERS, "Order", 64, ("billing",)))
        before = ledger.backend.env.info()["last_txnid"]
        inspect_ledger(ledger.backend.env)
        assert ledger.backend.env.info()["last_txnid"] == before


async def test_a_state_that_does_not_decode_is_a_corrupt_record(tmp_path: Path) -> None:
    async with open_ledger(tmp_path / "l") as ledger:
        await ledger.streams.open(StreamOpen(ORDERS, "Order", 64, ("billing",)))
        await ledger.streams.append(AppendBatch(ORDERS, 1, 1, (b"x",)))
        await ledger.streams.commit([MessageCommit(MessageRef(ORDERS, "billing", 1, 1), state=b"\xc1")])
        with pytest.raises(CorruptRecordError, match="committed state"):
            inspect_ledger(ledger.backend.env)
