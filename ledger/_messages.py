"""Looking at messages: a stream's confirmed messages as JSON values, a group's keyed state, and its groups
as an operator sees them.

Both read one snapshot of a ledger opened read-only (beside its running
owner) and write nothing. The messages shown must run from where they start
to the last appended without a gap (:func:`streams.store.tail_problems`):
a missing run is :class:`~ledger.MissingRecordError`, never a shorter stream.
Messages are decoded without their Python type (the ledger does not keep
the class), into the JSON shape their MessagePack has: a Struct is an
object, bytes are base64.
"""

from __future__ import annotations

import base64
import datetime
import fnmatch
import json
import time
from collections import deque
from typing import Any

import msgspec

from streams import KeyedState, StreamRef, UnknownStreamError
from streams.store import (
    KeyedRange,
    RecordView,
    appended_at,
    key_to_plain,
    list_keyed,
    live_payload,
    partition_for,
    tail_problems,
    to_plain,
)

from ._errors import MissingRecordError, StreamNotFoundError
from ._inspect import moment, plain
from ._progress import SILENT, Progress

__all__ = [
    "KeyFilter",
    "filtered",
    "group_rows",
    "key_bytes",
    "key_partition",
    "keys_of",
    "messages_of",
    "parse_ref",
    "typed_key",
    "with_rates",
]


def parse_ref(text: str) -> StreamRef:
    """``scope/node/key`` (the scope may hold ``/`` itself) as a :class:`StreamRef`."""
    parts = text.rsplit("/", 2)
    if len(parts) != 3 or not all(parts):
        raise StreamNotFoundError(f"{text!r} is not a stream reference: write it as scope/node/key")
    return StreamRef(*parts)


class KeyFilter(msgspec.Struct, frozen=True):
    """``messages --key``: the messages of one partition key of a partitioned stream.

    The ledger keeps no key of a message (a writer's ``partition_key``
    function gives it, and the ledger keeps no function), only the partition
    the key's digest chose (:func:`~streams.store.partition_for`): that
    partition holds every message of ``key``, and of any other key whose
    digest falls there. ``field`` names the field of a message that holds
    its key, as most key functions read it (``lambda order: order.customer``):
    with it, only the messages whose ``field`` is ``key`` are shown.
    """

    #: The key, as JSON reads it (``42``, ``"42"``), else the text itself.
    key: Any
    #: The field of a message's value that holds its key, or None to show its whole partition.
    field: str | None = None

    def holds(self, value: Any) -> bool:
        """Whether a message's ``value`` (as JSON shows it) is of this key, as far as ``field`` says."""
        if self.field is None:
            return True
        found = value.get(self.field) if isinstance(value, dict) else None
        return found == self.key and isinstance(found, bool) == isinstance(self.key, bool)  # 1 is not true


