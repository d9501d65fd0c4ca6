"""Every database of a ledger and the layout of its keys, in one place.

Each value is framed by :func:`ledger.lmdb._seal.seal` (a CRC-32 over key and
value). ``id`` is a stream's 8-byte big-endian id, ``seq`` an 8-byte
big-endian sequence number; big-endian keys keep a stream's messages
contiguous and in order::

    db          key                                       value
    meta        b"schema"                                 LedgerMeta
    meta        b"manifest/" + db name                    Manifest of attempts, nodes, graph_runs
                                                          (ledger.lmdb._manifest; schema 4)
                                                          and keyed (schema 5), keyed_log (6)
    streams     b"c"                                      last stream id (msgpack int)
    streams     b"r" + msgpack([scope, node, key])        stream id (msgpack int)
    streams     b"d" + id                                 StreamDescriptor
    streams     b"x" + id                                 a deleted stream's tombstone: its
                                                          name (msgpack str); ids are never reused
    messages    id + first seq                            msgpack list of payloads: a run of up
                                                          to CHUNK messages from first seq
    groups      id + group (utf-8)                        GroupFrontier
    attempts    id + len(group) (4 bytes) + group + seq   AttemptRecord
                   + len(node) (4 bytes) + node + parent attempt
                or, when that is longer than MAX_KEY:
                id + 0xff + digest(group) + digest(rest)
    graph_runs  b"run/" + run id (utf-8)                  GraphRunRecord
    graph_runs  b"checkpoint/" + run id (utf-8)           GraphCheckpoint
    nodes       b"a" / b"s" / b"n" / b"r" + ...           boundaries, scopes, node records, runs
                                                          (ledger.lmdb._nodes)
    keyed       id + len(group) (4 bytes) + group + key   the key's value bytes, as committed
                or, when the group is longer than         (schema 5)
                MAX_KEYED_GROUP bytes:
                id + 0xff + digest(group) + key
    keyed_log   the group's keyed prefix + seq            msgpack list of [key, value or nil]:
                   + 8 random bytes                       one commit's writes of the group's keys,
                                                          in key order (schema 6)

A key part that would make a ``streams``, ``groups`` or ``attempts`` key
longer than :data:`MAX_KEY` bytes is replaced by ``0xff`` and its 32-byte
BLAKE2b digest; the full names stay in the values. A long ``attempts`` key
digests its group apart from the rest, so a group's budgets are found by
prefix (:func:`budget_prefixes`). A budget keyed by one digest of the two
together (:func:`legacy_attempt_key`) is read too. A run id is 1 to
:data:`MAX_RUN_ID_BYTES` bytes of UTF-8, kept whole.

A ``keyed`` key is a group's prefix (:func:`keyed_prefix`) and the key
bytes, so a group's keyed state is one contiguous range, in the byte order
of its keys. Whether the group is kept whole or digested depends on the
group alone, never on the key, so each group has one prefix: the longest
prefix and a key of ``MAX_KEY_BYTES`` stay under LMDB's 511 bytes. The value
is the committed value bytes only; no name is repeated in it, since
``check`` attributes a record by recomputing the prefixes of the groups its
stream's descriptor lists (:func:`keyed_prefix_of` reads one back from a
key). Ledgers of schema 4 and before have no ``keyed`` database: until the
first open for writing adds it, they hold no keyed state.

A group's keyed state is the ``keyed`` range read through its ``keyed_log``
range: a key's newest log entry, else its ``keyed`` record
(:mod:`ledger.lmdb._keyed_log`, which says why, and when a log is merged into
the table). The random bytes of a log key tell apart two records of one
sequence number, one of them rolled back. Ledgers of schema 5 have no
``keyed_log`` database: the first open for writing adds it, empty.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

import msgspec

from streams import StreamRef
from streams.store import MAX_KEY_BYTES, AttemptKey

from .._format import CHUNK, MAX_RUN_ID_BYTES, run_id_bytes

__all__ = [
    "CHECKPOINT_PREFIX",
    "CHUNK",
    "COUNTER_KEY",
    "DATABASES",
    "DELETED_PREFIX",
    "DESCRIPTOR_PREFIX",
    "INDEX_PREFIX",
    "KEYED_LOG_SCHEMA",
    "KEYED_SCHEMA",
    "SCHEMA_VERSION",
    "MAX_KEYED_GROUP",
    "LEGACY_DIGEST",
    "LEGACY_KEY_LENGTH",
    "MAX_KEY",
    "MAX_RUN_ID_BYTES",
    "META_KEY",
    "RUN_PREFIX",
    "U64",
    "attempt_key",
    "budget_prefixes",
    "checkpoint_key",
    "databases_of",
    "deleted_key",
    "descriptor_key",
    "group_key",
    "index_key",
    "keyed_prefix",
    "keyed_prefix_of",
    "legacy_attempt_key",
    "message_key",
    "NODE_RUN_PREFIX",
    "node_attempt_key",
    "node_record_key",
    "node_scope_key",
    "node_run_key",
    "node_scope_prefix",
    "run_key",
]

#: 2: messages stored as runs; 3: checksums cover database, key and value; 4: manifests (_manifest.py);
#: 5: the ``keyed`` database of groups' keyed state, with its manifest; 6: ``keyed_log``, with its manifest
SCHEMA_VERSION: Final = 6
#: Every named database of a ledger, in creation order; opened (never created) when a ledger opens.
DATABASES: Final = (
    "meta",  # the schema record
    "streams",  # stream descriptors, one per (scope, node, key)
    "messages",  # appended messages, keyed by stream id + sequence
    "groups",  # consumer-group frontiers, state and results
    "attempts",  # per-message failed-attempt counts
    "graph_runs",  # pydantic-graph runs and step checkpoints
    "nodes",  # complete-node checkpoints
    "keyed",  # consumer groups' keyed state (schema 5)
    "keyed_log",  # the keyed state's writes not yet merged into ``keyed`` (schema 6)
)
#: The schema from which a ledger holds the ``keyed`` database.
KEYED_SCHEMA: Final = 5
#: The schema from which a ledger holds the ``keyed_log`` database.
KEYED_LOG_SCHEMA: Final = 6

META_KEY: Final = b"schema"

COUNTER_KEY: Final = b"c"
INDEX_PREFIX: Final = b"r"
DESCRIPTOR_PREFIX: Final = b"d"
DELETED_PREFIX: Final = b"x"
#: Longer keys keep their fixed prefix and a 32-byte digest of the rest (LMDB keys end at 511 bytes).
MAX_KEY: Final = 256
#: Marks a digested key part; 0xff never starts UTF-8, msgpack arrays or the length prefixes.
_DIGESTED: Final = b"\xff"

#: ``nodes`` keys: a retry boundary's attempt record, an execution scope's record, a confirmed node.
NODE_ATTEMPT_PREFIX: Final = b"a"
NODE_SCOPE_PREFIX: Final = b"s"
NODE_RECORD_PREFIX: Final = b"n"
NODE_RUN_PREFIX: Final = b"r"  # a business run of ledger.run / ledger.resume
#: Scope and node names longer than this are digested in keys (the record holds them whole).
_NAME_IN_KEY: Final = 200

RUN_PREFIX: Final = b"run/"
CHECKPOINT_PREFIX: Final = b"checkpoint/"

#: Stream ids and sequence numbers in keys: 8 bytes, big-endian.
U64: Final = struct.Struct(">Q")
_u32: Final = struct.Struct(">I")
_encoder: Final = msgspec.msgpack.Encoder()


def _bounded(prefix: bytes, rest: bytes) -> bytes:
    """``prefix + rest``, or ``prefix`` and a digest of ``rest`` when that is longer than MAX_KEY."""
    if len(prefix) + len(rest) <= MAX_KEY:
        return prefix + rest
    return prefix + _DIGESTED + hashlib.blake2b(rest, digest_size=32).digest()


def index_key(ref: StreamRef) -> bytes:
    """The ``streams`` key mapping a stream's identity to its id."""
    return _bounded(INDEX_PREFIX, _encoder.encode((ref.scope, ref.node, ref.key)))


