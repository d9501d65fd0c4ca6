"""Manifests: what a database holds, kept beside it, so that a missing record is never read as none.

A lookup that finds no record cannot tell "never written" from "lost": a
damaged key moves a record elsewhere, a damaged page hides it. For the
databases whose records nothing else names (a message's budget in
``attempts``; a run's boundaries, scopes and node records in ``nodes``; a
durable graph run's record and checkpoint in ``graph_runs``; a group's keyed
state in ``keyed`` and ``keyed_log``) the ledger keeps
a manifest in the ``meta`` database: how many keys the database holds and an
order-independent digest of them, the XOR of each key's 128-bit BLAKE2b.
Every write that adds or removes a key updates the manifest in the same
transaction, so the two commit together or not at all. Overwriting a record
changes no key and leaves the manifest alone: the hot paths (a frontier, a
descriptor, a budget counted up) pay nothing, a new key pays one hash and one
small put. Opening the ledger reads each such database whole and compares
(:mod:`ledger.lmdb._verify`): a key missing, added or moved makes the two disagree.

The other databases need none: every stream id up to the counter has a
descriptor and an index entry, every group a descriptor lists has its
frontier (and no other frontier exists), and the messages a stream holds run
contiguously up to what its descriptor says it appended.

Ledgers of schema 3 have no manifests: the first open for writing computes
them from a verified ledger and writes them with the current schema in one
commit (:meth:`ledger.LedgerEnv._verify`); until then, reading them verifies
everything but the manifests. Ledgers of schema 4 have no ``keyed``
database and so no manifest of it, those of schema 5 no ``keyed_log``: the
same open adds each, with its manifest, empty.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from .._errors import MissingRecordError
from ._seal import decode_record, seal

__all__ = [
    "MANIFESTED",
    "KeyTally",
    "Manifest",
    "key_digest",
    "manifest_key",
    "put_manifest",
    "read_manifest",
    "write_tally",
]

#: The databases that keep a manifest in ``meta``.
MANIFESTED: Final = ("attempts", "nodes", "graph_runs", "keyed", "keyed_log")
_PREFIX: Final = b"manifest/"


class Manifest(msgspec.Struct, frozen=True, array_like=True):
    """How many keys a database holds, and the XOR of their 128-bit BLAKE2b digests."""

    keys: int = 0
    digest: bytes = bytes(16)


_decoder: Final = msgspec.msgpack.Decoder(Manifest)
_encoder: Final = msgspec.msgpack.Encoder()


def manifest_key(db: str) -> bytes:
    """The ``meta`` key of database ``db``'s manifest."""
    return _PREFIX + db.encode()


def key_digest(key: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "big")


class KeyTally:
    """The keys one write adds to and removes from a database, as a change to its manifest."""

    __slots__ = ("digest", "keys")

    def __init__(self) -> None:
        self.keys = 0
        self.digest = 0

    def added(self, key: bytes) -> None:
        self.keys += 1
        self.digest ^= key_digest(key)

    def removed(self, key: bytes) -> None:
        self.keys -= 1
        self.digest ^= key_digest(key)

    def __bool__(self) -> bool:
        return bool(self.keys or self.digest)

    def as_manifest(self) -> Manifest:
        return Manifest(self.keys, self.digest.to_bytes(16, "big"))


def read_manifest(txn: Any, meta_db: Any, db: str) -> Manifest | None:
    """Database ``db``'s manifest, or None if the ledger keeps none (schema 3; ``keyed`` before 5,
    ``keyed_log`` before 6)."""
    key = manifest_key(db)
    raw = txn.get(key, db=meta_db)
    return None if raw is None else decode_record(bytes(raw), _decoder, db="meta", key=key)


def put_manifest(txn: Any, meta_db: Any, db: str, manifest: Manifest) -> None:
    key = manifest_key(db)
    txn.put(key, seal("meta", key, _encoder.encode(manifest)), db=meta_db)


def write_tally(txn: Any, meta_db: Any, db: str, tally: KeyTally) -> None:
    """Apply ``tally`` to ``db``'s manifest inside the write transaction that changed the keys."""
    if not tally:
        return
    current = read_manifest(txn, meta_db, db)
    if current is None:
        raise MissingRecordError(
            f"the manifest of database {db!r} is missing from the ledger's 'meta' database; the ledger "
            "is damaged: verify it with python -m ledger check and restore it from a copy"
        )
    digest = int.from_bytes(current.digest, "big") ^ tally.digest
    put_manifest(txn, meta_db, db, Manifest(current.keys + tally.keys, digest.to_bytes(16, "big")))
