"""fp16 that survives overflow, on CPU with 2 ranks: GradScaler on the rank's own device type.

The stand-in transformer's first scaled backwards overflow to NaN gradients at the initial
scale 2^16: GradScaler skips those steps and lowers the scale, and the run goes on. A genuine
NaN loss still stops every rank with the NaN message.
"""

import json
import math

import torch

from tests.fixtures.helpers import run_cli
from tests.fixtures.overflow_transformer import make_dataset, make_model

CONFIG = "tests/fixtures/fp16_transformer.yaml"


def test_the_stand_in_overflows_to_nan_gradients_at_the_initial_scale():
    """The fixture does what the tests below rely on (else they would prove nothing)."""
    torch.manual_seed(0)
    model, (train, _) = make_model(), make_dataset()
    batch = torch.utils.data.default_collate([train[i] for i in range(16)])
    labels = batch.pop("labels")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(**batch), labels)
    (loss * 2.0**16).backward()
    assert math.isfinite(loss.item())
    assert any(torch.isnan(p.grad).any() for p in model.parameters())


def test_fp16_overflows_are_skipped_and_the_run_finishes(tmp_path):
    result = run_cli("train", CONFIG, f"run.dir={tmp_path}", "--nproc", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 12
    assert math.isfinite(summary["final_loss"])
    assert summary["overflow_steps"] >= 1 and summary["skipped_steps"] == 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scales = [line["loss_scale"] for line in lines if "loss" in line]
    assert len(scales) == 12 and scales[0] < 2.0**16  # the first step overflowed: halved


def test_a_genuine_nan_loss_under_fp16_still_stops_every_rank(tmp_path):
    result = run_cli(
        "train", CONFIG, f"run.dir={tmp_path}", "model.kwargs={nan_on_rank: 1, nan_at_call: 9}",
        "--nproc", "2",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "non-finite" in line]
    assert len(lines) == 1 and "at step 9 in the loss first on rank 1;" in lines[0], lines
    record = json.loads((tmp_path / "summary.json").read_text())
    assert (record["status"], record["reason"], record["steps"]) == ("failed", "nonfinite", 9)
    assert record["overflow_steps"] >= 1  # the overflows before it were not counted as NaN
