"""A one-line progress bar for rank 0's terminal, and nothing at all in a batch log.

A bar redrawn with ``\\r`` is useful on a terminal and ruinous in a Slurm output file (one
redraw per line); so it draws only when the stream is a terminal, at most ten times a second,
and otherwise leaves the reporting to the log lines. A closed or vanished stderr (``2>&-``, a
terminal that went away) silently stops the bar: it is never worth a failed run.
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
        self.stream = stream if stream is not None else sys.stderr  # None when fd 2 is closed
        self.drawing = enabled and _is_terminal(self.stream)
        self.drawn = 0.0
        self.shown = False

    def update(self, text: str, force: bool = False) -> None:
        """Show ``text`` if the last redraw is old enough (or ``force``)."""
        now = time.monotonic()
        if self.drawing and (force or now - self.drawn >= REDRAW_S):
            self.drawn, self.shown = now, True
            self._write(f"\r\033[K{text}")

    def clear(self) -> None:
        """Wipe the bar so a log line can take its place; the next update redraws it."""
        if self.shown:
            self._write("\r\033[K")
            self.shown = False

    def close(self) -> None:
        """End the bar's line so later output starts on a fresh one."""
        if self.shown:
            self._write("\n")
            self.shown = False

    def _write(self, text: str) -> None:
        """Write, or stop drawing for good if the terminal is gone."""
        try:
            if self.stream is not None:
                self.stream.write(text)
                self.stream.flush()
        except (OSError, ValueError):  # closed, broken pipe, terminal hung up
            self.drawing = self.shown = False


def _is_terminal(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # a closed file
        return False
