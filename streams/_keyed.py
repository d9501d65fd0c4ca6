"""Keyed state: a consumer group's values per key, confirmed with each message's ack.

A handler given ``keyed=KeyedState(K, V)`` reads and writes single keys
through ``tx.store``. Its writes stay in the message's transaction until the
handler returns; they are then staged with the message and confirmed by
the same commit as its ack, so a message's keys change exactly when it is
acknowledged. The group is its keyed state's only writer, so what the
engine read or wrote stays true: :class:`KeyedCache` answers from the
writes staged but not yet confirmed, then from a bounded cache of
confirmed values, and reads the store only for a key it never saw. Cost
per message is a few dict operations, whatever the number of keys held.

Keys are encoded so that byte order is the key's own order within a type
(an operator lists and ranges them): a ``str`` as ``b"s"`` and its UTF-8,
an ``int`` (64-bit) as ``b"i"`` and 8 bytes big-endian offset by 2**63, a
``bytes`` as ``b"b"`` and itself, anything else as ``b"m"`` and its
msgpack. :func:`key_to_plain` reads any of them back for inspection.

A declaration with a ``ttl`` stamps each value it writes with the time it
is gone (:mod:`streams._expiry`): past it, the key reads as absent for
every reader, a handler's read of it stages its delete, and the group's
sweep deletes the untouched ones with its next commits, a page of keys at
a time: dead keys cost no read on a message's path.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from itertools import islice
from typing import Any, Final, Generic, Protocol, TypeVar, overload

import msgspec

from ._codec import Codec, codec_for
from ._errors import HandlerContractError, KeyedStateError, PayloadTypeError
from ._expiry import TAG as _STAMPED
from ._expiry import live_payload, stamped
from ._store._hooks import KeyedHooks
from ._store._records import MAX_KEY_BYTES, KeyedRange, KeyedRead, KeyedWrite, StreamRef

__all__ = ["KeyCodec", "KeyedCache", "KeyedState", "KeyedTx", "WithStore", "key_to_plain"]

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

_I64: Final = struct.Struct(">Q")
_OFFSET: Final = 1 << 63
_encoder = msgspec.msgpack.Encoder()
_plain = msgspec.msgpack.Decoder()
#: What a value's error message calls it (never the key: keys may hold what messages must not show).
_VALUE: Final = "a keyed-state value"


class KeyCodec(Generic[K]):
    """Encodes keys of one type to bytes that sort as the keys do, and back."""

    __slots__ = ("_codec", "_kind", "encode", "name")

    def __init__(self, tp: Any) -> None:
        self._kind = "s" if tp is str else "i" if tp is int else "b" if tp is bytes else "m"
        self._codec: Codec[K] = codec_for(tp)
        self.name = self._codec.name
        #: ``encode(key)``: the bytes of ``key``; :class:`PayloadTypeError` for a key of another
        #: type, :class:`KeyedStateError` for one longer than a ledger keeps. Made once per kind.
        self.encode: Callable[[object], bytes] = self._encoder()

    def _encoder(self) -> Callable[[object], bytes]:
        refuse, too_long = self._refuse, _too_long
        if self._kind == "s":

            def encode_str(key: object) -> bytes:
                if type(key) is not str:
                    refuse(key)
                raw = b"s" + key.encode()  # type: ignore[attr-defined]
                return raw if len(raw) <= MAX_KEY_BYTES else too_long(raw)

            return encode_str
        if self._kind == "i":

            def encode_int(key: object) -> bytes:
                if type(key) is not int:
                    refuse(key)
                if not -_OFFSET <= key < _OFFSET:  # type: ignore[operator]
                    raise KeyedStateError(f"keyed state takes int keys of 64 bits, got {key}")
                return b"i" + _I64.pack(key + _OFFSET)  # type: ignore[operator]

            return encode_int
        if self._kind == "b":

            def encode_bytes(key: object) -> bytes:
                if type(key) is not bytes:
                    refuse(key)
                raw = b"b" + key  # type: ignore[operator]
                return raw if len(raw) <= MAX_KEY_BYTES else too_long(raw)

            return encode_bytes
        prepare = self._codec.prepare

        def encode_msgpack(key: object) -> bytes:
            raw = b"m" + prepare(key, what="a keyed-state key")[1]
            return raw if len(raw) <= MAX_KEY_BYTES else too_long(raw)

        return encode_msgpack

    def prefix(self, prefix: object) -> tuple[bytes, bytes | None]:
        """The range of encoded keys that start with ``prefix``: ``(start, stop)``, ``stop`` excluded.

        For ``str`` and ``bytes`` keys only: a ``str`` key starts with a
        prefix exactly when its UTF-8 starts with the prefix's.
        """
        if self._kind not in ("s", "b"):
            raise TypeError(f"a prefix ranges str or bytes keys, not {self.name} keys")
        if isinstance(prefix, str) and self._kind == "s":
            body = prefix.encode()
        elif isinstance(prefix, bytes) and self._kind == "b":
            body = prefix
        else:
            raise PayloadTypeError(
                f"keyed state takes {self.name} keys, got a prefix of {type(prefix).__qualname__}"
            )
        start = self._kind.encode() + body
        return start, _after_prefix(start)

    def _refuse(self, key: object) -> None:
        raise PayloadTypeError(
            f"keyed state takes {self.name} keys, got a {type(key).__qualname__}; nothing was staged"
        )

    def decode(self, raw: bytes) -> K:
        """The key ``raw`` encodes."""
        if self._kind == "m":
            return self._codec.decode(raw[1:], what="a keyed-state key")
        decoded: K = key_to_plain(raw)
        return decoded


def _after_prefix(start: bytes) -> bytes | None:
    """The first byte string after every one that starts with ``start``; None: there is none."""
    kept = start.rstrip(b"\xff")
    return kept[:-1] + bytes([kept[-1] + 1]) if kept else None


def _keyed_hooks(hooks: object) -> KeyedHooks:
    if not isinstance(hooks, KeyedHooks):
        raise TypeError(f"{type(hooks).__qualname__} keeps no keyed state (it is no KeyedHooks)")
    return hooks


def _too_long(raw: bytes) -> bytes:
    raise KeyedStateError(
        f"a keyed-state key of {len(raw)} bytes encoded; a ledger keeps keys of at most "
        f"{MAX_KEY_BYTES} bytes (nothing was staged)"
    )


def key_to_plain(raw: bytes) -> Any:
    """A stored keyed-state key as plain data (str, int, bytes, or msgpack's plain values)."""
    tag, body = raw[:1], raw[1:]
    if tag == b"s":
        return body.decode()
    if tag == b"i" and len(body) == 8:
        return _I64.unpack(body)[0] - _OFFSET
    if tag == b"b":
        return body
    if tag == b"m":
        return _plain.decode(body)
    raise ValueError(f"{raw!r} is not a keyed-state key of streamledger's encoding")


class WithStore(Protocol):
    """What :meth:`KeyedState.of` takes: a message's transaction (``MessageTx``), with its ``store``."""

    @property
    def seq(self) -> int: ...

    @property
    def store(self) -> KeyedTx[Any, Any]: ...


class KeyedState(Generic[K, V]):
    """Declares a consumer group's keyed state: ``KeyedState(str, int)``, values per key.

    ``key`` and ``value`` are the types (any type msgspec encodes; ``str``,
    ``int`` and ``bytes`` keys sort naturally). ``prefetch``, a function of a
    message's value giving the key its handler will read, lets the engine
    read the keys of many messages at once before handling them: one store
    round trip per batch instead of one per key, which matters on
    PostgreSQL. ``cache`` bounds the confirmed values kept in memory.

    ``ttl`` (a :class:`~datetime.timedelta`) makes a key not written for
    that long gone for every reader: ``tx.store.get`` returns the default
    (and the message's commit deletes it), the reads from outside leave it
    out, and the group's commits sweep the keys nobody touches. A key's
    time runs from the write that last put it, by ``clock`` (seconds since
    the epoch, default :func:`time.time`: messages carry no time of their
    own, so the time is the clock of the transaction that wrote it).
    """

    __slots__ = (
        "cache",
        "clock",
        "key_codec",
        "key_type",
        "prefetch",
        "ttl",
        "ttl_seconds",
        "value_codec",
        "value_type",
    )

    def __init__(
        self,
        key: type[K],
        value: type[V],
        *,
        prefetch: Callable[[Any], K] | None = None,
        cache: int = 100_000,
        ttl: timedelta | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if cache < 0:
            raise ValueError(f"cache takes a number of entries of at least 0, not {cache}")
        if prefetch is not None and not callable(prefetch):
            raise TypeError(f"prefetch takes a function of a message's value, got {prefetch!r}")
        if ttl is not None and not isinstance(ttl, timedelta):
            raise TypeError(f"ttl takes a datetime.timedelta, got {ttl!r}")
        if ttl is not None and ttl.total_seconds() < 0.001:
            raise ValueError(f"ttl takes a time of at least a millisecond, not {ttl}")
        if not callable(clock):
            raise TypeError(f"clock takes a function giving seconds since the epoch, got {clock!r}")
        self.ttl = ttl
        #: ``ttl`` in seconds, None without one.
        self.ttl_seconds = None if ttl is None else ttl.total_seconds()
        self.clock = clock
        self.key_type = key
        self.value_type = value
        self.key_codec: KeyCodec[K] = KeyCodec(key)
        self.value_codec: Codec[V] = codec_for(value)
        self.prefetch = prefetch
        self.cache = cache

    def of(self, tx: WithStore) -> KeyedTx[K, V]:
        """``tx.store``, typed by this declaration: ``TOTALS.of(tx).get(customer)`` is a ``V | None``."""
        store: KeyedTx[K, V] = tx.store
        if store._spec is not self:
            raise HandlerContractError(
                f"message {tx.seq}: {self!r} is not the keyed state its handle_messages was given "
                f"({store._spec!r})"
            )
        return store

    @overload
    async def get(self, hooks: object, stream: StreamRef, group: str, key: K) -> V | None: ...
    @overload
    async def get(self, hooks: object, stream: StreamRef, group: str, key: K, default: D) -> V | D: ...
    async def get(self, hooks: object, stream: StreamRef, group: str, key: K, default: Any = None) -> Any:
        """The confirmed value of ``key`` in ``group``'s keyed state on ``stream``, or ``default``.

        A read from outside the handler (an HTTP handler's, an operator's),
        beside it while it runs: it sees what the ledger confirmed, never a
        write a handler staged and the ledger has not confirmed, and changes
        nothing. ``hooks`` is the store (a :class:`~streams.store.KeyedHooks`);
        a stream or group it does not hold is :class:`~streams.UnknownStreamError`.
        """
        raw = self.key_codec.encode(key)
        entries = await _keyed_hooks(hooks).list_keyed(KeyedRange(stream, group, raw, raw + b"\x00", 1))
        value = live_payload(entries[0].value, self.clock()) if entries else None
        if value is None:
            return default
        return self.value_codec.decode(value, what=f"the keyed state of group {group!r}")

    async def items(
        self,
        hooks: object,
        stream: StreamRef,
        group: str,
        *,
        start: K | None = None,
        stop: K | None = None,
        prefix: str | bytes | None = None,
        limit: int = 1000,
    ) -> list[tuple[K, V]]:
        """The confirmed keys and values of ``group``'s keyed state on ``stream``, in key order.

        From ``start`` (included) to ``stop`` (excluded), or the keys that
        start with ``prefix`` (``str`` and ``bytes`` keys), at most ``limit``;
        a read beside the running handler, as :meth:`get` is. ``hooks`` is the
        store (a :class:`~streams.store.KeyedHooks`).
        """
        keyed = _keyed_hooks(hooks)
        if prefix is not None:
            if start is not None or stop is not None:
                raise ValueError("items takes a prefix or a range (start, stop), not both")
            first, last = self.key_codec.prefix(prefix)
        else:
            first = b"" if start is None else self.key_codec.encode(start)
            last = None if stop is None else self.key_codec.encode(stop)
        decode_key, decode_value = self.key_codec.decode, self.value_codec.decode
        what = f"the keyed state of group {group!r}"
        now = self.clock()
        found: list[tuple[K, V]] = []
        asked = limit
        while True:  # pages of keys, until ``limit`` are there: the gone ones are left out
            entries = await keyed.list_keyed(KeyedRange(stream, group, first, last, asked))
            for e in entries:
                value = live_payload(e.value, now)
                if value is not None:
                    found.append((decode_key(e.key), decode_value(value, what=what)))
            if len(entries) < asked or not entries:  # no more keys in the range
                return found
            asked = limit - len(found)
            if asked <= 0:
                return found
            first = entries[-1].key + b"\x00"

    def __repr__(self) -> str:
        ttl = "" if self.ttl is None else f", ttl={self.ttl!r}"
        return f"KeyedState({self.key_codec.name}, {self.value_codec.name}{ttl})"


#: With a ``ttl``: a page of this many keys is swept every :data:`SWEEP_EVERY` messages handled.
SWEEP_KEYS: Final = 256
#: Messages between two pages swept: a quarter of a key read a message. Every reader leaves a gone
#: key out whether or not it was swept yet, so the pace is how soon its space is given back.
SWEEP_EVERY: Final = 1024


class KeyedCache:
    """What one handler knows of its group's keyed state: staged writes, then confirmed values.

    ``pending`` maps a key to its last staged write (None deletes) and the
    sequence of the message that staged it; a confirmed batch moves its
    writes to ``clean`` (:meth:`landed`). ``clean`` holds confirmed values,
    None for a key known absent: ``limit`` entries, and up to a quarter more
    before the oldest go, all at once. The store is read only for a key in
    neither.

    With a ``ttl``, the cache sweeps: every :data:`SWEEP_EVERY` messages it
    reads the next page of :data:`SWEEP_KEYS` keys (:meth:`sweep`, cycling through them all),
    and ``gone`` holds the ones past their time that nothing wrote since;
    the next message acknowledged deletes them with its own writes
    (:meth:`take_gone`). A key staged or confirmed meanwhile leaves
    ``gone``: its newer value is not the one the page read.
    """

    __slots__ = (
        "_hooks",
        "_landing",
        "_limit",
        "_sweep_from",
        "_unswept",
        "clean",
        "gone",
        "group",
        "key_of",
        "parent_attempt",
        "pending",
        "ref",
        "spec",
        "upcoming",
    )

    def __init__(
        self, hooks: object, spec: KeyedState[Any, Any], ref: StreamRef, group: str, parent_attempt: str
    ) -> None:
        if not isinstance(hooks, KeyedHooks):
            raise HandlerContractError(
                f"handle_messages was given keyed state, but the store {type(hooks).__qualname__} "
                "keeps none (it implements no read_keyed and list_keyed: streams.store.KeyedHooks)"
            )
        self._hooks = hooks
        self.spec = spec
        self._limit = spec.cache
        self.ref = ref
        self.group = group
        self.parent_attempt = parent_attempt
        self.pending: dict[bytes, tuple[bytes | None, int]] = {}
        self.clean: dict[bytes, bytes | None] = {}
        #: With ``prefetch``: the key of a message's value, and the values of the messages taken
        #: but not yet handled, whose keys the first read that misses the cache reads along.
        self.key_of: Callable[[Any], bytes] | None = None
        self.upcoming: Sequence[Any] | None = None
        #: With a ``ttl``: the keys a sweep found gone, to delete; where its next page starts; the
        #: messages until that page; the keys confirmed while a page is being read.
        self.gone: dict[bytes, None] = {}
        self._sweep_from = b""
        self._unswept = SWEEP_EVERY
        self._landing: set[bytes] | None = None

    @property
    def sweeps(self) -> bool:
        """Whether its declaration has a ``ttl``, so the group's commits sweep its gone keys."""
        return self.spec.ttl_seconds is not None

    async def sweep(self, handled: int) -> None:
        """Count ``handled`` messages taken; once :data:`SWEEP_EVERY` were, read the next page of keys
        and note in ``gone`` the ones past their time."""
        self._unswept -= handled
        if self._unswept > 0:
            return
        self._unswept = SWEEP_EVERY
        landing = self._landing = set()
        try:
            entries = await self._hooks.list_keyed(
                KeyedRange(self.ref, self.group, self._sweep_from, None, SWEEP_KEYS)
            )
        finally:
            self._landing = None
        now = self.spec.clock()
        pending, gone = self.pending, self.gone
        for entry in entries:
            key = entry.key
            if key not in pending and key not in landing and live_payload(entry.value, now) is None:
                gone[key] = None
        self._sweep_from = entries[-1].key + b"\x00" if len(entries) == SWEEP_KEYS else b""

    def take_gone(self, writes: dict[bytes, bytes | None] | None) -> dict[bytes, bytes | None] | None:
        """``writes`` (a message's, None: it wrote nothing) with the deletes of the keys found gone."""
        gone = self.gone
        if not gone:
            return writes
        merged = {} if writes is None else writes
        for key in gone:
            merged.setdefault(key, None)
        gone.clear()
        return merged

    def known(self, key: bytes) -> tuple[bool, bytes | None]:
        """Whether the value of ``key`` is known without the store, and that value."""
        entry = self.pending.get(key)
        if entry is not None:
            return True, entry[0]
        clean = self.clean
        if key in clean:
            return True, clean[key]
        return False, None

    async def read(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Read ``keys`` the cache does not know from the store, in one call; remember what it said."""
        values = await self._hooks.read_keyed(
            KeyedRead(self.ref, self.group, tuple(keys), self.parent_attempt)
        )
        for key, value in zip(keys, values, strict=True):
            # no write of key can have been staged meanwhile: the handler was waiting for this read
            self._remember(key, value)
        return list(values)

    async def miss(self, key: bytes) -> bytes | None:
        """Read ``key``, which the cache does not know, from the store; with ``prefetch``, the keys
        of the messages taken but not yet handled too, in the same call."""
        upcoming, key_of = self.upcoming, self.key_of
        if upcoming is None or key_of is None:
            return (await self.read((key,)))[0]
        self.upcoming = None
        pending, clean = self.pending, self.clean
        wanted = {key: None}
        for value in upcoming:
            try:
                ahead = key_of(value)
            except Exception:
                continue
            if ahead not in pending and ahead not in clean:
                wanted[ahead] = None
        keys = list(wanted)
        return (await self.read(keys))[0]

    def stage(self, writes: dict[bytes, bytes | None], seq: int) -> None:
        """The writes of message ``seq``, staged: later reads see them before they are confirmed."""
        pending = self.pending
        for key, value in writes.items():
            pending[key] = (value, seq)
        gone = self.gone
        if gone:
            for key in writes:
                gone.pop(key, None)

    def landed(self, writes: tuple[KeyedWrite, ...], last_seq: int) -> None:
        """Writes of messages through ``last_seq`` were confirmed: they are clean now, in order."""
        pending = self.pending
        landing, gone = self._landing, self.gone
        for write in writes:
            key = write.key
            entry = pending.get(key)
            if entry is not None and entry[1] <= last_seq:
                del pending[key]
            self._remember(key, write.value)
            if landing is not None:
                landing.add(key)
            if gone:
                gone.pop(key, None)

    def _remember(self, key: bytes, value: bytes | None) -> None:
        limit = self._limit
        if limit == 0:
            return
        clean = self.clean
        clean[key] = value
        if len(clean) >= limit + max(limit >> 2, 64):
            # the oldest go, a quarter of the bound at a time: one pass over the table, where taking
            # the first key one at a time rescans every slot freed before it
            self.clean = dict(islice(clean.items(), len(clean) - limit, None))


class KeyedTx(Generic[K, V]):
    """``tx.store``: a message's reads and writes of its group's keyed state.

    ``put`` and ``delete`` stage a key's change in the message's transaction;
    it is confirmed with the message's ack, or dropped with a failed attempt.
    ``get`` sees this message's own changes, then every earlier message's.
    ``writes`` holds the message's changes (made on first use) for the
    handler to stage with its ack; ``check_open(what)`` is the transaction's
    refusal of a use after its handler call returned.
    """

    __slots__ = ("_cache", "_check_open", "_seq", "_spec", "writes")

    def __init__(
        self, seq: int, spec: KeyedState[K, V], cache: KeyedCache, check_open: Callable[[str], None]
    ) -> None:
        self._seq = seq
        self._spec = spec
        self._cache = cache
        self._check_open = check_open
        self.writes: dict[bytes, bytes | None] | None = None

    @overload
    async def get(self, key: K) -> V | None: ...
    @overload
    async def get(self, key: K, default: D) -> V | D: ...
    async def get(self, key: K, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when the group's keyed state holds none."""
        self._check_open("tx.store.get")
        raw = self._spec.key_codec.encode(key)
        writes = self.writes
        if writes is not None and raw in writes:
            value = writes[raw]
        else:
            found, value = self._cache.known(raw)
            if not found:
                value = await self._cache.miss(raw)
        if value is None:
            return default
        if value[:1] == _STAMPED:
            live = live_payload(value, self._spec.clock())
            if live is None:  # past its time: gone, and this message's commit deletes it
                self._writes()[raw] = None
                return default
            value = live
        return self._spec.value_codec.decode(value, what=_VALUE)

    def put(self, key: K, value: V) -> None:
        """Set ``key`` to ``value``, confirmed with this message's ack (with a ``ttl``: gone ``ttl``
        after this write, unless written again)."""
        self._check_open("tx.store.put")
        spec = self._spec
        raw = spec.key_codec.encode(key)
        payload = spec.value_codec.payload(value, what=_VALUE)
        ttl = spec.ttl_seconds
        self._writes()[raw] = payload if ttl is None else stamped(payload, spec.clock() + ttl)

    def delete(self, key: K) -> None:
        """Delete ``key``, confirmed with this message's ack; a key it lacks is no error."""
        self._check_open("tx.store.delete")
        self._writes()[self._spec.key_codec.encode(key)] = None

    def _writes(self) -> dict[bytes, bytes | None]:
        writes = self.writes
        if writes is None:
            writes = self.writes = {}
        return writes

    def __repr__(self) -> str:
        return f"KeyedTx({self._spec!r}, seq={self._seq})"
