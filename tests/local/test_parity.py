"""The trainer computes exactly what a hand-written DDP loop computes: bitwise equal weights.

Both run as 2 gloo processes on 127.0.0.1 through `tests.benchmarks.training.run_pair`. The
hand-written loop is `hand_written_ddp` (the PyTorch tutorial loop in the trainer's operation
order), the loop the benchmark times. The trainer uses the fused AdamW kernel by default
(``optim.fused``), whose last bits differ from the tutorial's default AdamW, so the bitwise
comparison is with the "identical" arm: the same hand-written loop given the fused optimizer.
The benchmark times the tutorial's own optimizer, as a user would have written it; with
``optim.fused=false`` the trainer matches that loop bit for bit too.
"""

import re
import subprocess
import sys

import pytest
import torch

from hpcddp.config import (
    Config,
    DataConfig,
    DistConfig,
    FactoryConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
)
from hpcddp.train.state import weights_sha256
from tests.benchmarks import training as benchmark

MODEL = {"in_features": 16, "hidden": 64, "layers": 2, "classes": 4, "dropout": 0.1}


def parity_config(**train) -> Config:
    """Two epochs over an odd-sized set (sampler padding, a short last batch), dropout (so the
    per-rank re-seed matters), weight decay, warmup then cosine decay."""
    return Config(
        run=RunConfig(seed=7, resume=False),
        model=FactoryConfig(factory="tests.benchmarks.training:mlp", kwargs=MODEL),
        data=DataConfig(
            factory="tests.benchmarks.training:synthetic_data",
            batch_size=32,
            num_workers=0,
            kwargs={"size": 2 * 1500 + 1, "in_features": 16, "classes": 4},
        ),
        optim=OptimConfig(lr=3e-3, weight_decay=0.01, warmup_steps=5),
        train=TrainConfig(epochs=2, **train),
        dist=DistConfig(backend="gloo"),
    )


def initial_sha256(config: Config) -> str:
    """Weights before training, to show that training changed them."""
    torch.manual_seed(config.run.seed)
    return weights_sha256(benchmark.mlp(**config.model.kwargs))


# 1501 samples per rank in batches of 32: 47 batches per epoch, the last of 29.
@pytest.mark.parametrize(
    "train, steps",
    [
        ({"max_steps": 80}, 80),  # stops part-way through the second epoch
        ({"grad_accum_steps": 2}, 48),  # 24 windows per epoch, the last one a single batch
    ],
    ids=["max-steps-mid-epoch", "grad-accum-2"],
)
def test_trainer_weights_equal_hand_written_ddp(tmp_path, train, steps):
    config = parity_config(**train)
    hand = benchmark.run_pair("identical", config, tmp_path / "hand")
    trainer = benchmark.run_pair("trainer", config, tmp_path / "trainer")
    assert hand["steps"] == trainer["steps"] == steps
    assert hand["weights_sha256"] != initial_sha256(config)
    assert trainer["weights_sha256"] == hand["weights_sha256"]


def test_unfused_trainer_equals_the_tutorial_loop(tmp_path):
    config = parity_config(max_steps=20)
    config.optim.fused = False
    hand = benchmark.run_pair("hand", config, tmp_path / "hand")
    trainer = benchmark.run_pair("trainer", config, tmp_path / "trainer")
    assert hand["weights_sha256"] == trainer["weights_sha256"] != initial_sha256(config)


@pytest.mark.slow
@pytest.mark.benchmark
def test_benchmark_quick_prints_the_table(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.training", "--quick", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    header = r"^model\s+params\s+hand-written ms/step\s+trainer ms/step\s+difference ms\s+ratio$"
    assert re.search(header, result.stdout, re.M), result.stdout
    for model in benchmark.MODELS:
        assert re.search(rf"^{model}\s+[\d,]+(\s+[-+]?\d+\.\d+){{4}}$", result.stdout, re.M)
    assert re.search(r"cost of the vote: [-+]\d+\.\d+ ms/step", result.stdout)
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
