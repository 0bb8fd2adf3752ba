"""An error every rank reaches is said once: who prints, and what the launcher prints."""

import pytest

from hpcddp.launch import error_reports
from hpcddp.launch.error_reports import Report


@pytest.mark.parametrize(
    "environ, own_place, prints",
    [
        ({}, False, True),  # a plain process
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}, False, True),  # rank 0 of a step
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}, False, False),  # rank 3: its log only
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}, True, True),  # its own place: only it knows
        ({"SLURM_PROCID": "3"}, False, True),  # the batch shell is no rank
        ({"RANK": "1", "WORLD_SIZE": "2"}, False, False),  # torchrun's rank 1
        ({"HPCDDP_LOCAL_RANK": "0", "HPCDDP_REPORT_FILE": "/x"}, False, False),  # the launcher
    ],
)
def test_who_prints(environ, own_place, prints):
    assert error_reports.should_print(environ, own_place) is prints


def test_one_cause_every_rank_reached_is_one_plain_line():
    found = [Report(r, "n1", 2, "data.batch_size must be > 0") for r in range(4)]
    assert error_reports.summarize(found) == (["hpcddp: error: data.batch_size must be > 0"], 2)


def test_causes_come_before_ranks_that_only_lost_a_peer():
    found = [
        Report(0, "n1", 1, "rank 0 lost contact with another rank", secondary=True),
        Report(1, "n2", 2, "cannot import 'mymodel'"),
    ]
    lines, code = error_reports.summarize(found)
    assert lines == ["hpcddp: error: (rank 1) cannot import 'mymodel'"] and code == 2


def test_different_causes_are_each_said_once_with_their_ranks():
    found = [
        Report(0, "n1", 2, "A"),
        Report(1, "n1", 2, "A"),
        Report(2, "n2", 2, "B"),
        Report(3, "n2", 2, "B"),
    ]
    lines, code = error_reports.summarize(found)
    assert lines == ["hpcddp: error: (ranks 0, 1) A", "hpcddp: error: (ranks 2, 3) B"]
    assert code == 2


def test_nothing_reported_is_nothing_to_say():
    assert error_reports.summarize([]) == ([], None)


def test_reports_round_trip_and_damaged_ones_are_skipped(tmp_path):
    error_reports.write(tmp_path / "rank-1.json", Report(1, "n1", 2, "x"))
    (tmp_path / "rank-0.json").write_text("{not json")
    assert error_reports.read_all(sorted(tmp_path.glob("rank-*.json"))) == [Report(1, "n1", 2, "x")]
