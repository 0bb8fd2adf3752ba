"""Where a notice goes: one `Sink` per kind of receiver, built from the ``notify`` section.

`JsonWebhook` (``notify.url``) posts the whole notice as a JSON object, for scripts and
automation; `ChatWebhook` (``notify.slack_url``) posts ``{"text": "..."}``, the body Slack's
and Mattermost's incoming webhooks show as one line in a channel. Both post in the background
(`hpcddp.notify.poster`). A new receiver is a new sink and a line in `sinks_for`.
"""

import abc
import time

from hpcddp.config import NotifyConfig
from hpcddp.notify.notice import Notice
from hpcddp.notify.poster import Poster


class Sink(abc.ABC):
    """A receiver of notices; sending never waits for it."""

    @abc.abstractmethod
    def send(self, notice: Notice) -> None:
        """Hand ``notice`` on in the background; returns at once."""

    @abc.abstractmethod
    def close(self, grace_s: float) -> bool:
        """Wait at most ``grace_s`` for what was sent to leave; False if some was given up."""


class _Webhook(Sink):
    """A sink that posts to one URL, in order, in the background."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.poster = Poster(url, timeout_s)

    def close(self, grace_s: float) -> bool:
        return self.poster.close(grace_s)


class JsonWebhook(_Webhook):
    """Every field of the notice as JSON (`Notice.body`)."""

    def send(self, notice: Notice) -> None:
        self.poster.post(notice.body(), notice.event.value)


class ChatWebhook(_Webhook):
    """A Slack or Mattermost incoming webhook: ``{"text": Notice.chat_line()}``."""

    def send(self, notice: Notice) -> None:
        self.poster.post({"text": notice.chat_line()}, notice.event.value)


def sinks_for(notify: NotifyConfig) -> list[Sink]:
    """The sinks the ``notify`` section asks for (none when no URL is set)."""
    sinks: list[Sink] = []
    if notify.url:
        sinks.append(JsonWebhook(notify.url, notify.timeout_s))
    if notify.slack_url:
        sinks.append(ChatWebhook(notify.slack_url, notify.timeout_s))
    return sinks


def close_all(sinks: list[Sink], grace_s: float) -> bool:
    """Close every sink within one grace in all (leaving waits ``grace_s``, not one per sink)."""
    deadline = time.monotonic() + grace_s
    closed = [sink.close(max(deadline - time.monotonic(), 0.0)) for sink in sinks]
    return all(closed)