def descriptor_key(stream_id: int) -> bytes:
    """The ``streams`` key of a stream's descriptor."""
    return DESCRIPTOR_PREFIX + U64.pack(stream_id)


def deleted_key(stream_id: int) -> bytes:
    """The ``streams`` key of a deleted stream's tombstone (its descriptor and index entry went)."""
    return DELETED_PREFIX + U64.pack(stream_id)


def message_key(stream_id: int, first_seq: int) -> bytes:
    """The ``messages`` key of the run of messages starting at ``first_seq``."""
    return U64.pack(stream_id) + U64.pack(first_seq)


def group_key(stream_id: int, group: str) -> bytes:
    """The ``groups`` key of a consumer group's frontier."""
    return _bounded(U64.pack(stream_id), group.encode())


def databases_of(schema_version: int) -> tuple[str, ...]:
    """The databases a ledger of ``schema_version`` holds: ``keyed`` from :data:`KEYED_SCHEMA` on,
    ``keyed_log`` from :data:`KEYED_LOG_SCHEMA` on."""
    if schema_version >= KEYED_LOG_SCHEMA:
        return DATABASES
    return DATABASES[:-1] if schema_version >= KEYED_SCHEMA else DATABASES[:-2]


#: Groups up to this many UTF-8 bytes are kept whole in ``keyed`` keys, longer ones digested:
#: the longest key, 8 + 4 + 200 + MAX_KEY_BYTES = 468 bytes, fits LMDB's 511.
MAX_KEYED_GROUP: Final = 200