def typed_key(text: str) -> Any:
    """A key as an operator types it: JSON when it reads as JSON (``42``, ``"42"``), else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def key_partition(view: RecordView, ref: StreamRef, key: Any, where: str) -> StreamRef:
    """The partition of partitioned stream ``ref`` that messages of partition key ``key`` go to.

    Raises :class:`~ledger.StreamNotFoundError` for a stream that is not
    partitioned (or not held), and for one partition named instead of its stream.
    """
    first = ref.partition(0)
    view.load(descriptors=(ref, first))
    desc, partitioned = view.get_descriptor(ref), view.get_descriptor(first)
    if partitioned is not None and partitioned.partitions:
        return ref.partition(partition_for(key, partitioned.partitions))
    if desc is None:
        raise StreamNotFoundError(f"{where} holds no stream {ref}")
    if desc.partitions:
        stream, _, _ = ref.key.rpartition("#")
        raise StreamNotFoundError(
            f"{ref} is one partition of a partitioned stream: name the stream itself "
            f"({ref.scope}/{ref.node}/{stream}) with --key"
        )
    raise StreamNotFoundError(
        f"stream {ref} has no partitions: --key reads the partition of a key of a partitioned stream"
    )


def messages_of(
    view: RecordView,
    ref: StreamRef,
    where: str,
    *,
    start: int = 1,
    limit: int | None = None,
    last: int | None = None,
    key: KeyFilter | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    """The confirmed messages of ``ref`` from sequence ``start`` on (at most ``limit``), as JSON values.

    ``view`` is one read-only snapshot of either backend.
    ``compacted_through`` says which messages every group acknowledged and
    the ledger removed: they cannot be shown. Every kept message after
    ``start`` is read, to check that none is missing; ``progress`` counts
    them, of the total the stream's descriptor gives. ``appends`` are the
    stream's append marks: the first sequence of an append and its time, at
    most about a second apart, thinned as the stream grows
    (:mod:`streams.store` ``appended_at``).

    ``last`` keeps the last ``last`` messages (0: none, as a follow that
    starts after the last confirmed). ``key`` reads the partition of a
    partitioned stream that holds a key (:class:`KeyFilter`); ``stream`` then
    names that partition. ``read_through`` is the last sequence read: a
    follow continues after it.
    """
    if key is not None:
        ref = key_partition(view, ref, key.key, where)
    view.load(descriptors=(ref,))
    desc = view.get_descriptor(ref)
    if desc is None:
        raise StreamNotFoundError(f"{where} holds no stream {ref}")
    after = max(start, desc.compacted_through + 1) - 1
    sifted = key is not None and key.field is not None  # which are the last is known only at the end
    if last is not None and not sifted:
        after = max(after, desc.appended - last)
    progress.phase(f"reading {ref}", max(desc.appended - after, 0), unit="messages")
    shown: deque[dict[str, Any]] = deque(maxlen=last if sifted else None)
    seqs: list[int] = []
    through = after
    for message in view.messages_after(ref, after):
        seqs.append(message.seq)
        if sifted or limit is None or len(shown) < limit:
            through = message.seq
            value = plain(to_plain(message.payload))
            if key is None or key.holds(value):
                at = appended_at(desc.marks, message.seq)
                shown.append(
                    {"seq": message.seq, "appended_at": None if at is None else moment(at), "value": value}
                )
        progress.advance()
    problems = tail_problems(desc, after, seqs)
    if problems:  # a run of messages missing or moved: never shown as a shorter stream
        raise MissingRecordError(f"{where} is damaged: {problems[0]}; restore it from a copy")
    messages = list(shown)
    if limit is not None and len(messages) > limit:  # the first of the last ones a key holds
        messages = messages[:limit]
        through = messages[-1]["seq"]
    return {
        "stream": str(ref),
        "type": desc.type_name,
        "appended": desc.appended,
        "compacted_through": desc.compacted_through,
        "finished": desc.finished,
        "failed": desc.failed,
        "appends": [  # when the stream reached each marked sequence: its kept history of appends
            {"seq": seq, "at": _to_the_ms(ms)}
            for seq, ms in zip(desc.marks[::2], desc.marks[1::2], strict=True)
        ],
        "read_through": through,
        "messages": messages,
    }


def _to_the_ms(ms: int) -> str:
    """A mark's time as UTC ISO 8601 to the millisecond, as the mark keeps it."""
    at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def key_bytes(text: str) -> bytes:
    """A key as an operator types it (:func:`typed_key`), encoded as keyed state encodes it."""
    key = typed_key(text)
    kind: Any = str if isinstance(key, str) else int if type(key) is int else Any
    return KeyedState(kind, Any).key_codec.encode(key)


def key_range(key: str | None, prefix: str | None) -> tuple[bytes, bytes | None]:
    """The encoded keys ``python -m ledger state`` reads: ``key`` (as :func:`key_bytes` reads it), the
    string keys that start with ``prefix``, or every key."""
    if key is not None:
        raw = key_bytes(key)
        return raw, raw + b"\x00"
    if prefix is not None:
        return KeyedState(str, Any).key_codec.prefix(prefix)
    return b"", None


def shown_key(raw: bytes) -> Any:
    """An encoded keyed-state key as JSON shows it."""
    return plain(key_to_plain(raw))


