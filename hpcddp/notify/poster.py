"""Posting JSON to a webhook in the background: the caller never waits for an answer.

Each post goes out on a daemon thread of its own, once the one before it has been sent and
answered (so a receiver gets them in order; a receiver that does not answer within
`ORDER_WAIT_S` only loses that promise): the caller never waits, and a receiver that never
answers holds threads, not the run. When the process leaves, `Poster.close` waits a short grace for
posts not yet sent (a connection still being made); what is left is given up, with one line
in the log. A post that fails says so in one line and nothing else happens.
"""

import http.client
import json
import logging
import threading
import urllib.parse
from typing import Any

log = logging.getLogger(__name__)

LEAVE_GRACE_S = 1.0  # how long leaving waits for posts not yet sent (never for answers)
ORDER_WAIT_S = 0.5  # how long a post waits for the answer to the one before it


class Poster:
    """Posts bodies to one URL, in order, each on its own daemon thread."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._last: _Progress | None = None
        self._lock = threading.Lock()

    def post(self, body: dict[str, Any], what: str) -> None:
        """Send ``body`` as JSON soon; returns at once. ``what`` names it in the log."""
        now = _Progress()
        with self._lock:
            before, self._last = self._last, now
        thread = threading.Thread(
            target=self._send, args=(body, what, before, now), name="hpcddp-notify", daemon=True
        )
        thread.start()

    def close(self, grace_s: float = LEAVE_GRACE_S) -> bool:
        """Wait at most ``grace_s`` for every post to be sent (not answered); False if some
        were given up (said in one line)."""
        with self._lock:
            last = self._last
        if last is None or last.sent.wait(grace_s):
            return True
        log.warning(
            "notify: a post to %s not sent %.1f s after leaving; given up", self.url, grace_s
        )
        return False

    def _send(
        self, body: dict[str, Any], what: str, before: "_Progress | None", now: "_Progress"
    ) -> None:
        """Send after the previous post (see the module docstring), then wait for the answer:
        only this thread waits."""
        if before is not None:
            before.sent.wait(self.timeout_s)
            before.answered.wait(ORDER_WAIT_S)
        try:
            self._post(body, what, now)
        finally:
            now.sent.set()
            now.answered.set()

    def _post(self, body: dict[str, Any], event: str, now: "_Progress") -> None:
        try:
            connection = self._connect()
            connection.request("POST", _target(self.url), json.dumps(body).encode(), _HEADERS)
        except (OSError, http.client.HTTPException) as err:
            log.warning("notify: could not post %r to %s: %s", event, self.url, err)
            return
        now.sent.set()
        try:
            status = connection.getresponse().status
        except (OSError, http.client.HTTPException) as err:
            log.warning("notify: no answer from %s to %r: %s", self.url, event, err)
            return
        finally:
            connection.close()
        if status >= 300:
            log.warning("notify: %s answered %d to %r", self.url, status, event)

    def _connect(self) -> http.client.HTTPConnection:
        parts = urllib.parse.urlsplit(self.url)
        secure = parts.scheme == "https"
        kind = http.client.HTTPSConnection if secure else http.client.HTTPConnection
        return kind(parts.hostname or "", parts.port, timeout=self.timeout_s)


class _Progress:
    """How far one post has got: its request sent, its answer in (or given up)."""

    def __init__(self) -> None:
        self.sent, self.answered = threading.Event(), threading.Event()


_HEADERS = {"Content-Type": "application/json", "User-Agent": "hpcddp-notify"}


def _target(url: str) -> str:
    """The request target: path and query (``/`` when the URL has no path)."""
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
