"""Per-rank telemetry: one interval's figures, the slowest rank named, nothing waited for."""

import time

import pytest
import torch

from hpcddp.train.telemetry import FIELDS, IntervalClock, RankFigures, peak_rss_bytes, summarise

HOSTS = ["n1", "n1", "n2", "n2"]


def row(step_time_s: float, steps: int = 10, **extra: float) -> dict[str, float]:
    base = dict.fromkeys(FIELDS, 0.0)
    base.update(wall_s=step_time_s * steps, steps=steps, split_steps=steps, samples=32.0 * steps)
    base.update(rss_peak_bytes=2e9)
    base.update(extra)
    return base


def test_the_slowest_rank_is_the_one_with_the_most_work_not_the_longest_wall_time():
    """DDP evens wall times out (fast ranks wait in backward); own work tells them apart."""
    rows = [
        row(0.25, forward_s=0.5, backward_s=1.9),  # per step: 0.05 own work, waits in backward
        row(0.25, forward_s=0.6, backward_s=1.8),
        row(0.26, forward_s=0.5, backward_s=2.0),
        row(0.25, forward_s=1.8, backward_s=0.5, data_wait_s=0.2),  # 0.2 own work: the slow one
    ]
    figures = summarise(rows, HOSTS)
    assert (figures["slowest_rank"], figures["slowest_host"]) == (3, "n2")
    assert figures["slowest_vs_median"] == pytest.approx(0.2 / 0.055, rel=1e-3)
    assert figures["step_time_s"] == pytest.approx(0.25)
    assert (figures["work_s_min"], figures["work_s_max"]) == (0.05, 0.2)
    assert figures["data_wait_s"] == pytest.approx(0.02)  # the worst rank's, per step


def test_throughput_counts_the_samples_each_rank_really_drew():
    """Not steps x batch x accumulation: an accumulation window may be cut short."""
    rows = [row(0.1, samples=50.0), row(0.1, samples=50.0)]
    assert summarise(rows, HOSTS[:2])["samples_per_s"] == pytest.approx(100 / 1.0)


def test_tokens_and_cuda_memory_appear_only_when_there_are_some():
    plain = summarise([row(0.1)], ["n1"])
    assert "tokens_per_s" not in plain and "cuda_gb_max" not in plain
    lm = summarise([row(0.1, tokens=4096.0, cuda_peak_bytes=3e9)], ["n1"])
    assert lm["tokens_per_s"] == pytest.approx(4096.0) and lm["cuda_gb_max"] == 3.0


def test_the_clock_adds_up_one_interval_and_starts_the_next():
    clock = IntervalClock(torch.device("cpu"))
    for _ in range(3):
        with clock.phase("forward_s", measured=clock.measures_split(logging_next=False)):
            time.sleep(0.01)
        clock.add("data_wait_s", 0.5)
        clock.step(samples=32, tokens=0, measured=True)
    figures = dict(zip(FIELDS, clock.close_interval().tolist(), strict=True))
    assert (figures["steps"], figures["split_steps"], figures["samples"]) == (3, 3, 96)
    assert figures["forward_s"] >= 0.03 and figures["data_wait_s"] == 1.5
    assert figures["wall_s"] >= 0.03 and 0 < figures["rss_peak_bytes"] <= peak_rss_bytes()
    assert clock.close_interval()[FIELDS.index("steps")] == 0


def test_on_cuda_the_split_is_measured_once_per_interval_only():
    clock = IntervalClock(torch.device("cuda", 0))
    assert not clock.measures_split(logging_next=False)
    assert clock.measures_split(logging_next=True)
    assert IntervalClock(torch.device("cpu")).measures_split(logging_next=False)


def test_a_world_of_one_needs_no_group():
    figures = RankFigures(rank=0, world_size=1, hosts=["n1"])
    assert figures.finish() is None  # nothing pending
    clock = IntervalClock(torch.device("cpu"))
    clock.step(samples=8, tokens=0, measured=True)
    figures.start(step=5, vector=clock.close_interval())
    result = figures.finish()
    assert result["step"] == 5 and result["slowest_rank"] == 0 and result["slowest_vs_median"] == 1
