"""What the console shows, read from the ledger as ``inspect`` reads it, and kept while it watches.

A :class:`Watcher` reads the ledger every ``interval`` seconds on a thread
of its own (one read-only snapshot each, beside the owner or the workers;
on LMDB a read never waits on the owner's writes) and keeps the last
:data:`KEPT` samples of every consumer group: its lag, what its stream
appended and what it acknowledged, so a page can plot them over the time
the console has watched, with rates between samples and the age of the
oldest unacknowledged message from the stream's append marks. Each view is
a JSON value; message contents are read only when a view asks for them.

A group is lagging when its work waits, not merely when it has work: its
oldest unacknowledged message is older than ``lag_age``, or its lag rose at
each of the last :data:`GROWING_READS` reads. Pending messages handled
promptly are a running group's normal state, and it is ``ok``; every group
carries the reason for its word.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import fnmatch
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, Final, TypeVar

from streams import DeadLetter, StreamRef
from streams.store import type_name

from .._connect import tools_for
from .._errors import ConsoleQueryError, StreamNotFoundError
from .._messages import key_range
from .._runs_report import STATUSES, progress
from .._tools import Tools

__all__ = ["GROWING_READS", "KEPT", "LAG_AGE", "Watcher", "health_of", "is_dead_letter_stream"]

#: Samples kept per group: an hour at the default interval of two seconds.
KEPT: Final = 1800
#: Seconds a group's oldest unacknowledged message may wait before the group is lagging (``--lag-age``).
LAG_AGE: Final = 30.0
#: Reads in a row at each of which a group's lag rose, for it to be lagging: a trend, not one noisy step.
GROWING_READS: Final = 5
#: How a stream of dead letters names its type: by shape, or with its module.
_DEAD_LETTER_TYPES: Final = (type_name(DeadLetter), "streams._dead_letter.DeadLetter[")


def is_dead_letter_stream(stream: dict[str, Any]) -> bool:
    """Whether a stream of ``inspect``'s report holds :class:`~streams.DeadLetter`\\ s."""
    return str(stream["type"]).startswith(_DEAD_LETTER_TYPES)


