"""Posting JSON to a webhook in the background: the caller never waits for an answer.

Each post goes out on a daemon thread of its own, after the one before it has been sent (so a
receiver gets them in order) but without waiting for any answer: a receiver that never answers
holds a thread, not the run. When the process leaves, `Poster.close` waits a short grace for
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


class Poster:
    """Posts bodies to one URL, in order, each on its own daemon thread."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._last_sent: threading.Event | None = None
        self._lock = threading.Lock()

    def post(self, body: dict[str, Any]) -> None:
        """Send ``body`` as JSON soon; returns at once."""
        sent = threading.Event()
        with self._lock:
            before, self._last_sent = self._last_sent, sent
        thread = threading.Thread(
            target=self._send, args=(body, before, sent), name="hpcddp-notify", daemon=True
        )
        thread.start()

    def close(self, grace_s: float = LEAVE_GRACE_S) -> bool:
        """Wait at most ``grace_s`` for every post to be sent (not answered); False if some
        were given up (said in one line)."""
        with self._lock:
            last = self._last_sent
        if last is None or last.wait(grace_s):
            return True
        log.warning(
            "notify: a post to %s was not sent within %.1f s of leaving; given up", self.url, grace_s
        )
        return False

    def _send(
        self, body: dict[str, Any], before: threading.Event | None, sent: threading.Event
    ) -> None:
        """Send once the previous post has left, then wait for the answer (only this thread)."""
        if before is not None:
            before.wait(self.timeout_s)
        event = body.get("event", "?")
        try:
            connection = self._connect()
            connection.request("POST", _target(self.url), json.dumps(body).encode(), _HEADERS)
        except (OSError, http.client.HTTPException) as err:
            log.warning("notify: could not post %r to %s: %s", event, self.url, err)
            return
        finally:
            sent.set()
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
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return kind(parts.hostname or "", parts.port, timeout=self.timeout_s)


_HEADERS = {"Content-Type": "application/json", "User-Agent": "hpcddp-notify"}


def _target(url: str) -> str:
    """The request target: path and query (``/`` when the URL has no path)."""
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
