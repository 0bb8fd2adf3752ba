"""The start-up timeline: seconds per phase on each rank, the slowest rank per phase."""

import time

import pytest

from hpcddp.train.timeline import PHASES, Timeline, since_process_start, summarise, table


def test_phases_add_up_and_unknown_ones_are_refused():
    timeline = Timeline()
    with timeline.phase("checkpoint"):
        time.sleep(0.01)
    timeline.add("checkpoint", 1.0)
    assert timeline.seconds["checkpoint"] >= 1.01
    with pytest.raises(ValueError, match="unknown phase 'warmup'"):
        timeline.add("warmup", 1.0)


def test_the_slowest_rank_of_each_phase_is_named():
    ranks = [dict.fromkeys(PHASES, 1.0) for _ in range(4)]
    ranks[2]["rendezvous"] = 30.0  # the rank whose node started late
    ranks[3]["import"] = 9.0  # a cold file system
    timeline = summarise(ranks, ["n1", "n1", "n2", "n2"])
    assert list(timeline) == list(PHASES)
    assert timeline["rendezvous"] == {
        "median_s": 1.0, "max_s": 30.0, "slowest_rank": 2, "slowest_host": "n2"
    }  # fmt: skip
    assert timeline["import"]["slowest_rank"] == 3
    text = table(timeline)
    assert "rendezvous" in text and "30.000  2 (n2)" in text


def test_time_since_process_start_counts_the_imports():
    assert 0 < since_process_start() < 3600
