"""The store's limit for per-key totals: a plain py-lmdb loop keeping a total per customer.

What the keyed configurations of :mod:`bench._keyed` write, without the
engine: per order, the read of its customer's total and the sealed put of
the new one under the same key layout as the ledger's ``keyed`` database
(the stream's id, the group, the key), and per batch of ``batch`` orders
the group's frontier, in one write transaction (one fsync when durable).
The customers are seeded at 0 first, untimed, as the bench seeds them.
Over ten customers every put lands on one page; over a million, nearly
every put copies a page of its own (LMDB's copy-on-write B-tree), and
this loop shows what that costs the disk and the CPU before any engine.

With ``log_merge`` the loop measures the layout a log-structured store
would use instead: a transaction appends its batch's totals as one record of
a log database (one page or a few, at the log's end, however wide the keys)
and keeps them in a dict that reads consult before the table; once the dict
holds ``log_merge`` keys, that transaction puts them into the table in key
order and empties the log. It is the limit of such a layout merged into
LMDB's B-tree: what it saves on the disk, and what the merges still cost.
"""

from __future__ import annotations

import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from ledger.lmdb._env import write_mode
from ledger.lmdb._layout import keyed_prefix
from ledger.lmdb._seal import seal, unseal
from streams import GroupFrontier, KeyedState

from ._keyed import customer_order, expected_totals
from ._shape import BenchError

__all__ = ["RawKeyedRun", "run_raw_keyed"]

_u64 = struct.Struct(">Q")
_encode = msgspec.msgpack.encode
_int = msgspec.msgpack.Decoder(int)
#: How many seed puts one transaction makes.
_SEED_TXN = 100_000


@dataclass(frozen=True)
class RawKeyedRun:
    keys: int
    messages: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.seconds


def run_raw_keyed(
    n: int,
    *,
    keys: int,
    batch: int = 1024,
    sync: bool = True,
    log_merge: int | None = None,
    workdir: Path | None = None,
) -> RawKeyedRun:
    """Orders 2..``n`` over ``keys`` customers, ``batch`` a transaction, verified against the totals.

    ``log_merge`` appends each transaction's totals to a log, merged into
    the table once it holds that many keys (see the module's text).
    """
    encode_key = KeyedState(str, int).key_codec.encode
    prefix = keyed_prefix(1, "m0")
    group_key = _u64.pack(1) + b"m0"
    with tempfile.TemporaryDirectory(prefix="raw-keyed-bench-", dir=workdir) as tmp:
        env = lmdb.open(tmp, map_size=1 << 34, max_dbs=4, **write_mode(sync))
        try:
            keyed = env.open_db(b"keyed")
            groups = env.open_db(b"groups")
            zero = _encode(0)
            env.open_db(b"log")
            for first in range(0, keys, _SEED_TXN):
                with env.begin(write=True) as txn:
                    for k in range(first, min(first + _SEED_TXN, keys)):
                        key = prefix + encode_key(f"c{k}")
                        txn.put(key, seal("keyed", key, zero), db=keyed)
            with env.begin(write=True) as txn:  # order 1, as the bench's seed commits it
                order = customer_order(1, keys)
                key = prefix + encode_key(order.customer)
                txn.put(key, seal("keyed", key, _encode(order.amount)), db=keyed)
            started = time.perf_counter()
            if log_merge is None:
                _table_loop(env, keyed, groups, n, keys, batch, prefix, group_key, encode_key)
            else:
                _log_loop(env, keyed, groups, n, keys, batch, prefix, group_key, encode_key, log_merge)
            seconds = time.perf_counter() - started
            with env.begin() as txn:
                found = {
                    bytes(k[len(prefix) + 1 :]).decode(): _int.decode(
                        unseal(bytes(v), db="keyed", key=bytes(k))
                    )
                    for k, v in txn.cursor(db=keyed)
                }
        finally:
            env.close()
    if found != expected_totals(n, keys):
        raise BenchError(f"the raw keyed loop over {keys} keys kept totals that differ from its orders'")
    return RawKeyedRun(keys, n - 1, seconds)


def _table_loop(
    env: Any, keyed: Any, groups: Any, n: int, keys: int, batch: int, prefix: bytes, group_key: bytes,
    encode_key: Callable[[str], bytes],
) -> None:  # fmt: skip
    """Each order's read and put in the table itself."""
    for first in range(2, n + 1, batch):
        last = min(first + batch, n + 1) - 1
        with env.begin(write=True) as txn:
            for i in range(first, last + 1):
                order = customer_order(i, keys)
                key = prefix + encode_key(order.customer)
                raw = txn.get(key, db=keyed)
                total = 0 if raw is None else _int.decode(unseal(bytes(raw), db="keyed", key=key))
                txn.put(key, seal("keyed", key, _encode(total + order.amount)), db=keyed)
            frontier = _encode(GroupFrontier("m0", acked_through=last))
            txn.put(group_key, seal("groups", group_key, frontier), db=groups)


def _log_loop(
    env: Any, keyed: Any, groups: Any, n: int, keys: int, batch: int, prefix: bytes, group_key: bytes,
    encode_key: Callable[[str], bytes], log_merge: int,
) -> None:  # fmt: skip
    """Each transaction's totals appended to the log, merged into the table every ``log_merge`` keys."""
    log = env.open_db(b"log")
    logged: dict[bytes, int] = {}  # what the log holds, newest total of each key
    seq = 0
    for first in range(2, n + 1, batch):
        last = min(first + batch, n + 1) - 1
        with env.begin(write=True) as txn:
            totals: dict[bytes, int] = {}
            for i in range(first, last + 1):
                order = customer_order(i, keys)
                key = prefix + encode_key(order.customer)
                total = totals.get(key)
                if total is None:
                    total = logged.get(key)
                if total is None:
                    raw = txn.get(key, db=keyed)
                    total = 0 if raw is None else _int.decode(unseal(bytes(raw), db="keyed", key=key))
                totals[key] = total + order.amount
            record_key = prefix + _u64.pack(seq)
            txn.put(record_key, seal("keyed", record_key, _encode(list(totals.items()))), db=log, append=True)
            seq += 1
            logged.update(totals)
            if len(logged) >= log_merge:
                for key, total in sorted(logged.items()):
                    txn.put(key, seal("keyed", key, _encode(total)), db=keyed)
                txn.drop(log, delete=False)
                logged.clear()
            frontier = _encode(GroupFrontier("m0", acked_through=last))
            txn.put(group_key, seal("groups", group_key, frontier), db=groups)
    with env.begin(write=True) as txn:  # the log's last keys, untimed, as the next merge would put them
        for key, total in sorted(logged.items()):
            txn.put(key, seal("keyed", key, _encode(total)), db=keyed)
