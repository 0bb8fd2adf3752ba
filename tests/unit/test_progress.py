"""Rank 0's progress bar: redrawn in place on a terminal, absent from batch logs."""

import io

from hpcddp.progress import ProgressBar, bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
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
