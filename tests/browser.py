"""A real headless Chromium, driven over the Chrome DevTools protocol, for checking HTML pages.

Debian's `chromium-headless-shell` (or `chromium`) package provides the browser; `./run_tests.sh`
installs it when it is missing. websocket-client speaks the protocol: no browser is downloaded.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import websocket

__all__ = ["BROWSER_NAMES", "Chromium", "find_browser"]

BROWSER_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "chrome-headless-shell")


def find_browser() -> str | None:
    """$CHROME_BIN, else the first Chromium on PATH (or in Debian's /usr/lib/chromium)."""
    if os.environ.get("CHROME_BIN"):
        return os.environ["CHROME_BIN"]
    for name in BROWSER_NAMES:
        found = shutil.which(name) or (
            f"/usr/lib/chromium/{name}" if os.path.exists(f"/usr/lib/chromium/{name}") else None
        )
        if found:
            return found
    return None


class Chromium:
    """One headless browser with one page. Use as a context manager."""

    def __init__(self, binary: str, *, timeout_s: float = 180) -> None:
        self._timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self._process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                f"--user-data-dir={self._profile}",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        port_file = pathlib.Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"{binary} exited {self._process.returncode}: {self._process.stderr.read().decode()[-2000:]}"
                )
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{binary} did not open its DevTools port within {timeout_s} s")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout_s) as response:
            pages = [t for t in json.load(response) if t["type"] == "page"]
        self._socket = websocket.create_connection(
            pages[0]["webSocketDebuggerUrl"], timeout=timeout_s, suppress_origin=True
        )
        self._next_id = 0
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._socket.close()
        except Exception:
            pass
        # The whole process group: Debian's chromium-headless-shell is a wrapper script, and the
        # browser it starts (with its renderers) outlived a plain terminate() of the wrapper.
        self._signal_group(signal.SIGTERM)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)
        self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:  # every process of the group has exited
            pass

    def send(self, method: str, **params) -> dict:
        """Sends one command and returns its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        self._socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def open(self, path: pathlib.Path) -> None:
        """Loads a file and waits for its load event."""
        self.events.clear()
        self.send("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + self._timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not finish loading within {self._timeout_s} s")
            self.events.append(json.loads(self._socket.recv()))

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression (awaited if it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads the page produced so far."""
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(params["entry"].get("text", "")[:500])
        return errors

    def screenshot(self, path: pathlib.Path) -> pathlib.Path:
        """A PNG of the whole page, not just the window."""
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
