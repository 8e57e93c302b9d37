"""A real browser reads a self-contained HTML page: what its console said, what it asked for, what it drew.

Headless Chromium is driven over the DevTools Protocol on two pipes (``--remote-debugging-pipe``: Chromium reads
JSON messages from its fd 3 and writes to its fd 4, each message ended by a NUL byte), so no browser-automation
package is needed, only Debian's ``chromium``. Every call starts a fresh Chromium with a new temporary profile and
kills it afterwards. Requests to http(s)/ws(s)/ftp are blocked inside the browser (they are still recorded, in
``requests``, ``failed`` and ``outside``), so a page is read the same way with or without a network.

    page = open_page(Path("report.html"), screenshot=Path("report.png"))
    assert not page.console_errors and not page.outside and page.text_visible

From a shell (to keep a screenshot in docs/figures): ``python -m tests.browser PAGE.html --screenshot OUT.png``.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

CHROMIUM_INSTALL = "apt-get install chromium (Debian's package)"


def chromium_path() -> str | None:
    """The Chromium to run: $QK_CHROMIUM when set, else chromium or chromium-browser on PATH; None without one."""
    override = os.environ.get("QK_CHROMIUM")
    if override:
        return override
    return shutil.which("chromium") or shutil.which("chromium-browser")


needs_chromium = pytest.mark.skipif(chromium_path() is None, reason=f"no Chromium: {CHROMIUM_INSTALL}")

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--remote-debugging-pipe",
    "--hide-scrollbars", "--mute-audio", "--disable-dev-shm-usage", "--disable-extensions",
    "--disable-default-apps", "--no-default-browser-check", "--disable-crash-reporter", "--disable-breakpad",
    "--password-store=basic",
)
# Fetched by no one: the browser fails these at once (Network.loadingFailed, blockedReason "inspector").
BLOCKED = ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]

# Runs in the child between fork and exec: the pipe ends become fds 3 and 4, then Chromium replaces Python.
# (The parent hands ends numbered 5 and up, so neither dup2 overwrites the other end.)
_LAUNCH = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
           "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])")

# Read in the page after its fonts are ready, at scroll 0. `own` is an element's own text (its text-node children,
# whitespace collapsed), so <h2>In short</h2> matches and its <section> parent does not.
_READ = """
document.fonts.ready.then(() => {
  window.scrollTo({top: 0, left: 0, behavior: "instant"});
  const want = %(find)s, W = %(width)d, H = %(height)d;
  const own = el => Array.from(el.childNodes).filter(n => n.nodeType === Node.TEXT_NODE)
    .map(n => n.data).join("").replace(/\\s+/g, " ").trim();
  let top = null, visible = false;
  for (const el of document.querySelectorAll("body *")) {
    if (own(el) !== want) continue;
    const r = el.getBoundingClientRect();
    top = r.top;
    visible = r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= H && r.right <= W;
    break;
  }
  const images = Array.from(document.querySelectorAll("img"),
    i => [(i.getAttribute("src") ?? i.currentSrc ?? "").slice(0, 60), i.complete && i.naturalWidth > 0]);
  return {title: document.title, scripts: document.querySelectorAll("script").length, images, top, visible};
})
"""


@dataclass(frozen=True)
class Page:
    """What Chromium made of a page (open_page)."""
    console_errors: list[str]  # console.error/assert, uncaught exceptions, the browser's own error log entries
    requests: list[str]  # every URL the page asked for, the page itself first
    failed: list[str]  # URLs that failed to load, or answered with status >= 400
    outside: list[str]  # requested URLs that are neither the page's own file:// URL nor data:
    images: list[tuple[str, bool]]  # per <img>: its src attribute's first 60 characters, whether it decoded
    scripts: int  # <script> elements
    text_top: float | None  # top of the first element whose own text is find_text, CSS px at scroll 0
    text_visible: bool  # that element lies wholly inside the width x height viewport
    title: str


class _Failed(Exception):
    """Something went wrong while talking to Chromium; open_page adds Chromium's stderr and raises RuntimeError."""


