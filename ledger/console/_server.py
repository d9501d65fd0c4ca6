"""The console's HTTP server: its pages and their JSON, read-only, safe by default.

Pages are files shipped in the package (``static/``): nothing is fetched
from anywhere else, and the Content-Security-Policy lets a page load only
what this server serves. The JSON endpoints are the :class:`Watcher`'s views;
``/api/events`` is a stream of server-sent events, one per read of the
ledger, on which pages fetch their views again (live, without a reload).

Only ``GET`` and ``HEAD`` are answered: nothing the console serves changes
the ledger. On a loopback address it needs no token; on any other, every
request must carry the token, as ``Authorization: Bearer TOKEN``, as
``?token=TOKEN`` (the first page a browser opens), or as the cookie that
page sets, so the pages' own requests carry it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import mimetypes
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from .._errors import ConsoleQueryError
from ._model import Watcher

__all__ = ["COOKIE", "ConsoleServer", "is_loopback"]

COOKIE: Final = "streamledger_console"
#: What a page may load: only this server's files and JSON; no inline script, no frame.
_SECURITY: Final = (
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
_PAGES: Final = {
    "/": "index.html",
    "/index.html": "index.html",
    "/console.js": "console.js",
    "/console.css": "console.css",
}


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): a console there needs no token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _limit(query: dict[str, str], default: int, what: str = "messages") -> int:
    """How many items a view asks for: ``?limit=N``, 1 to 200; anything else is :class:`ConsoleQueryError`."""
    given = query.get("limit")
    if given is None or given == "":
        return default
    if not (given.isascii() and given.isdigit()) or not 1 <= int(given) <= 200:
        raise ConsoleQueryError(f"limit takes a number of {what} from 1 to 200, not {given!r}")
    return int(given)


def _flag(query: dict[str, str], name: str) -> bool:
    """A yes-or-no parameter: ``1`` or ``0`` (absent or empty: no); else :class:`ConsoleQueryError`."""
    given = query.get(name) or "0"
    if given not in ("0", "1"):
        raise ConsoleQueryError(f"{name} takes 1 or 0, not {given!r}")
    return given == "1"


#: The parameters each view takes (besides ``token``); a parameter not of its view is refused, so a
#: misspelt filter is an error, not a silently unfiltered answer.
_TAKES: Final = {
    "/api/overview": (),
    "/api/runs": ("status", "graph", "since", "until"),
    "/api/runs/": ("values",),
    "/api/dead-letters": ("source", "limit", "messages"),
    "/api/streams/": ("messages", "limit"),
    "/api/keys": ("stream", "group", "key", "prefix", "cursor", "limit"),
    "/api/events": (),
}


def _check_names(path: str, query: dict[str, str]) -> None:
    """Refuse a parameter the JSON view at ``path`` does not take (the pages are left to the browser)."""
    view = (
        path if path in _TAKES else next((v for v in _TAKES if v.endswith("/") and path.startswith(v)), None)
    )
    if view is None:
        return
    takes = _TAKES[view]
    stray = sorted(set(query) - {"token", *takes})
    if stray:
        said = ", ".join(takes) if takes else "no parameter but the token"
        raise ConsoleQueryError(f"{path} does not take {', '.join(stray)}; it takes {said}")


def _static(name: str) -> bytes:
    return resources.files("ledger.console").joinpath("static", name).read_bytes()


class ConsoleServer:
    """The console of ``watcher``'s ledger at ``host:port`` (port 0 picks a free one)."""

    def __init__(self, watcher: Watcher, host: str, port: int, token: str | None) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(
                f"a console on {host}, which is not a loopback address, needs a token: give --token or set "
                "STREAMLEDGER_CONSOLE_TOKEN"
            )
        self.watcher = watcher
        self.token = token
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{text}]" if ":" in text else text
        return f"http://{shown}:{port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def start(self) -> None:
        """Serve on a thread of its own (the tests' way), until :meth:`close`."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="console", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.watcher.stop()  # ends the event streams, which wait on its reads
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()


def _handler(console: ConsoleServer) -> type[BaseHTTPRequestHandler]:
    watcher = console.watcher

    class Handler(BaseHTTPRequestHandler):
        server_version = "streamledger-console"
        #: Whether the request's answer has begun (its status sent): a failure after it cannot be said.
        answered = False

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if not self._allowed(query):
                self._json(
                    401, {"error": "this console needs its token: ?token=TOKEN or Authorization: Bearer"}
                )
                return
            self.answered = False
            try:
                self._route(url.path, query)
            except ConsoleQueryError as exc:  # a parameter the view cannot take: nothing was sent yet
                self._json(400, {"error": str(exc)})
            except (BrokenPipeError, ConnectionResetError):
                return  # the page went away
            except Exception as exc:  # a read of the ledger failed: said, never a dropped connection
                said = f"{type(exc).__name__}: {exc}"
                sys.stderr.write(f"console: {url.path} failed: {said}\n")
                if not self.answered:
                    self._json(500, {"error": said})

        def _route(self, path: str, query: dict[str, str]) -> None:
            _check_names(path, query)
            if path in _PAGES:
                name = _PAGES[path]
                kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
                self._send(200, f"{kind}; charset=utf-8", _static(name), cookie=query.get("token"))
            elif path == "/api/overview":
                self._json(200, watcher.overview())
            elif path == "/api/runs":
                chosen = watcher.runs(
                    status=query.get("status") or None,
                    graph=query.get("graph") or None,
                    since=query.get("since") or None,
                    until=query.get("until") or None,
                )
                self._json(200, chosen)
            elif path.startswith("/api/runs/"):
                run_id = unquote(path.removeprefix("/api/runs/"))
                self._found(watcher.run(run_id, values=_flag(query, "values")), "run")
            elif path == "/api/dead-letters":
                letters = watcher.dead_letters(
                    source=query.get("source") or None,
                    limit=_limit(query, 50, "letters"),
                    messages=_flag(query, "messages"),
                )
                self._json(200, letters)
            elif path.startswith("/api/streams/"):
                name = unquote(path.removeprefix("/api/streams/"))
                view = watcher.stream(name, messages=_flag(query, "messages"), limit=_limit(query, 20))
                self._found(view, "stream")
            elif path == "/api/keys":
                self._keys(query)
            elif path == "/api/events":
                self._events()
            else:
                self._json(404, {"error": f"no page {path}"})

        def do_HEAD(self) -> None:
            self.do_GET()

        def _refuse(self) -> None:
            self._json(405, {"error": "the console is read-only: it answers GET only"})

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        def _allowed(self, query: dict[str, str]) -> bool:
            token = console.token
            if token is None:
                return True
            offered = [query.get("token", "")]
            header = self.headers.get("Authorization", "")
            if header.startswith("Bearer "):
                offered.append(header.removeprefix("Bearer "))
            for part in self.headers.get("Cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE:
                    offered.append(value)
            return any(hmac.compare_digest(o.encode(), token.encode()) for o in offered if o)

        def _keys(self, query: dict[str, str]) -> None:
            """``?stream=S&group=G`` and ``key=K``, or ``prefix=P``, ``cursor=C``, ``limit=N`` (1 to 200)."""
            stream, group = query.get("stream"), query.get("group")
            if not stream or not group:
                raise ConsoleQueryError("keys takes a stream (scope/node/key) and a group")
            view = watcher.keys(
                stream,
                group,
                key=query.get("key"),
                prefix=query.get("prefix"),
                cursor=query.get("cursor"),
                limit=_limit(query, 50, "keys"),
            )
            self._found(view, "stream or consumer group")

        def _found(self, view: Any, what: str) -> None:
            if view is None:
                self._json(404, {"error": f"the ledger has no such {what}"})
            else:
                self._json(200, view)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, "application/json", json.dumps(value).encode())

        def _send(self, status: int, kind: str, body: bytes, *, cookie: str | None = None) -> None:
            self.answered = True
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in _SECURITY:
                self.send_header(name, value)
            if cookie and console.token:
                self.send_header("Set-Cookie", f"{COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _events(self) -> None:
            """One ``read`` event per read of the ledger, until the client goes or the console stops."""
            self.answered = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            for name, value in _SECURITY:
                self.send_header(name, value)
            self.end_headers()
            seen = 0
            try:
                while not watcher.stopped:
                    now = watcher.reads_after(seen, timeout=15.0)
                    if now == seen:  # nothing read for a while: a comment keeps the connection alive
                        self.wfile.write(b": idle\n\n")
                    else:
                        seen = now
                        self.wfile.write(f"event: read\ndata: {seen}\n\n".encode())
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return  # the page went away

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a line per request says nothing an operator needs

    return Handler
