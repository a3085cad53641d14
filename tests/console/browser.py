"""A real headless Chromium (Debian's /usr/bin/chromium) driven over the DevTools protocol.

The tests drive the browser as a user would: navigate, read the rendered DOM, click, submit
forms, take screenshots. The DevTools protocol needs nothing but a WebSocket client
(``websocket-client``, in the dev extras), never a browser download.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


class Browser:
    """One Chromium process with one page; :meth:`close` ends both."""

    def __init__(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="console-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        port = self._devtools_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _devtools_port(self) -> int:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                return int(m.group(1))
        raise RuntimeError("chromium did not start: " + "".join(seen[-20:]))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events that arrive meanwhile are kept)."""
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result") or {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.ws.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                self.events.append(json.loads(self.ws.recv()))
            finally:
                self.ws.settimeout(30)
        raise TimeoutError(f"no {method} within {timeout} s")

    def goto(self, url: str, timeout: float = 60.0) -> float:
        """Load ``url`` and wait for its load event; returns the seconds it took."""
        self.events.clear()
        t0 = time.monotonic()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", timeout)
        return time.monotonic() - t0

    def navigation_ms(self) -> dict[str, float]:
        """The page's own timing (Navigation Timing): response end, DOM content loaded, load end."""
        return dict(
            self.js(
                "(() => { const t = performance.getEntriesByType('navigation')[0];"
                " return {response: t.responseEnd - t.startTime, dom: t.domContentLoadedEventEnd - t.startTime,"
                " load: t.loadEventEnd - t.startTime}; })()"
            )
        )

    def js(self, expression: str) -> Any:
        """Evaluate ``expression`` in the page (promises awaited) and return its value."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def submit_and_wait(self, expression: str) -> None:
        """Run ``expression`` (which submits a form or follows a link) and wait for the next page."""
        self.events.clear()
        self.js(expression)
        self.wait_event("Page.loadEventFired")

    def viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=mobile)

    def screenshot(self, path: Path) -> Path:
        """The whole page (not just the viewport) as a PNG."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self._profile, ignore_errors=True)