class _Chromium:
    """One Chromium process, its two pipes and a thread that turns fd 4's bytes into messages on a queue."""

    def __init__(self, exe: str, home: Path):
        to_child, self._to = os.pipe()  # we write, Chromium reads (its fd 3)
        self._from, from_child = os.pipe()  # Chromium writes (its fd 4), we read
        to_child, from_child = (self._high(fd) for fd in (to_child, from_child))
        self.stderr_file = home / "stderr.txt"
        env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
               "XDG_CACHE_HOME": str(home / "cache")}
        args = [exe, *FLAGS, f"--user-data-dir={home / 'profile'}", "about:blank"]
        with open(self.stderr_file, "wb") as err:
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-S", "-c", _LAUNCH, str(to_child), str(from_child), *args],
                    pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                    start_new_session=True)  # its own process group: kill() ends Chromium's children too
            finally:
                os.close(to_child)
                os.close(from_child)
        self.messages: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self._next_id = 0
        self._killed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @staticmethod
    def _high(fd: int) -> int:
        """fd moved to a number of 5 or more (close-on-exec; pass_fds reopens it for the child)."""
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
        os.close(fd)
        return moved

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := os.read(self._from, 1 << 20):
                buffer += chunk
                *done, buffer = buffer.split(b"\0")
                for raw in done:
                    self.messages.put(json.loads(raw))
        except (OSError, ValueError):
            pass
        finally:
            os.close(self._from)  # closed here, never under a read of this thread
            self.messages.put(None)  # end of stream: Chromium exited or closed its pipe

    def _next(self, deadline: float, waiting_for: str) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Failed(f"timed out waiting for {waiting_for}")
        try:
            message = self.messages.get(timeout=left)
        except queue.Empty:
            raise _Failed(f"timed out waiting for {waiting_for}") from None
        if message is None:
            self.messages.put(None)  # every later wait sees the end too
            raise _Failed(f"Chromium exited while waiting for {waiting_for}")
        return message

    def call(self, method: str, params: dict | None, deadline: float, session: str | None = None) -> dict:
        """Send one command and wait for its answer; the events that arrive meanwhile are kept in self.events."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._to, json.dumps(message).encode() + b"\0")
        except OSError as e:
            raise _Failed(f"Chromium exited before {method} ({e})") from None
        while True:
            answer = self._next(deadline, method)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise _Failed(f"{method} failed: {answer['error'].get('message')}")
                return answer.get("result", {})
            if "method" in answer:
                self.events.append(answer)

    def wait_for(self, event: str, deadline: float, session: str, since: int = 0) -> None:
        """Return once `event` has arrived on `session` (at index `since` of self.events or later)."""
        if any(e["method"] == event and e.get("sessionId") == session for e in self.events[since:]):
            return
        while True:
            message = self._next(deadline, event)
            if "method" in message:
                self.events.append(message)
                if message["method"] == event and message.get("sessionId") == session:
                    return

    def settle(self, quiet_s: float, deadline: float) -> None:
        """Keep the events that arrive until none has for quiet_s (at most until deadline)."""
        while time.monotonic() < deadline:
            try:
                message = self.messages.get(timeout=quiet_s)
            except queue.Empty:
                return
            if message is None:
                self.messages.put(None)
                return
            if "method" in message:
                self.events.append(message)

    def kill(self) -> None:
        """Chromium and everything in its process group, killed and reaped; the pipes closed. Once only."""
        if self._killed:
            return
        self._killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the unreaped leader keeps the group's id ours
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        os.close(self._to)
        self._reader.join(timeout=5)  # sees the end of the stream once no process holds the pipe's write end

    def stderr_tail(self, lines: int = 15) -> str:
        """The last lines Chromium wrote to stderr, without its D-Bus complaints (there is no bus in a container)."""
        try:
            text = self.stderr_file.read_text(errors="replace")
        except OSError:
            return "(no stderr)"
        kept = [line for line in text.splitlines() if line.strip() and "dbus" not in line.lower()]
        return "\n".join(kept[-lines:]) or "(empty)"


def _console_text(params: dict) -> str:
    parts = [str(a.get("value", a.get("description", a.get("type")))) for a in params.get("args", [])]
    return f"console.{params.get('type')}: {' '.join(parts)}"


def _exception_text(params: dict) -> str:
    details = params.get("exceptionDetails", {})
    exception = details.get("exception", {})
    return f"uncaught: {exception.get('description') or details.get('text', '')}"


def _page_from(events: list[dict], session: str, page_url: str, read: dict) -> Page:
    """The Page fields from the session's DevTools events and the values read in the page."""
    errors, requests, failed, urls = [], [], [], {}
    for event in events:
        if event.get("sessionId") != session:
            continue
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(_console_text(params))
        elif method == "Runtime.exceptionThrown":
            errors.append(_exception_text(params))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            errors.append(f"{entry.get('source')}: {entry.get('text')}" + (f" ({entry['url']})" if entry.get("url")
                                                                            else ""))
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            urls[params["requestId"]] = url
            requests.append(url)
        elif method == "Network.loadingFailed":
            failed.append(urls.get(params["requestId"], f"(request {params['requestId']})"))
        elif method == "Network.responseReceived" and params["response"].get("status", 0) >= 400:
            failed.append(params["response"]["url"])
    outside = [u for u in requests if u.split("#")[0] != page_url and not u.startswith("data:")]
    return Page(console_errors=errors, requests=requests, failed=failed, outside=outside,
                images=[(src, bool(ok)) for src, ok in read["images"]], scripts=int(read["scripts"]),
                text_top=None if read["top"] is None else float(read["top"]), text_visible=bool(read["visible"]),
                title=str(read["title"]))