def _instant(text: str | None, what: str) -> str | None:
    """``text`` as the report writes times (UTC, to the second), to compare as text; None if not given."""
    if not text:
        return None
    try:
        at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConsoleQueryError(
            f"{what} takes an ISO 8601 time (2026-12-01T10:00:00Z), not {text!r}"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(moment: str | None) -> float | None:
    if moment is None:
        return None
    return datetime.datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()


_F = TypeVar("_F", bound=Callable[..., Any])


def _one_at_a_time(tools: Tools) -> Tools:
    """``tools`` whose reads of the ledger take turns: each opens it, and a process opens an LMDB
    ledger once at a time (``LedgerInUseError``), while the watcher's thread and the requests' read."""
    turn = threading.Lock()

    def taking_turns(read: _F) -> _F:
        def call(*args: Any, **kwargs: Any) -> Any:
            with turn:
                return read(*args, **kwargs)

        return call  # type: ignore[return-value]

    return replace(
        tools,
        inspect=taking_turns(tools.inspect),
        messages=taking_turns(tools.messages),
        keys=taking_turns(tools.keys),
    )


@dataclass
class _Series:
    """A group's samples: (when, lag, appended, acknowledged, age of the oldest unacknowledged message
    in seconds or None), oldest first."""

    points: deque[tuple[float, int, int, int, float | None]] = field(
        default_factory=lambda: deque(maxlen=KEPT)
    )

    def lags(self, through: float, count: int) -> list[int]:
        """The lags of the last ``count`` samples taken at or before ``through``, oldest first."""
        found: list[int] = []
        for when, lag, *_ in reversed(self.points):
            if len(found) == count:
                break
            if when <= through:
                found.append(lag)
        return found[::-1]

    def rates(self) -> tuple[float | None, float | None]:
        """Messages appended and handled per second between the last two samples."""
        if len(self.points) < 2:
            return None, None
        (t0, _, a0, k0, _), (t1, _, a1, k1, _) = self.points[-2], self.points[-1]
        span = t1 - t0
        if span <= 0 or a1 < a0 or k1 < k0:  # a count went back (a group moved): no rate
            return None, None
        return round((a1 - a0) / span, 1), round((k1 - k0) / span, 1)


def health_of(
    group: dict[str, Any], *, age: float | None = None, lags: Sequence[int] = (), lag_age: float = LAG_AGE
) -> tuple[str, str]:
    """A group at a glance, and why: ``stopped``, ``exhausted``, ``lagging`` or ``ok``, and its reason.

    ``group`` as ``inspect`` reports it; ``age``: the seconds its oldest
    unacknowledged message has waited (None when none waits, or the stream
    kept no mark of it); ``lags``: its lag at the latest reads, oldest
    first. Lagging: ``age`` past ``lag_age``, or a lag that rose at each of
    the last :data:`GROWING_READS` reads. A group with messages pending that
    is neither is ``ok``: it is handling them.
    """
    if group["stopped"]:
        return "stopped", "the group stopped reading this stream"
    if group["exhausted"]:
        return "exhausted", f"{group['exhausted']} message(s) used up their attempts, left unacknowledged"
    reasons = []
    if age is not None and age > lag_age:
        reasons.append(_waited(age, lag_age))
    recent = list(lags[-GROWING_READS - 1 :])
    if len(recent) > GROWING_READS and all(a < b for a, b in pairwise(recent)):
        reasons.append(f"lag grew from {recent[0]} to {recent[-1]} over the last {GROWING_READS} reads")
    if reasons:
        return "lagging", "; ".join(reasons)
    if not group["pending"]:
        return "ok", "nothing pending"
    if age is None:
        return "ok", f"{group['pending']} pending"
    return "ok", f"{group['pending']} pending, {_waited(age, lag_age)}"


def _waited(age: float, lag_age: float) -> str:
    return f"oldest unacknowledged message {_duration(age)} old (threshold {_duration(lag_age)})"


def _duration(seconds: float) -> str:
    """``seconds`` as a reason says an age: ``45s``, ``2.5s``, ``1m30s``, ``15m``, ``2h05m``."""
    if seconds < 60:
        return f"{round(seconds, 1):g}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s" if rest else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"


class Watcher:
    """The ledger at ``target``, read every ``interval`` seconds; the console's views of it.

    ``lag_age``: the seconds a group's oldest unacknowledged message may wait
    before the group is lagging (:func:`health_of`); ``clock``: the time now,
    in seconds since the epoch, that each read is stamped with and ages are
    taken at.
    """

    def __init__(
        self,
        target: str,
        *,
        interval: float = 2.0,
        lag_age: float = LAG_AGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.interval = interval
        self.lag_age = lag_age
        self._tools: Tools = _one_at_a_time(tools_for(target))
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._series: dict[tuple[str, str], _Series] = {}
        self._report: dict[str, Any] | None = None
        self._read_at = 0.0
        self._reads = 0
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return self._tools.describe(self.target)

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> None:
        """Read the ledger once and keep the sample; a failed read is kept as the error it was."""
        try:
            report = self._tools.inspect(self.target, False)
        except Exception as exc:  # shown on every page until a read succeeds again
            with self._changed:
                self._error = f"{type(exc).__name__}: {exc}"
                self._reads += 1
                self._changed.notify_all()
            return
        now = self._clock()
        with self._changed:
            for stream in report["streams"]:
                name = _name(stream)
                for group in stream["groups"]:
                    series = self._series.setdefault((name, group["group"]), _Series())
                    acked = stream["appended"] - group["pending"]
                    oldest = _seconds(group["oldest_unacked_at"])
                    age = None if oldest is None else round(max(0.0, now - oldest), 1)
                    series.points.append((now, group["pending"], stream["appended"], acked, age))
            self._report, self._read_at, self._error = report, now, None
            self._reads += 1
            self._changed.notify_all()

    def start(self) -> None:
        """Read now, then every ``interval`` seconds on a thread, until :meth:`stop`."""
        self.read()

        def watch() -> None:
            while not self._stop.wait(self.interval):
                self.read()

        self._thread = threading.Thread(target=watch, name="console-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def reads_after(self, seen: int, timeout: float) -> int:
        """Wait until a read after the ``seen``-th (or ``timeout`` seconds, or the stop); the count now."""
        with self._changed:
            self._changed.wait_for(lambda: self._reads > seen or self._stop.is_set(), timeout)
            return self._reads

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _current(self) -> tuple[dict[str, Any], float, str | None]:
        with self._lock:
            report = self._report or {"streams": [], "runs": [], "graph_runs": []}
            return report, self._read_at, self._error

    # -- views -----------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Streams with their groups' health, lag, age and rates; runs by status; what needs a look."""
        report, read_at, error = self._current()
        streams = [self._stream_summary(stream, read_at) for stream in report["streams"]]
        runs: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for run in report["runs"]:
            runs[run["status"]] = runs.get(run["status"], 0) + 1
        groups = [g for s in streams for g in s["groups"]]
        return {
            "ledger": self.where,
            "owner": report.get("owner"),
            "read_at": _moment(read_at),
            "error": error,
            "interval": self.interval,
            "lag_age": self.lag_age,
            "growing_reads": GROWING_READS,
            "streams": streams,
            "runs": runs,
            "graph_runs": len(report["graph_runs"]),
            "graphs": sorted({run["graph"] for run in report["runs"]}),
            "dead_letter_streams": [s["stream"] for s in streams if s["dead_letters"]],
            "attention": {
                "lagging": sum(g["health"] == "lagging" for g in groups),
                "exhausted": sum(g["health"] == "exhausted" for g in groups),
                "stopped": sum(g["health"] == "stopped" for g in groups),
                "failed_runs": runs.get("failed", 0),
                "dead_lettered": sum(g["dead_lettered"] for g in groups),
            },
        }

    def _stream_summary(self, stream: dict[str, Any], read_at: float) -> dict[str, Any]:
        name = _name(stream)
        groups = []
        for group in stream["groups"]:
            with self._lock:  # the watcher's thread appends to them; the lags are those up to this read
                series = self._series.get((name, group["group"]), _Series())
                appended_rate, handled_rate = series.rates()
                lags = series.lags(read_at, GROWING_READS + 1)
            oldest = _seconds(group["oldest_unacked_at"])
            age = None if oldest is None else round(max(0.0, read_at - oldest), 1)
            health, reason = health_of(group, age=age, lags=lags, lag_age=self.lag_age)
            groups.append(
                {
                    "group": group["group"],
                    "acked_through": group["acked_through"],
                    "lag": group["pending"],
                    "age_seconds": age,
                    "appended_per_s": appended_rate,
                    "handled_per_s": handled_rate,
                    "exhausted": group["exhausted"],
                    "dead_lettered": group["dead_lettered"],
                    "stopped": group["stopped"],
                    "health": health,
                    "health_reason": reason,
                }
            )
        return {
            "stream": name,
            "type": stream["type"],
            "appended": stream["appended"],
            "finished": stream["finished"],
            "failed": stream["failed"],
            "partitions": stream["partitions"],
            "last_appended_at": stream["last_appended_at"],
            "dead_letters": is_dead_letter_stream(stream),
            "groups": groups,
        }

    def stream(self, name: str, *, messages: bool = False, limit: int = 20) -> dict[str, Any] | None:
        """One stream: its groups with their samples, its append marks (the kept history of its
        appends, from its descriptor); its latest kept messages only if asked."""
        report, read_at, error = self._current()
        found = [s for s in report["streams"] if _name(s) == name]
        if not found:
            return None
        summary = self._stream_summary(found[0], read_at)
        with self._lock:
            history = {
                g["group"]: [list(p) for p in self._series.get((name, g["group"]), _Series()).points]
                for g in summary["groups"]
            }
        # the latest `limit` messages, or none: never a read of the whole stream
        start = max(1, summary["appended"] - limit + 1) if messages else summary["appended"] + 1
        try:
            shown = self._tools.messages(self.target, _ref(name), start, limit if messages else 0)
        except StreamNotFoundError:  # deleted with its run since the last read
            return None
        view: dict[str, Any] = {
            **summary,
            "error": error,
            "read_at": _moment(read_at),
            "history": history,
            "appends": [[mark["seq"], _seconds(mark["at"])] for mark in shown["appends"]],
            "dead_letter_streams": [s for s in self._dead_letter_streams(report) if s != name],
        }
        if messages:
            view["messages"] = shown["messages"]
        return view

    def keys(
        self,
        name: str,
        group: str,
        *,
        key: str | None = None,
        prefix: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> dict[str, Any] | None:
        """A page of ``group``'s confirmed keyed state on stream ``name``, read when asked.

        ``key``: that key alone (``found`` says whether the group holds it);
        else the string keys under ``prefix``, or every key, ``limit`` at a
        time from ``cursor`` (the ``next`` of the page before, the first key
        of its page as stored: None after the last page). None: the ledger holds no such stream or group.
        """
        if key is not None and (prefix is not None or cursor is not None):
            raise ConsoleQueryError("keys takes a key, or a prefix and a cursor: not both")
        start, stop = key_range(key, prefix)
        if cursor is not None:
            try:
                after = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True)
            except (binascii.Error, UnicodeEncodeError, ValueError):
                raise ConsoleQueryError(f"cursor {cursor!r} is no cursor of a page of keys") from None
            if not after or not after.startswith(start[:1]) or after < start:
                raise ConsoleQueryError(f"cursor {cursor!r} is no cursor of a page of these keys")
            start = after
        wanted = 1 if key is not None else limit + 1  # one more: the first key of the next page
        try:
            shown = self._tools.keys(self.target, _ref(name), group, start, stop, wanted)
        except StreamNotFoundError:
            return None
        entries = shown["keys"]
        view: dict[str, Any] = {"stream": name, "group": group}
        if key is not None:
            view["key"] = entries[0] if entries else None
            view["found"] = bool(entries)
            return view
        view["keys"] = entries[:limit]
        view["next"] = shown["last"] if len(entries) > limit else None  # that key, included
        return view

    def dead_letters(
        self, *, source: str | None = None, limit: int = 50, messages: bool = False
    ) -> dict[str, Any]:
        """The latest ``limit`` letters of each dead-letter stream (those of ``source`` only, if given):
        where each came from, its group, node, attempts and error type; the message only if asked."""
        report, read_at, error = self._current()
        letters: list[dict[str, Any]] = []
        streams = self._dead_letter_streams(report)
        for name in streams:
            appended = next(s["appended"] for s in report["streams"] if _name(s) == name)
            try:
                shown = self._tools.messages(self.target, _ref(name), max(1, appended - limit + 1), limit)
            except StreamNotFoundError:  # deleted with its run since the last read
                continue
            for message in shown["messages"]:
                letter = message["value"]
                if source is not None and letter.get("source") != source:
                    continue
                kept = {"stream": name, "stream_seq": message["seq"], "appended_at": message["appended_at"]}
                fields = _LETTER_FIELDS if messages else _LETTER_FIELDS[:-1]
                letters.append({**kept, **{k: letter.get(k) for k in fields}})
        letters.sort(key=lambda x: (x["appended_at"] or "", x["stream"], x["stream_seq"]), reverse=True)
        return {
            "error": error,
            "read_at": _moment(read_at),
            "streams": streams,
            "source": source,
            "letters": letters,
        }

    @staticmethod
    def _dead_letter_streams(report: dict[str, Any]) -> list[str]:
        return [_name(s) for s in report["streams"] if is_dead_letter_stream(s)]

    def runs(
        self,
        *,
        status: str | None = None,
        graph: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> list[dict[str, Any]]:
        """The runs, newest first, as ``runs list --json`` gives them: of ``status``, of the graphs
        ``graph`` matches (a shell pattern), created at or after ``since`` and before ``until``."""
        first, last = _instant(since, "since"), _instant(until, "until")
        if status is not None and status not in STATUSES:
            raise ConsoleQueryError(f"status takes one of {', '.join(STATUSES)}, not {status!r}")
        report, _, _ = self._current()
        chosen = [
            {k: v for k, v in run.items() if k not in ("nodes", "topology")}
            for run in report["runs"]
            if (status is None or run["status"] == status)
            and (graph is None or fnmatch.fnmatchcase(run["graph"], graph))
            and (first is None or (run["created_at"] or "") >= first)
            and (last is None or (run["created_at"] or "") < last)
        ]
        chosen.sort(key=lambda run: (run["updated_at"] or "", run["run_id"]), reverse=True)
        return chosen

    def run(self, run_id: str, *, values: bool = False) -> dict[str, Any] | None:
        """One run as ``runs show --json`` gives it, with its graph's topology to draw it by; with
        ``values``, read from the ledger now with each confirmed node's outputs (``--values``)."""
        report = self._tools.inspect(self.target, True) if values else self._current()[0]
        for run in report["runs"]:
            if run["run_id"] == run_id:
                return {**run, "progress": progress(run, report["streams"])}
        return None

    def groups(self) -> Iterator[tuple[str, str]]:
        with self._lock:
            yield from list(self._series)


#: What the dead-letter view shows of each letter, besides where it is kept.
_LETTER_FIELDS: Final = ("source", "seq", "group", "node", "attempts", "error_type", "message")


def _name(stream: dict[str, Any]) -> str:
    return f"{stream['scope']}/{stream['node']}/{stream['key']}"


def _ref(name: str) -> StreamRef:
    scope_node, _, key = name.rpartition("/")
    scope, _, node = scope_node.rpartition("/")
    return StreamRef(scope, node, key)


def _moment(at: float) -> str | None:
    if not at:
        return None
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
