"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): no extra package.

A page is opened at a fixed viewport; `evaluate` runs JavaScript in it and returns the JSON value, `wait` polls an
expression until it is truthy, `screenshot` writes what the viewport shows (nothing below or right of it).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """The browser died, did not answer in time, or a script on the page threw."""


class Browser:
    """One Chromium process with one page of `width`×`height` CSS pixels (`contextlib.closing` closes it)."""

    def __init__(self, chrome: str, profile: Path, width: int = 1600, height: int = 1000, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4: park both ends above 9, then map them there
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
        for fd in (to_chrome_r, from_chrome_w):
            os.close(fd)

        def remap() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        args = [chrome, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--disable-background-networking", "--disable-dev-shm-usage", "--allow-file-access-from-files",
                "--disable-site-isolation-trials", "--disable-features=IsolateOrigins,site-per-process",  # frames in one tree
                f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=remap, close_fds=False, start_new_session=True)
        for fd in high:
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.session = None
        try:
            target = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
            self.session = self.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)["sessionId"]
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- the protocol: JSON messages separated by NUL bytes

    def call(self, method: str, **params):
        """Send one command (to the page's session once attached) and return its result."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + self.timeout_s
        while (reply := self._read(deadline)).get("id") != self._next_id:  # events (and stale replies) pass by
            pass
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.time()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout_s:g} s")
            ready, _, _ = select.select([self._from_chrome], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (code {self.proc.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    # --- what a test needs

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"script failed: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout_s: float = 60.0, settle_s: float = 0.0):
        """Poll `expression` until it is truthy (then wait `settle_s` more for late layout); returns its last value
        (falsy after `timeout_s`). A script error while the page loads counts as not yet."""
        deadline = time.time() + timeout_s
        while True:
            try:
                value = self.evaluate(expression)
            except BrowserError:  # the page is still loading (no body yet, a navigation in flight)
                value = None
            if value:
                time.sleep(settle_s)
                return value
            if time.time() > deadline:
                return value
            time.sleep(0.5)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the viewport exactly as a user at this window size sees it."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
