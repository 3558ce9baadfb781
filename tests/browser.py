"""A headless browser for tests that look at a page as a person would: Debian's ``/usr/bin/chromium``, driven over
the Chrome DevTools Protocol (CDP) with the ``websockets`` client, nothing downloaded.

``Chromium`` starts the browser on a free port with a throwaway profile and stops it by PID; ``Page`` is one tab:
navigate, evaluate JavaScript, wait for a condition, read the text, capture a PNG. No host name but 127.0.0.1
resolves (``--host-resolver-rules``), so a page that needs the internet fails here as it would offline.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from tests.support import Process, free_port, wait_until

CHROMIUM = Path("/usr/bin/chromium")
# A screenshot of a tall page is several MB of base64 in one CDP reply; websockets' default limit is 1 MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # tests run as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # offline: no host but 127.0.0.1 resolves
)


class CdpError(Exception):
    """A CDP command failed, or the JavaScript it ran threw."""

    def __init__(self, method: str, error: object) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error


class Page:
    """One tab, through its own CDP WebSocket. Of the events the browser sends between replies, the URLs of the
    requests it makes are kept (``requests``); the others are ignored."""

    def __init__(self, ws: ClientConnection, *, timeout: float = 30.0) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self.timeout = timeout
        self._requested: list[str] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its ``result``."""
        message_id = next(self._ids)
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while True:
            message = json.loads(self._ws.recv(timeout=max(0.0, deadline - time.monotonic())))
            if message.get("method") == "Network.requestWillBeSent":
                self._requested.append(message["params"]["request"]["url"])
            if message.get("id") != message_id:
                continue  # an event, or a reply to nothing we wait for
            if "error" in message:
                raise CdpError(method, message["error"])
            result: dict[str, Any] = message["result"]
            return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if it is a promise), as JSON would carry it."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError("Runtime.evaluate", result["exceptionDetails"])
        return result["result"].get("value")

    def navigate(self, url: str, *, timeout: float = 30.0) -> None:
        """Open ``url`` and wait until its document has loaded (scripts may still be rendering)."""
        # Page.navigate may answer before the new document replaces the old one, whose readyState is "complete"
        # too: the old one is marked, and the wait is for a document without the mark.
        self.evaluate("window.__relayPrevious = true")
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise CdpError("Page.navigate", result["errorText"])
        self.wait_for("!window.__relayPrevious && document.readyState === 'complete'", timeout=timeout,
                      what=f"{url} loaded")

    def wait_for(self, expression: str, *, timeout: float = 15.0, interval: float = 0.1,
                 what: str | None = None) -> None:
        """Until a JavaScript expression is truthy; on timeout, an AssertionError with the start of the page."""
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or expression}; "
                                     f"page text: {self.text()[:2000]!r}")
            time.sleep(interval)

    def text(self) -> str:
        """What the page shows, as text (``innerText``: hidden elements left out)."""
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def requests(self) -> list[str]:
        """Every URL the tab has asked for (``Network.enable``: since it opened), failed ones included, which
        ``resources`` may leave out: a request to a host that does not resolve here never completes."""
        self.evaluate("0")  # the browser sends the events before this reply: every one so far is taken in
        return list(self._requested)

    def resources(self) -> list[str]:
        """Every URL the page has loaded so far (scripts, stylesheets, fetches), from the Resource Timing API."""
        return list(self.evaluate("performance.getEntriesByType('resource').map(e => e.name)"))

    def scroll_to(self, text: str) -> None:
        """Scroll the first element whose own text contains ``text`` (no double quote in it) to mid-viewport."""
        xpath = f'//*[text()[contains(., "{text}")]]'
        found = self.evaluate(f"""(() => {{
            const hit = document.evaluate({json.dumps(xpath)}, document, null,
                                          XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue;
            if (hit) hit.scrollIntoView({{block: "center"}});
            return !!hit;
        }})()""")
        if not found:
            raise AssertionError(f"no element shows {text!r}")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the viewport, written to ``path``."""
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


class Chromium:
    """A headless Chromium for one test module: ``with Chromium() as browser: page = browser.page()``."""

    def __init__(self, *, width: int = 1600, height: int = 1400, log_dir: Path | None = None,
                 start_timeout: float = 20.0) -> None:
        self._size = f"--window-size={width},{height}"
        self._log_dir = log_dir
        self._start_timeout = start_timeout
        self._profile: Path | None = None
        self._process: Process | None = None
        self._sockets = contextlib.ExitStack()  # one CDP socket per tab, closed on exit
        self.port = 0

    def __enter__(self) -> Chromium:
        if not CHROMIUM.exists():
            raise AssertionError(f"no {CHROMIUM}: Debian's chromium package (`make system-deps` installs it)")
        self._profile = Path(tempfile.mkdtemp(prefix="relay-chromium-"))
        self.port = free_port()
        log = (self._log_dir or self._profile) / "chromium.log"
        log.unlink(missing_ok=True)  # this browser's output only
        self._process = Process([str(CHROMIUM), *FLAGS, self._size, f"--remote-debugging-port={self.port}",
                                 f"--user-data-dir={self._profile}", "about:blank"],
                                env={"HOME": str(self._profile), "PATH": "/usr/bin:/bin"}, log=log)
        try:
            wait_until(self._listening, timeout=self._start_timeout, interval=0.1, what="chromium's DevTools port")
        except AssertionError as err:
            output = self._process.output()[-2000:]
            self.__exit__(None, None, None)
            raise AssertionError(f"chromium did not start ({err}): {output}") from None
        return self

    def _listening(self) -> bool:
        assert self._process is not None
        if self._process.popen.poll() is not None:
            raise AssertionError(f"chromium exited with {self._process.popen.returncode}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/json/version", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def page(self) -> Page:
        """A new tab."""
        # /json/new takes PUT since Chromium 111 (a GET from a web page could otherwise open tabs).
        target = httpx.put(f"http://127.0.0.1:{self.port}/json/new?about:blank", timeout=10).json()
        page = Page(self._sockets.enter_context(connect(target["webSocketDebuggerUrl"], max_size=MAX_MESSAGE_BYTES,
                                                       open_timeout=10)))
        page.call("Page.enable")
        page.call("Network.enable")
        return page

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._sockets.close()
        if self._process is not None:
            self._process.stop(timeout=10)
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
