"""A refusal every rank reaches is printed once, on its own line, always with the same status.

Under ``hpcddp train --nproc N`` the ranks report what ended them to the launcher, which says
each distinct cause once; a rank that only lost its peer is a consequence, not a cause.
"""

import re

import pytest

from hpcddp import exit_codes
from tests.fixtures.helpers import QUICKSTART, TINY, repeats, run_cli

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d \[rank \d+/\d+ ")  # rank 0's progress log, not an error


def refusal_lines(stderr: str) -> list[str]:
    """stderr without rank 0's log lines: what the user is told went wrong."""
    return [line for line in stderr.strip().splitlines() if not LOG_LINE.match(line)]


def a_file(tmp_path):
    path = tmp_path / "plain-file"
    path.write_text("not a directory")
    return path


# (id, overrides, where it is found, words of the one line)
CASES = [
    # in every rank, before the process group exists
    ("factory-does-not-import", ["model.factory=no_such_pkg.models:make"], "cannot import"),
    # in every rank, once the group exists
    (
        "batch-too-big-for-data",
        ["data.drop_last=true", "data.kwargs={train_size: 16, eval_size: 16}"],
        "not one batch",
    ),
    # on rank 0 only, then told to every rank: test_runs_of_one_refusal_in_a_row_... below
]


@pytest.mark.parametrize("overrides, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_refusal_every_rank_reaches_is_printed_once(tmp_path, overrides, words):
    file = a_file(tmp_path)
    args = [f"run.dir={tmp_path}/run", *TINY, *(o.replace("{file}", str(file)) for o in overrides)]
    done = run_cli("train", QUICKSTART, *args, "--nproc", "2")
    lines = refusal_lines(done.stderr)
    assert done.returncode == exit_codes.USAGE, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("hpcddp: error: ") and words in lines[0], done.stderr
    assert "HINT: " in lines[0] and "Traceback" not in done.stderr


@pytest.mark.slow
def test_runs_of_one_refusal_in_a_row_end_with_the_same_status(tmp_path):
    """Rank 0 refuses the run directory; rank 1 learns it from rank 0: always 2, never 1, and
    the one line every time (a refusal found on rank 0 only, then told to every rank)."""
    file = a_file(tmp_path)
    seen = []
    for _ in range(repeats(3)):  # HPCDDP_TEST_REPEATS=20 for a thorough hunt
        done = run_cli("train", QUICKSTART, f"run.dir={file}/run", *TINY, "--nproc", "2")
        seen.append((done.returncode, tuple(refusal_lines(done.stderr))))
        assert "Traceback" not in done.stderr, done.stderr
    assert {code for code, _ in seen} == {exit_codes.USAGE}, seen
    assert len({lines for _, lines in seen}) == 1 and len(seen[0][1]) == 1, seen
    (line,) = seen[0][1]
    assert line.startswith("hpcddp: error: ") and "cannot create run directory" in line, line
    assert "HINT: " in line, line
