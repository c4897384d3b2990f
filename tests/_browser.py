"""One headless Chromium for many pages, driven over the DevTools protocol on a pipe.

``Browser(chromium)`` starts ``chromium --headless --remote-debugging-pipe`` with the network cut
off (a proxy at a closed port; file:// pages and loopback only) and one tab of a fixed size.
:meth:`Browser.open` loads a page and waits for its load event and for MathJax's first typeset
(``MathJax.startup.promise``), where the page has MathJax; :meth:`Browser.evaluate` runs a
script there and returns its value; :meth:`Browser.screenshot` gives the tab as PNG bytes.
A page costs a load, not a browser's start (about 0.5 s against 3 s a page on a 2-core VM).

The protocol's messages are JSON, each ended by a NUL byte: the browser reads them on its fd 3
and writes on its fd 4. A browser that sends nothing for ``timeout`` seconds while a reply is
awaited fails the test that waits on it instead of stalling the suite.
"""

import base64
import fcntl
import json
import os
import select
import signal

#: the flags of every launch: headless, no GPU, and no network but file:// and loopback
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--remote-debugging-pipe",
    "--allow-file-access-from-files",
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
)
#: the script that waits for MathJax's first typeset, where the page has MathJax
TYPESET = """(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await new Promise(r => requestAnimationFrame(() => r()));
  return location.href; })()"""


class Browser:
    """A headless Chromium with one tab of ``width x height`` pixels (a context manager)."""

    def __init__(self, chromium, width=1000, height=1400, timeout=120.0):
        self.timeout, self._buffer, self._events, self._id = timeout, b"", [], 0
        self._out, reads = os.pipe()[::-1]  # this process writes, the browser reads
        self._in, writes = os.pipe()
        # the browser's ends moved above 4 first, so that neither move to 3 or 4 overwrites
        # the other (the originals close at exec: Python makes its descriptors so)
        reads, writes = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (reads, writes))
        null = os.O_WRONLY, 0
        self.pid = os.posix_spawn(
            chromium,
            [chromium, *FLAGS, "about:blank"],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, reads, 3),
                (os.POSIX_SPAWN_DUP2, writes, 4),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, *null),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, *null),
            ],
        )
        for fd in (reads, writes):
            os.close(fd)
        self._status = None
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
            self._tab = attached["sessionId"]  # the tab's channel on the pipe
            self.call("Page.enable", to_tab=True)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                to_tab=True,
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def open(self, uri):
        """Load ``uri`` in the tab; return once its load event has fired and MathJax (where
        the page has it) has typeset it."""
        self._events.clear()
        self.call("Page.navigate", to_tab=True, url=uri)
        self._wait_event("Page.loadEventFired")
        href = self.evaluate(TYPESET)
        if href != uri:
            raise RuntimeError(f"the tab shows {href}, not {uri}")

    def evaluate(self, expression):
        """The value of the script ``expression`` in the tab (a promise awaited)."""
        result = self.call(
            "Runtime.evaluate",
            to_tab=True,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"the script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def dom(self):
        """The tab's document as HTML, as the browser holds it now."""
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self):
        """The tab as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot", to_tab=True)["data"])

    def call(self, method, to_tab=False, **params):
        """Send one command (to the tab where ``to_tab``, else to the browser) and return its
        result."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if to_tab:
            message["sessionId"] = self._tab
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while (reply := self._receive()).get("id") != self._id:
            pass
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def close(self):
        """End the browser's process (its children end with it) and close the pipe; once."""
        if self._status is not None:
            return
        os.kill(self.pid, signal.SIGKILL)
        self._status = os.waitpid(self.pid, 0)[1]
        for fd in (self._out, self._in):
            os.close(fd)

    def _wait_event(self, method):
        while method not in self._events:
            self._receive()

    def _receive(self):
        """The browser's next message; an event's name is kept in ``_events``."""
        message = self._read()
        if "method" in message:
            self._events.append(message["method"])
        return message

    def _read(self):
        while b"\0" not in self._buffer:
            if not select.select([self._in], [], [], self.timeout)[0]:
                raise TimeoutError(f"chromium sent nothing for {self.timeout:.0f} s")
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium ended, or closed its end of the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
