"""A one-line progress bar for rank 0's terminal, and nothing at all in a batch log.

A bar redrawn with ``\\r`` is useful on a terminal and ruinous in a Slurm output file (one
redraw per line); so it draws only when the stream is a terminal, at most ten times a second,
and otherwise leaves the reporting to the log lines.
"""

import sys
import time
from typing import IO

REDRAW_S = 0.1


def bar(done: int, total: int, width: int = 30) -> str:
    """``[#########---------------------]`` for ``done`` of ``total``."""
    filled = min(width, width * done // max(total, 1))
    return f"[{'#' * filled}{'-' * (width - filled)}]"


class ProgressBar:
    """Redraws ``text`` in place on a terminal; silent elsewhere."""

    def __init__(self, enabled: bool = True, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.drawing = enabled and self.stream.isatty()
        self.drawn = 0.0
        self.shown = False

    def update(self, text: str, force: bool = False) -> None:
        """Show ``text`` if the last redraw is old enough (or ``force``)."""
        now = time.monotonic()
        if self.drawing and (force or now - self.drawn >= REDRAW_S):
            self.drawn, self.shown = now, True
            self.stream.write(f"\r\033[K{text}")
            self.stream.flush()

    def clear(self) -> None:
        """Wipe the bar so a log line can take its place; the next update redraws it."""
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False

    def close(self) -> None:
        """End the bar's line so later output starts on a fresh one."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False
