"""Rank 0's progress bar: redrawn in place on a terminal, absent from batch logs."""

import io
import subprocess
import sys

from hpcddp.progress import ProgressBar, bar
from tests.fixtures.helpers import QUICKSTART, REPO


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        if self.closed:  # as a real file does
            raise ValueError("I/O operation on closed file")
        return True


def test_bar_fills_in_proportion():
    assert bar(0, 10, width=10) == "[----------]"
    assert bar(5, 10, width=10) == "[#####-----]"
    assert bar(12, 10, width=10) == "[##########]"


def test_draws_in_place_on_a_terminal_at_most_ten_times_a_second():
    out = Terminal()
    progress = ProgressBar(stream=out)
    for step in range(1000):
        progress.update(f"step {step}")
    assert out.getvalue().startswith("\r\033[Kstep 0")
    assert out.getvalue().count("\r") < 5  # a tight loop is not redrawn every step
    progress.clear()
    assert out.getvalue().endswith("\r\033[K")  # room for a log line
    progress.update("step 1000", force=True)
    progress.close()
    assert out.getvalue().endswith("step 1000\n")


def test_silent_when_not_a_terminal():
    out = io.StringIO()
    progress = ProgressBar(stream=out)
    progress.update("step 1", force=True)
    progress.clear()
    progress.close()
    assert out.getvalue() == ""
    quiet = Terminal()
    ProgressBar(enabled=False, stream=quiet).update("x", force=True)  # ranks other than 0
    assert quiet.getvalue() == ""


class HungUpTerminal(Terminal):
    """A terminal that went away mid-run: every write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_or_vanished_stderr_stops_the_bar_instead_of_the_run(monkeypatch):
    monkeypatch.setattr("sys.stderr", None)  # what Python sets when fd 2 is closed (2>&-)
    closed = ProgressBar()
    closed.update("step 1", force=True)
    closed.close()
    assert not closed.drawing
    gone = ProgressBar(stream=HungUpTerminal())
    assert gone.drawing
    gone.update("step 1", force=True)
    gone.clear()
    gone.close()
    assert not gone.drawing
    shut = Terminal()
    shut.close()
    assert not ProgressBar(stream=shut).drawing


def test_training_with_stderr_closed_finishes(tmp_path):
    done = subprocess.run(
        f"{sys.executable} -m hpcddp train {QUICKSTART} run.dir={tmp_path} "
        f"'data.kwargs={{train_size: 256, eval_size: 64}}' train.max_steps=2 2>&-",
        shell=True, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "summary.json").exists()