def open_page(path: Path, width: int = 1280, height: int = 800, screenshot: Path | None = None,
              find_text: str = "In short", timeout_s: float = 60) -> Page:
    """Load the HTML file `path` in headless Chromium at a width x height viewport and return what it read (Page);
    with `screenshot`, also save a PNG of the viewport at scroll 0 there. RuntimeError, with the end of Chromium's
    stderr, when Chromium is missing, exits early, or the page has not loaded within timeout_s."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no page at {path}")
    exe = chromium_path()
    if exe is None:
        raise RuntimeError(f"no Chromium: {CHROMIUM_INSTALL}")
    deadline = time.monotonic() + timeout_s
    home = Path(tempfile.mkdtemp(prefix="qk-chromium-"))
    browser = None
    try:
        browser = _Chromium(exe, home)
        target = browser.call("Target.createTarget", {"url": "about:blank"}, deadline)["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True}, deadline)["sessionId"]
        call = lambda method, params=None: browser.call(method, params, deadline, session)
        call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        for domain in ("Runtime", "Log", "Network", "Page"):
            call(f"{domain}.enable")
        call("Network.setBlockedURLs", {"urls": BLOCKED})
        since = len(browser.events)
        navigated = call("Page.navigate", {"url": path.as_uri()})
        if navigated.get("errorText"):
            raise _Failed(f"navigating to {path.as_uri()} failed: {navigated['errorText']}")
        browser.wait_for("Page.loadEventFired", deadline, session, since)
        expression = _READ % {"find": json.dumps(find_text), "width": width, "height": height}
        result = call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise _Failed(f"reading the page failed: {_exception_text(result)}")
        browser.settle(0.1, min(deadline, time.monotonic() + 1))  # late log entries of the load
        if screenshot is not None:
            shot = call("Page.captureScreenshot", {"format": "png"})
            Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        return _page_from(browser.events, session, path.as_uri(), result["result"]["value"])
    except _Failed as e:
        browser.kill()
        rc = browser.proc.returncode
        ended = "killed here" if rc == -signal.SIGKILL else f"exit status {rc}"
        raise RuntimeError(f"Chromium ({exe}) reading {path}: {e} ({ended}); its stderr ends:\n"
                           f"{browser.stderr_tail()}") from None
    finally:
        if browser is not None:
            browser.kill()
        for _ in range(5):  # a child killed a moment ago may still be closing a file in the profile
            shutil.rmtree(home, ignore_errors=True)
            if not home.exists():
                break
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.browser", description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the HTML file")
    parser.add_argument("--screenshot", type=Path, help="write a PNG of the viewport here")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--find-text", default="In short", help="the element text whose place is reported")
    parser.add_argument("--timeout", type=float, default=60, help="seconds")
    args = parser.parse_args(argv)
    if chromium_path() is None:
        print(f"no Chromium: {CHROMIUM_INSTALL}", file=sys.stderr)
        return 2
    page = open_page(args.page, args.width, args.height, args.screenshot, args.find_text, args.timeout)
    for field in fields(Page):
        print(f"{field.name}: {getattr(page, field.name)}")
    if args.screenshot:
        print(f"screenshot: {args.screenshot} ({args.width}x{args.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
