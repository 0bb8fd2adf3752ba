"""The exit statuses docs/resilience.md promises ("Errors and exit codes"): how each ending of a
run and each kind of error becomes the status of `hpcddp train`, and that the page names the
statuses `hpcddp.exit_codes` defines, no more and no fewer."""

import pathlib
import re

import pytest

from hpcddp import exit_codes
from hpcddp.cli.main import exit_status
from hpcddp.cli.train import exit_code
from hpcddp.errors import (
    CheckpointError,
    ConfigError,
    DistributedError,
    HostlistError,
    LaunchError,
    NonFiniteError,
    PeerLostError,
)
from hpcddp.outcome import RunOutcome, StopReason

PREEMPTED = StopReason.PREEMPTED

# (id, the run's outcome, its status)
ENDINGS = [
    ("finished", RunOutcome(step=8), 0),
    ("stopped-on-request", RunOutcome(step=8, stop=StopReason.REQUESTED), 0),
    ("preempted-and-requeued", RunOutcome(step=8, stop=PREEMPTED, requeued=True), 0),
    ("handed-on-to-the-next-link", RunOutcome(step=8, stop=PREEMPTED, handed_on=True), 0),
    ("preempted-not-requeued", RunOutcome(step=8, stop=PREEMPTED), 75),
    ("ctrl-c", RunOutcome(step=8, stop=StopReason.INTERRUPTED), 130),
    ("sigterm", RunOutcome(step=8, stop=StopReason.TERMINATED), 143),
]


@pytest.mark.parametrize("outcome, status", [r[1:] for r in ENDINGS], ids=[r[0] for r in ENDINGS])
def test_each_ending_has_its_documented_status(outcome, status, capsys):
    assert exit_code(outcome) == status
    said = capsys.readouterr().err
    if status == 75:  # the one stop a user must act on says how
        assert "not requeued" in said and "HINT: re-run the same command" in said
    else:
        assert said == ""


@pytest.mark.parametrize(
    "error, status",
    [
        (ConfigError("x"), 2),
        (LaunchError("x"), 2),
        (HostlistError("x"), 2),
        (CheckpointError("x"), 1),
        (NonFiniteError("x"), 1),
        (DistributedError("x"), 1),
        (PeerLostError("x"), 76),  # never the cause: the rank that died is
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, Exception) else str(x),
)
def test_bad_input_is_2_a_lost_peer_76_and_other_explained_errors_1(error, status):
    assert exit_status(error) == status


def test_the_page_names_exactly_the_statuses_the_code_defines():
    page = pathlib.Path(__file__).parents[2] / "docs" / "resilience.md"
    line = re.search(r"- Exit codes: (.+?)\n\n", page.read_text(), re.S)
    assert line is not None
    documented = {int(n) for n in re.findall(r"(?<![\w.])(\d+)\s+[a-z(]", line[1])}
    defined = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert documented == defined