def keys_of(
    view: RecordView,
    ref: StreamRef,
    group: str,
    where: str,
    *,
    start: bytes = b"",
    stop: bytes | None = None,
    limit: int = 100,
    now: float | None = None,
) -> dict[str, Any]:
    """The confirmed keyed state of ``group`` on ``ref``, in key order, as JSON values.

    ``view`` is one read-only snapshot of either backend. Keys read as keyed
    state encodes them (a string, an integer, bytes as base64, or the JSON
    shape of their MessagePack); values as their MessagePack reads. A key
    past its time at ``now`` (default the clock's; :mod:`streams._expiry`)
    is gone, and left out.
    """
    view.load(descriptors=(ref,))
    if view.get_descriptor(ref) is None:
        raise StreamNotFoundError(f"{where} holds no stream {ref}")
    now = time.time() if now is None else now
    keys: list[dict[str, Any]] = []
    last: bytes | None = None
    asked = limit
    while True:  # pages, until ``limit`` keys are there: a key past its time is gone, left out
        try:
            entries = list_keyed(view, KeyedRange(ref, group, start, stop, asked))
        except UnknownStreamError as exc:
            raise StreamNotFoundError(f"{where}: {exc}") from None
        for e in entries:
            value = live_payload(e.value, now)
            if value is not None:
                keys.append({"key": shown_key(e.key), "value": plain(to_plain(value))})
                last = e.key
        if len(entries) < asked or not entries or (asked := limit - len(keys)) <= 0:
            break
        start = entries[-1].key + b"\x00"
    return {
        "stream": str(ref),
        "group": group,
        "keys": keys,
        # the last key as stored (URL-safe base64): where a page of keys after these starts
        "last": base64.urlsafe_b64encode(last).decode("ascii") if last is not None else None,
    }


def filtered(report: dict[str, Any], *, stream: str | None, group: str | None) -> dict[str, Any]:
    """``report`` (of :func:`~ledger.inspect_ledger`) with the streams and groups matching the patterns.

    Patterns are shell-style (``orders*``, ``*/billing/*``) against a
    stream's ``scope/node/key`` and a group's name. With a group pattern,
    streams with no matching group are left out.
    """
    streams = []
    for s in report["streams"]:
        if stream is not None and not fnmatch.fnmatchcase(f"{s['scope']}/{s['node']}/{s['key']}", stream):
            continue
        groups = [g for g in s["groups"] if group is None or fnmatch.fnmatchcase(g["group"], group)]
        if group is not None and not groups:
            continue
        streams.append({**s, "groups": groups})
    return {**report, "streams": streams}


def _partition(stream: dict[str, Any]) -> str:
    """``p/N`` for partition ``p`` of a stream of N partitions (its key is ``key#p``), else empty."""
    count = stream.get("partitions", 0)
    return f"{stream['key'].rpartition('#')[2]}/{count}" if count else ""


def group_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per consumer group, in the shape of ``kafka-consumer-groups --describe``."""
    rows = []
    for s in report["streams"]:
        for g in s["groups"]:
            rows.append(
                {
                    "group": g["group"],
                    "stream": f"{s['scope']}/{s['node']}/{s['key']}",
                    "acked_through": g["acked_through"],
                    "appended": s["appended"],
                    "lag": g["pending"],
                    "oldest_unacked_at": g["oldest_unacked_at"],
                    "exhausted": g["exhausted"],
                    "dead_lettered": g["dead_lettered"],
                    "last_activity": g["active_at"],
                    "stopped": g["stopped"],
                    "partition": _partition(s),
                    "owner": g.get("owner"),
                }
            )
    return sorted(rows, key=lambda r: (r["group"], r["stream"]))


def with_rates(
    rows: list[dict[str, Any]], earlier: list[dict[str, Any]] | None, seconds: float
) -> list[dict[str, Any]]:
    """``rows`` of :func:`group_rows`, each with the messages per second its stream appended
    (``appended_per_s``) and its group handled (``handled_per_s``: its ``acked_through``) since
    ``earlier``, the rows of a view read ``seconds`` before.

    A rate is None where there is nothing to count from: no view before, a
    stream or group new since, or a count that went back (a group moved
    back, a stream made again). Messages keep no time of their append, so
    this is the only rate there is, and no age is shown.
    """
    appended = {} if earlier is None else {r["stream"]: r["appended"] for r in earlier}
    acked = {} if earlier is None else {(r["group"], r["stream"]): r["acked_through"] for r in earlier}

    def per_second(now: int, then: int | None) -> float | None:
        if then is None or now < then or seconds <= 0:
            return None
        return (now - then) / seconds

    return [
        {
            **r,
            "appended_per_s": per_second(r["appended"], appended.get(r["stream"])),
            "handled_per_s": per_second(r["acked_through"], acked.get((r["group"], r["stream"]))),
        }
        for r in rows
    ]