def keyed_prefix(stream_id: int, group: str) -> bytes:
    """What every ``keyed`` key of a group's keyed state starts with; the key bytes follow."""
    g = group.encode()
    if len(g) <= MAX_KEYED_GROUP:
        return U64.pack(stream_id) + _u32.pack(len(g)) + g
    return U64.pack(stream_id) + _DIGESTED + _digest(g)


def keyed_prefix_of(key: bytes) -> bytes | None:
    """The group prefix a stored ``keyed`` key starts with; None for a key of no such layout."""
    if len(key) < 9:
        return None
    if key[8:9] == _DIGESTED:
        end = 8 + 1 + 32
    elif len(key) >= 12 and (length := _u32.unpack_from(key, 8)[0]) <= MAX_KEYED_GROUP:
        end = 12 + length
    else:
        return None
    return key[:end] if len(key) >= end and len(key) - end <= MAX_KEY_BYTES else None


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=32).digest()


def _budget_parts(key: AttemptKey) -> tuple[bytes, bytes]:
    """The group part and the rest of a budget key, undigested."""
    _, group, seq, node, parent = key
    g, n = group.encode(), node.encode()
    return _u32.pack(len(g)) + g, b"".join((U64.pack(seq), _u32.pack(len(n)), n, parent.encode()))


def attempt_key(stream_id: int, key: AttemptKey) -> bytes:
    """The ``attempts`` key of a message budget."""
    group, rest = _budget_parts(key)
    prefix = U64.pack(stream_id)
    if len(prefix) + len(group) + len(rest) <= MAX_KEY:
        return prefix + group + rest
    return prefix + _DIGESTED + _digest(group) + _digest(rest)


#: What follows a stream's id in a digested budget key, and the whole length of one digested in one piece.
LEGACY_DIGEST: Final = _DIGESTED
LEGACY_KEY_LENGTH: Final = 8 + 1 + 32


def legacy_attempt_key(stream_id: int, key: AttemptKey) -> bytes | None:
    """A digested budget's key with group and rest digested together; None if it is not digested."""
    group, rest = _budget_parts(key)
    if 8 + len(group) + len(rest) <= MAX_KEY:
        return None
    return U64.pack(stream_id) + _DIGESTED + _digest(group + rest)


def budget_prefixes(stream_id: int, group: str) -> tuple[bytes, bytes]:
    """What the ``attempts`` keys of a group's budgets start with: written whole, or digested."""
    g = group.encode()
    prefix = U64.pack(stream_id)
    return prefix + _u32.pack(len(g)) + g, prefix + _DIGESTED + _digest(_u32.pack(len(g)) + g)


def run_key(run_id: str) -> bytes:
    """The ``graph_runs`` key of a durable graph run's record."""
    return RUN_PREFIX + run_id_bytes(run_id)


def checkpoint_key(run_id: str) -> bytes:
    """The ``graph_runs`` key of a durable graph run's latest checkpoint."""
    return CHECKPOINT_PREFIX + run_id_bytes(run_id)


def _name_part(name: str) -> bytes:
    raw = name.encode()
    if len(raw) <= _NAME_IN_KEY:
        return raw
    return _DIGESTED + hashlib.blake2b(raw, digest_size=32).digest()


def node_attempt_key(parent: str, node: str, position: int) -> bytes:
    """The ``nodes`` key of a retry boundary: the complete chain of a node, or a Retry in it."""
    return _bounded(NODE_ATTEMPT_PREFIX, _encoder.encode((parent, node, position)))


def node_scope_key(scope: str) -> bytes:
    """The ``nodes`` key of an execution scope's record (a child's identity, a final failure)."""
    return NODE_SCOPE_PREFIX + _name_part(scope)


def node_scope_prefix(scope: str) -> bytes:
    """What the ``nodes`` keys of the confirmed nodes of ``scope`` start with."""
    part = _name_part(scope)
    return NODE_RECORD_PREFIX + _u32.pack(len(part)) + part


def node_record_key(scope: str, node: str) -> bytes:
    """The ``nodes`` key of a node's confirmed record in ``scope``."""
    return node_scope_prefix(scope) + _name_part(node)


def node_run_key(run_id: str) -> bytes:
    """The ``nodes`` key of a business run's record (:class:`~ledger.RunRecord`)."""
    return NODE_RUN_PREFIX + run_id_bytes(run_id)
