"""Telemetry in a real two-rank run: throughput from the samples really drawn, and the figures
every metrics line carries."""

import json

import pytest

from tests.fixtures.helpers import summary, train_local

pytestmark = pytest.mark.slow


def test_samples_per_s_is_right_when_accumulation_spans_more_than_an_epoch(tmp_path):
    """64 samples, 2 ranks x 2 batches of 16 per epoch, grad_accum_steps=8: every step is cut
    to the epoch's 64 samples (not 2 x 16 x 8 = 256, which inflated the rate)."""
    train_local(
        tmp_path,
        "data.kwargs={train_size: 64, eval_size: 32}",
        "data.batch_size=16",
        "train.grad_accum_steps=8",
        "train.epochs=12",
        "train.log_every_steps=3",
    )
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert len(steps) >= 4
    for line in steps:
        per_step = line["samples_per_s"] * line["step_time_s"]
        assert per_step == pytest.approx(64, rel=0.15), line
        assert line["slowest_host"] and 0 <= line["slowest_rank"] < 2
        assert line["forward_s"] > 0 and line["backward_s"] > 0 and line["rss_gb_max"] > 0
        assert line["tflops_per_device"] > 0  # the MLP's FLOPs were counted; no MFU on a CPU
        assert "mfu" not in line
    assert set(summary(tmp_path)["timeline"]["first_step"]) == {
        "median_s", "max_s", "slowest_rank", "slowest_host"
    }  # fmt: skip
