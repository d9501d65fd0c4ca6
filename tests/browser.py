"""A headless Chromium driven through its DevTools protocol: open a page, wait on it, screenshot it.

Debian's ``chromium`` package (installed by ``.ci/run`` where missing); the
protocol is spoken over its WebSocket with the ``websockets`` package. A
wait is a promise evaluated in the page that resolves on the page's own
``console:updated`` event once a condition holds: no polling from here.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

__all__ = ["Page", "chromium", "chromium_path"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab of the browser."""

    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> Any:
        """Call ``method`` and return its result (events that come first are dropped)."""
        wanted = next(self._ids)
        self._socket.send(json.dumps({"id": wanted, "method": method, "params": params}))
        while True:
            answer = json.loads(self._socket.recv(timeout=120))
            if answer.get("id") == wanted:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        self.until("document.readyState === 'complete' && Number(document.body.dataset.updates || 0) > 0")

    def value(self, expression: str) -> Any:
        """What ``expression`` evaluates to in the page, as JSON."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def until(self, condition: str, timeout_ms: int = 60_000) -> None:
        """Wait until ``condition`` holds in the page, checked at each of its updates."""
        held = self.value(
            "new Promise((resolve) => {"
            f"  const holds = () => {{ try {{ return Boolean({condition}); }}"
            "    catch (e) { return false; } };"
            "  if (holds()) { resolve(true); return; }"
            f"  const timer = setTimeout(() => resolve(false), {timeout_ms});"
            "  const check = () => { if (holds()) { clearTimeout(timer);"
            "    window.removeEventListener('console:updated', check); resolve(true); } };"
            "  window.addEventListener('console:updated', check);"
            "  document.addEventListener('readystatechange', check);"
            "})"
        )
        if not held:
            raise AssertionError(
                f"the page never showed {condition}: {self.value('document.body.innerText')}"
            )

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))


@contextmanager
def chromium(profile: Path) -> Iterator[Page]:
    """A headless browser with a profile in ``profile``, and its first tab."""
    binary = chromium_path()
    assert binary is not None, "chromium is not installed (.ci/run installs Debian's package)"
    process = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",  # run as root in CI
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1280,900",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("DevTools listening on "):
                browser = line.removeprefix("DevTools listening on ").strip()
                break
        else:
            raise AssertionError("chromium ended without its DevTools address")
        port = browser.split(":")[2].split("/")[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as listing:
            tabs = [t for t in json.load(listing) if t["type"] == "page"]
        with connect(tabs[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as socket:
            yield Page(socket)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
